package broker

import (
	"strings"
	"testing"
)

func TestSplitHost(t *testing.T) {
	cases := map[string]struct {
		in   string
		host string
		port int
		bad  bool
	}{
		"name":                {in: "API.Example.com.", host: "api.example.com", port: 443},
		"name and port":       {in: "api.example.com:8443", host: "api.example.com", port: 8443},
		"ipv4":                {in: "127.0.0.1:80", host: "127.0.0.1", port: 80},
		"decimal":             {in: "2130706433", host: "127.0.0.1", port: 443},
		"hex":                 {in: "0x7f000001:80", host: "127.0.0.1", port: 80},
		"dotted hex":          {in: "0x7f.0x0.0x0.0x1", host: "127.0.0.1", port: 443},
		"octal":               {in: "0177.0.0.01", host: "127.0.0.1", port: 443},
		"short":               {in: "127.1", host: "127.0.0.1", port: 443},
		"three parts":         {in: "10.1.258", host: "10.1.1.2", port: 443},
		"metadata as decimal": {in: "2852039166", host: "169.254.169.254", port: 443},
		"ipv6":                {in: "[::1]:8080", host: "::1", port: 8080},
		"mapped ipv6":         {in: "[::ffff:127.0.0.1]", host: "127.0.0.1", port: 443},
		"ipv6 long form":      {in: "[0:0:0:0:0:0:0:1]", host: "::1", port: 443},
		"digit-led name":      {in: "1password.com", host: "1password.com", port: 443},
		"underscore":          {in: "_srv.example.com", host: "_srv.example.com", port: 443},
		"too big":             {in: "4294967296", bad: true},
		"bad octet":           {in: "256.1.1.1", bad: true},
		"bad octal":           {in: "09.1.1.1", bad: true},
		"five parts":          {in: "1.2.3.4.5", bad: true},
		"empty":               {in: "", bad: true},
		"zone":                {in: "[fe80::1%eth0]", bad: true},
		"space":               {in: "a b.com", bad: true},
		"slash":               {in: "a.com/x", bad: true},
		"at":                  {in: "user@a.com", bad: true},
		"double dot":          {in: "a..com", bad: true},
		"port zero":           {in: "a.com:0", bad: true},
		"port too big":        {in: "a.com:65536", bad: true},
		"port with plus":      {in: "a.com:+443", bad: true},
		"bare 0x":             {in: "0x", bad: true},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			h, p, err := splitHost(c.in, 443)
			if c.bad {
				if err == nil {
					t.Fatalf("accepted %q as %s:%d", c.in, h, p)
				}
				return
			}
			if err != nil || h != c.host || p != c.port {
				t.Fatalf("got %q %d %v; want %q %d", h, p, err, c.host, c.port)
			}
		})
	}
}

// FuzzSplitHost: whatever the agent sends as a host, a result is canonical (normalising it
// again changes nothing) and never contains characters that could alter a URL or a header.
func FuzzSplitHost(f *testing.F) {
	for _, s := range []string{"api.example.com:443", "2130706433", "0x7f.1", "[::ffff:127.0.0.1]:80", "a..b", "127.0.0.1:0", "0177.0.0.1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		h, p, err := splitHost(in, 443)
		if err != nil {
			return
		}
		if strings.ContainsAny(h, "/@?#% \r\n\t[]") || p < 1 || p > 65535 {
			t.Fatalf("splitHost(%q) = %q, %d", in, h, p)
		}
		h2, _, err := splitHost(h, 443)
		if err != nil || h2 != h {
			t.Fatalf("not canonical: %q -> %q -> %q (%v)", in, h, h2, err)
		}
	})
}

// TestTargetNamesOnlyWhatParsesToIt checks the shortcut requestTarget takes before parsing a
// request's host: it accepts only what the parser reads as the same host and port.
func TestTargetNamesOnlyWhatParsesToIt(t *testing.T) {
	for _, tg := range []target{newTarget("https", "api.example.com", 443), newTarget("https", "127.0.0.1", 8443),
		newTarget("https", "::1", 443), newTarget("http", "::1", 8080), newTarget("http", "example.com", 80)} {
		named := 0
		for _, h := range []string{tg.host, tg.hostPort(), tg.hostHeader(), "[" + tg.host + "]", strings.ToUpper(tg.hostPort()),
			tg.host + ".", tg.host + ":1", "other.example:443", tg.hostPort() + "0"} {
			if !tg.names(h) {
				continue
			}
			named++
			host, port, err := splitHost(h, 0)
			if err != nil || host != tg.host || (port != 0 && port != tg.port) {
				t.Errorf("%s names %q, parsed as %q %d %v", tg.hostPort(), h, host, port, err)
			}
		}
		if named == 0 {
			t.Errorf("%s names none of its own forms", tg.hostPort())
		}
	}
}

func TestTargetHostHeader(t *testing.T) {
	for _, c := range []struct {
		t            target
		header, addr string
	}{
		{newTarget("https", "api.example.com", 443), "api.example.com", "api.example.com:443"},
		{newTarget("https", "api.example.com", 8443), "api.example.com:8443", "api.example.com:8443"},
		{newTarget("http", "api.example.com", 80), "api.example.com", "api.example.com:80"},
		{newTarget("http", "api.example.com", 443), "api.example.com:443", "api.example.com:443"}, // plain HTTP in a tunnel to 443
		{newTarget("https", "::1", 443), "[::1]", "[::1]:443"},
		{newTarget("http", "::1", 8080), "[::1]:8080", "[::1]:8080"},
	} {
		if c.t.hostHeader() != c.header || c.t.hostPort() != c.addr {
			t.Errorf("%s %s %d: Host %q, address %q; want %q, %q", c.t.scheme, c.t.host, c.t.port, c.t.hostHeader(), c.t.hostPort(), c.header, c.addr)
		}
	}
}
