package egress

import (
	"net/netip"
	"strings"
	"testing"
)

// FuzzNoProxy: parsing never panics, and an accepted name entry without
// a port matches the name it was written with.
func FuzzNoProxy(f *testing.F) {
	for _, s := range []string{"a.example", ".corp.example", "*.x", "10.0.0.0/8", "[fd00::1]:443", "*", "a:1", "[::ffff:10.0.0.0/104]"} {
		f.Add(s, "a.example", 443)
	}
	f.Fuzz(func(t *testing.T, entry, host string, port int) {
		np, err := ParseNoProxy([]string{entry})
		if err != nil {
			return
		}
		np.Match(host, port, netip.Addr{})
		e := np.entries[0]
		if e.kind == kindExact && e.port == 0 && !np.Match(strings.ToUpper(e.name)+".", 0, netip.Addr{}) {
			t.Errorf("entry %q does not match its own name %q", entry, e.name)
		}
		if e.kind == kindSuffix && e.port == 0 && !np.Match("x."+e.name, 0, netip.Addr{}) {
			t.Errorf("entry %q does not match x.%s", entry, e.name)
		}
	})
}

// FuzzPACResult: any result string gives routes or an error, and routes
// name only configured proxies or direct.
func FuzzPACResult(f *testing.F) {
	p, err := NewPAC([]byte(`function FindProxyForURL(){return "DIRECT"}`), PACOptions{Proxies: corpProxies})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"DIRECT", "PROXY proxy-a.corp.example:8080; DIRECT", "SOCKS a:1", "", ";;", "HTTPS partner-gw.corp.example:8443"} {
		f.Add(s)
	}
	names := map[string]bool{"": true}
	for _, n := range corpProxies {
		names[n] = true
	}
	f.Fuzz(func(t *testing.T, s string) {
		routes, err := p.parseResult(s)
		if err != nil {
			if routes != nil {
				t.Error("routes with an error")
			}
			return
		}
		if len(routes) == 0 {
			t.Error("no routes and no error")
		}
		for _, r := range routes {
			if !names[r.Proxy] {
				t.Errorf("%q gave unconfigured %q", s, r.Proxy)
			}
		}
	})
}
