package egress

import (
	"net/netip"
	"strings"
	"testing"
)

func TestNoProxyMatch(t *testing.T) {
	np, err := ParseNoProxy([]string{
		"Host.Example.com",
		".corp.example",
		"*.lab.example.",
		"internal.example:8443",
		".svc.example:443",
		"10.0.0.0/8",
		"fd00::/8",
		"192.168.1.7",
		"2001:db8::1",
		"[2001:db8::2]:8443",
		"[2001:db8:1::/48]:443",
		"172.16.0.9:9000",
		"localhost",
	})
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr
	none := netip.Addr{}
	cases := map[string]struct {
		host string
		port int
		addr netip.Addr
		want bool
	}{
		"exact":                      {"host.example.com", 443, a("203.0.113.1"), true},
		"exact case":                 {"HOST.EXAMPLE.COM", 443, none, true},
		"exact trailing dot":         {"host.example.com.", 80, none, true},
		"exact not subdomain":        {"a.host.example.com", 443, none, false},
		"exact not lookalike":        {"xhost.example.com", 443, none, false},
		"suffix bare domain":         {"corp.example", 443, none, true},
		"suffix sub":                 {"git.corp.example", 443, none, true},
		"suffix deep":                {"a.b.corp.example", 1, none, true},
		"suffix case":                {"Git.CORP.example", 443, none, true},
		"suffix not lookalike":       {"evilcorp.example", 443, none, false},
		"suffix not lookalike dot":   {"corp.example.evil", 443, none, false},
		"star suffix bare":           {"lab.example", 443, none, true},
		"star suffix sub":            {"x.lab.example", 443, none, true},
		"port match":                 {"internal.example", 8443, none, true},
		"port mismatch":              {"internal.example", 443, none, false},
		"port unknown":               {"internal.example", 0, none, false},
		"suffix port":                {"a.svc.example", 443, none, true},
		"suffix port mismatch":       {"a.svc.example", 80, none, false},
		"cidr on resolved addr":      {"db.example", 5432, a("10.3.4.5"), true},
		"cidr on mapped addr":        {"db.example", 5432, a("::ffff:10.3.4.5"), true},
		"cidr on literal":            {"10.9.9.9", 80, none, true},
		"cidr miss":                  {"db.example", 5432, a("11.0.0.1"), false},
		"cidr6 resolved":             {"v6.example", 443, a("fd12::1"), true},
		"cidr6 literal bracketed":    {"[FD12::1]", 443, none, true},
		"cidr6 miss":                 {"v6.example", 443, a("fe80::1"), false},
		"single v4":                  {"printer", 631, a("192.168.1.7"), true},
		"single v4 neighbour":        {"printer", 631, a("192.168.1.8"), false},
		"single v6 literal":          {"2001:db8::1", 443, none, true},
		"single v6 expanded":         {"2001:0db8:0:0:0:0:0:1", 443, none, true},
		"v6 with port":               {"[2001:db8::2]", 8443, none, true},
		"v6 with port mismatch":      {"[2001:db8::2]", 443, none, false},
		"v6 cidr with port":          {"x.example", 443, a("2001:db8:1:2::3"), true},
		"v6 cidr with port mismatch": {"x.example", 80, a("2001:db8:1:2::3"), false},
		"v4 with port":               {"172.16.0.9", 9000, none, true},
		"v4 with port mismatch":      {"172.16.0.9", 9001, none, false},
		"name entry not literal":     {"127.0.0.1", 80, none, false},
		"localhost":                  {"localhost", 80, none, true},
		"literal beats resolved":     {"10.1.1.1", 80, a("8.8.8.8"), false},
		"other":                      {"api.openai.com", 443, a("203.0.113.9"), false},
		"empty host":                 {"", 443, none, false},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			if got := np.Match(c.host, c.port, c.addr); got != c.want {
				t.Errorf("Match(%q, %d, %v) = %v, want %v", c.host, c.port, c.addr, got, c.want)
			}
		})
	}
}

func TestNoProxyLiteralBeatsResolved(t *testing.T) {
	// When the caller gives the checked address, it is what CIDRs match,
	// not a literal that may have been rewritten; here both agree.
	np, _ := ParseNoProxy([]string{"8.8.8.0/24"})
	if !np.Match("10.1.1.1", 80, netip.MustParseAddr("8.8.8.8")) {
		t.Error("the checked address must be what a CIDR matches")
	}
}

func TestNoProxyStar(t *testing.T) {
	np, err := ParseNoProxy([]string{"*"})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"a.example", "10.0.0.1", "[::1]", ""} {
		if !np.Match(h, 443, netip.Addr{}) {
			t.Errorf("* must match %q", h)
		}
	}
	np, _ = ParseNoProxy([]string{"*:8443"})
	if np.Match("a.example", 443, netip.Addr{}) || !np.Match("a.example", 8443, netip.Addr{}) {
		t.Error("*:8443 must match only port 8443")
	}
	var nilNP *NoProxy
	if nilNP.Match("a.example", 443, netip.Addr{}) {
		t.Error("nil NoProxy must match nothing")
	}
	empty, _ := ParseNoProxy(nil)
	if empty.Match("a.example", 443, netip.Addr{}) {
		t.Error("empty NoProxy must match nothing")
	}
}

func TestParseNoProxyErrors(t *testing.T) {
	cases := map[string]struct {
		entry string
		want  string
	}{
		"empty":            {"  ", "empty entry"},
		"scheme":           {"http://a.example", "not a number"},
		"path":             {"a.example/path", "not a CIDR"},
		"bad cidr":         {"10.0.0.0/33", "not a CIDR"},
		"port zero":        {"a.example:0", "out of range"},
		"port big":         {"a.example:65536", "out of range"},
		"port sign":        {"a.example:+80", "not a number"},
		"port empty":       {"a.example:", "not a number"},
		"inner wildcard":   {"a.*.example", "wildcard"},
		"double wildcard":  {"*.*.example", "wildcard"},
		"bare star dot":    {"*.", "not a host name"},
		"bad v6":           {"fd00::zz", "not an IPv6 address"},
		"v6 no close":      {"[fd00::1:443", "missing ]"},
		"v6 junk after":    {"[fd00::1]x", "unexpected"},
		"brackets name":    {"[a.example]:443", "brackets"},
		"zone":             {"fe80::1%eth0", "zones"},
		"empty label":      {"a..example", "label"},
		"space inside":     {"a example", "not allowed"},
		"underscore ok is": {"_a.example:x", "not a number"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ParseNoProxy([]string{"ok.example", c.entry})
			if err == nil {
				t.Fatalf("ParseNoProxy(%q) succeeded", c.entry)
			}
			if !strings.Contains(err.Error(), "no_proxy[1]") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not name index 1 and %q", err, c.want)
			}
		})
	}
}
