package upstream

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"testing"
	"time"
)

// pacScript chooses by host: the proxies a and b are at 127.0.0.1:1001 and :1002.
const pacScript = `function FindProxyForURL(url, host) {
  if (host == "127.0.0.2") return "PROXY 127.0.0.1:1001; PROXY 127.0.0.1:1002; DIRECT";
  if (host == "127.0.0.3") return "DIRECT";
  if (host == "127.0.0.4") return "PROXY 10.9.9.9:3128";  // not configured
  if (host == "127.0.0.5") throw new Error("boom");
  if (host == "127.0.0.6") while (true) {}
  if (host == "127.0.0.8") return url.substring(0, 5) == "http:" ? "PROXY 127.0.0.1:1002" : "PROXY 127.0.0.1:1001";
  if (url != "https://" + host + ":443/") return "DIRECT"; // the script sees scheme://host:port/
  return "PROXY 127.0.0.1:1001";
}`

func pacDialer(t *testing.T, fallback string, noProxy ...string) *Dialer {
	t.Helper()
	d := NewDialer([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, 0)
	a, _ := url.Parse("http://127.0.0.1:1001")
	b, _ := url.Parse("http://127.0.0.1:1002")
	if err := d.ConfigureProxies(ProxyOptions{Proxies: []ProxyServer{{Name: "a", URL: a}, {Name: "b", URL: b}}, NoProxy: noProxy}); err != nil {
		t.Fatal(err)
	}
	if err := d.ConfigurePAC([]byte(pacScript), 50*time.Millisecond, fallback); err != nil {
		t.Fatal(err)
	}
	return d
}

func names(list []*ProxyServer) []string {
	var out []string
	for _, s := range list {
		if s == nil {
			out = append(out, Direct)
		} else {
			out = append(out, s.Name)
		}
	}
	return out
}

// TestPlanPAC: the PAC file's entries map to the configured proxies by host:port, in order,
// DIRECT included; a failed evaluation gives the fallback; the policy's route and no_proxy
// come first.
func TestPlanPAC(t *testing.T) {
	bg := context.Background()
	for _, c := range []struct {
		name, fallback, scheme, addr, route string
		noProxy                             []string
		want                                []string // nil: direct
		err                                 error
	}{
		{name: "failover list", fallback: "b", addr: "127.0.0.2:443", want: []string{"a", "b", Direct}},
		{name: "direct", fallback: "b", addr: "127.0.0.3:443"},
		{name: "only the authority", fallback: "b", addr: "127.0.0.9:443", want: []string{"a"}},
		{name: "scheme https", fallback: "b", addr: "127.0.0.8:80", want: []string{"a"}},
		{name: "scheme http", fallback: "b", scheme: "http", addr: "127.0.0.8:80", want: []string{"b"}},
		{name: "unconfigured to proxy", fallback: "b", addr: "127.0.0.4:443", want: []string{"b"}},
		{name: "throw to direct", fallback: Direct, addr: "127.0.0.5:443"},
		{name: "timeout to refuse", fallback: PACRefuse, addr: "127.0.0.6:443", err: ErrPACRefused},
		{name: "unconfigured to refuse", fallback: PACRefuse, addr: "127.0.0.4:443", err: ErrPACRefused},
		{name: "policy route first", fallback: PACRefuse, addr: "127.0.0.4:443", route: "b", want: []string{"b"}},
		{name: "policy direct first", fallback: PACRefuse, addr: "127.0.0.4:443", route: Direct},
		{name: "no_proxy before PAC", fallback: PACRefuse, addr: "127.0.0.4:443", noProxy: []string{"127.0.0.4"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := pacDialer(t, c.fallback, c.noProxy...)
			ctx := bg
			if c.route != "" {
				ctx = WithRoute(bg, &Route{Name: c.route})
			}
			scheme := c.scheme
			if scheme == "" {
				scheme = "https"
			}
			list, _, err := d.plan(ctx, scheme, c.addr)
			if !errors.Is(err, c.err) || (c.err == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, c.err)
			}
			if got := names(list); !slices.Equal(got, c.want) {
				t.Fatalf("plan = %q, want %q", got, c.want)
			}
		})
	}
	// A fallback that is not configured is refused when the PAC is configured.
	d := NewDialer(nil, 0)
	a, _ := url.Parse("http://127.0.0.1:1001")
	_ = d.ConfigureProxies(ProxyOptions{Proxies: []ProxyServer{{Name: "a", URL: a}}})
	if err := d.ConfigurePAC([]byte(pacScript), 0, "nope"); err == nil {
		t.Fatal("fallback nope accepted")
	}
	if err := d.ConfigurePAC([]byte("var x = 1;"), 0, Direct); err == nil {
		t.Fatal("a script without FindProxyForURL accepted")
	}
}

// TestDialPACFailover: "PROXY a; PROXY b; DIRECT" with both proxies down reaches the origin
// direct, and says so in via; a refusal is ErrPACRefused, with no connection made.
func TestDialPACFailover(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skip("127.0.0.2 not available:", err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	r := &Route{}
	c, err := pacDialer(t, PACRefuse).DialContext(WithRoute(context.Background(), r), "tcp", l.Addr().String())
	if err != nil {
		t.Fatalf("PROXY a; PROXY b; DIRECT with a and b down: %v", err)
	}
	c.Close()
	if r.Via() != Direct {
		t.Fatalf("via = %q, want direct", r.Via())
	}
	_, err = pacDialer(t, PACRefuse).DialContext(context.Background(), "tcp", "127.0.0.5:1")
	if !errors.Is(err, ErrPACRefused) {
		t.Fatalf("throwing PAC with refuse: %v", err)
	}
}
