package egress

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// corpPAC is shaped like the scripts corporate networks serve: plain and
// internal names direct, private ranges direct, one partner through its
// own proxy, everything else through two proxies and then direct.
const corpPAC = `
function FindProxyForURL(url, host) {
  host = host.toLowerCase();
  if (isPlainHostName(host) ||
      dnsDomainIs(host, ".corp.example") ||
      localHostOrDomainIs(host, "intranet.corp.example") ||
      shExpMatch(host, "*.internal.example"))
    return "DIRECT";
  if (shExpMatch(url, "http://legacy.example/*"))
    return "PROXY legacy.corp.example:3128";
  if (isInNet(host, "10.0.0.0", "255.0.0.0") ||
      isInNet(host, "192.168.0.0", "255.255.0.0"))
    return "DIRECT";
  if (dnsDomainIs(host, ".partner.example"))
    return "HTTPS partner-gw.corp.example:8443";
  return "PROXY proxy-a.corp.example:8080; PROXY proxy-b.corp.example:8080; DIRECT";
}
`

var corpProxies = map[string]string{
	"proxy-a.corp.example:8080":    "a",
	"PROXY-B.corp.example:8080":    "b",
	"partner-gw.corp.example:8443": "partner",
	"legacy.corp.example:3128":     "legacy",
	"unused.corp.example:1":        "unused",
}

func routes(names ...string) []Route {
	r := make([]Route, len(names))
	for i, n := range names {
		r[i] = Route{Proxy: n}
	}
	return r
}

func TestPACCorporate(t *testing.T) {
	p, err := NewPAC([]byte(corpPAC), PACOptions{Proxies: corpProxies})
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		url, host string
		want      []Route
	}{
		"plain name":       {"https://wiki/", "wiki", routes("")},
		"internal domain":  {"https://git.corp.example/x", "git.corp.example", routes("")},
		"internal case":    {"https://GIT.Corp.Example/", "GIT.Corp.Example", routes("")},
		"glob":             {"https://a.internal.example/", "a.internal.example", routes("")},
		"private literal":  {"http://10.2.3.4:8080/", "10.2.3.4", routes("")},
		"private 192":      {"http://192.168.9.9/", "192.168.9.9", routes("")},
		"partner":          {"https://api.partner.example/", "api.partner.example", routes("partner")},
		"internet":         {"https://api.openai.com/v1/chat", "api.openai.com", routes("a", "b", "")},
		"internet literal": {"https://203.0.113.5/", "203.0.113.5", routes("a", "b", "")},
		"legacy http":      {"http://legacy.example/app", "legacy.example", routes("legacy")},
		"legacy https":     {"https://legacy.example/app", "legacy.example", routes("a", "b", "")},
		"ipv6 literal":     {"https://[2001:db8::1]/", "[2001:db8::1]", routes("a", "b", "")},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := p.Find(context.Background(), c.url, c.host)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("Find(%q) = %v, want %v", c.url, got, c.want)
			}
		})
	}
}

func TestPACSeesNoPathOrQuery(t *testing.T) {
	p, err := NewPAC([]byte(`function FindProxyForURL(url, host) {
		if (url != "https://api.example:8443/") throw new Error("saw " + url);
		return "DIRECT"; }`), PACOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Find(context.Background(), "https://user:canary-secret@API.example:8443/v1/x?key=canary-secret#f", "api.example"); err != nil {
		t.Fatal(err)
	}
}

func TestPACResults(t *testing.T) {
	cases := map[string]struct {
		ret     string
		want    []Route
		wantErr error
	}{
		"direct":             {`"DIRECT"`, routes(""), nil},
		"spaces and case":    {`"  proxy   proxy-a.corp.example:8080 ;direct;  "`, routes("a", ""), nil},
		"http keyword":       {`"HTTP proxy-a.corp.example:8080"`, routes("a"), nil},
		"https keyword":      {`"HTTPS partner-gw.corp.example:8443; DIRECT"`, routes("partner", ""), nil},
		"duplicates dropped": {`"PROXY proxy-a.corp.example:8080; PROXY PROXY-A.corp.example:8080; DIRECT; DIRECT"`, routes("a", ""), nil},
		"socks skipped":      {`"SOCKS5 s.example:1080; PROXY proxy-a.corp.example:8080"`, routes("a"), nil},
		"socks only":         {`"SOCKS s.example:1080; SOCKS4 t.example:1080"`, nil, ErrPACResult},
		"unconfigured":       {`"PROXY evil.example:3128; DIRECT"`, nil, ErrPACUnconfigured},
		"unconfigured later": {`"PROXY proxy-a.corp.example:8080; PROXY evil.example:3128"`, nil, ErrPACUnconfigured},
		"port differs":       {`"PROXY proxy-a.corp.example:8081"`, nil, ErrPACUnconfigured},
		"no port":            {`"PROXY proxy-a.corp.example"`, nil, ErrPACUnconfigured},
		"empty":              {`""`, nil, ErrPACResult},
		"only semicolons":    {`" ; ;"`, nil, ErrPACResult},
		"null":               {`null`, nil, ErrPACResult},
		"undefined":          {`undefined`, nil, ErrPACResult},
		"number":             {`42`, nil, ErrPACResult},
		"object":             {`{toString: function(){return "DIRECT"}}`, nil, ErrPACResult},
		"garbage":            {`"GO AWAY"`, nil, ErrPACResult},
		"direct with arg":    {`"DIRECT x:1"`, nil, ErrPACResult},
		"proxy two args":     {`"PROXY a:1 b:2"`, nil, ErrPACResult},
		"proxy no arg":       {`"PROXY"`, nil, ErrPACResult},
		"huge":               {`"DIRECT;".repeat(1000)`, nil, ErrPACResult},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			p, err := NewPAC([]byte("function FindProxyForURL(url, host) { return "+c.ret+"; }"),
				PACOptions{Proxies: corpProxies})
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.Find(context.Background(), "https://x.example/", "x.example")
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("err = %v, want %v (routes %v)", err, c.wantErr, got)
				}
				return
			}
			if err != nil || !slices.Equal(got, c.want) {
				t.Errorf("Find = %v, %v; want %v", got, err, c.want)
			}
		})
	}
}

func TestNewPACRefuses(t *testing.T) {
	cases := map[string]struct {
		script string
		want   string
	}{
		"no function":    {`var x = 1;`, "no function FindProxyForURL"},
		"not function":   {`var FindProxyForURL = "DIRECT";`, "no function FindProxyForURL"},
		"syntax":         {`function FindProxyForURL(url, host) { return "DIRECT"`, "compile"},
		"throws on load": {`throw new Error("boom"); function FindProxyForURL(){}`, "boom"},
		"loops on load":  {`while (true) {} function FindProxyForURL(){}`, "timed out"},
		"empty":          {``, "no function FindProxyForURL"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := NewPAC([]byte(c.script), PACOptions{Timeout: 50 * time.Millisecond})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("NewPAC err = %v, want %q", err, c.want)
			}
		})
	}
	for hp, name := range map[string]string{"a:1": "", "a": "a", "http://a:1": "a", ":1": "a"} {
		if _, err := NewPAC([]byte(`function FindProxyForURL(){return "DIRECT"}`),
			PACOptions{Proxies: map[string]string{hp: name}}); err == nil {
			t.Errorf("proxies[%q] = %q must be refused", hp, name)
		}
	}
}

func TestPACWindowsFile(t *testing.T) {
	// Files saved on Windows: a byte-order mark and CRLF line ends.
	p, err := NewPAC([]byte("\xef\xbb\xbffunction FindProxyForURL(url, host)\r\n{\r\n  return \"DIRECT\";\r\n}\r\n"), PACOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := p.Find(context.Background(), "https://a.example/", "a.example"); err != nil || !slices.Equal(r, routes("")) {
		t.Errorf("Find = %v, %v", r, err)
	}
}

func TestPACTimeout(t *testing.T) {
	p, err := NewPAC([]byte(`function FindProxyForURL(url, host) {
		if (host == "loop.example") { while (true) {} }
		if (host == "recurse.example") { var f = function() { return f() + 1; }; return f(); }
		return "DIRECT"; }`), PACOptions{Timeout: 30 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = p.Find(context.Background(), "https://loop.example/", "loop.example")
	if !errors.Is(err, ErrPACTimeout) {
		t.Fatalf("err = %v, want timeout", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("timeout took %v", d)
	}
	// Deep recursion is stopped by the call-stack bound, as a script error.
	if _, err = p.Find(context.Background(), "https://recurse.example/", "recurse.example"); !errors.Is(err, ErrPACScript) {
		t.Errorf("recursion err = %v, want script error", err)
	}
	// The pool recovers: the interrupted runtime was dropped.
	for range 5 {
		if r, err := p.Find(context.Background(), "https://ok.example/", "ok.example"); err != nil || !slices.Equal(r, routes("")) {
			t.Fatalf("after timeout: %v, %v", r, err)
		}
	}
	// Errors are not cached: a timeout is a timeout again.
	if _, err = p.Find(context.Background(), "https://loop.example/", "loop.example"); !errors.Is(err, ErrPACTimeout) {
		t.Fatalf("second err = %v, want timeout", err)
	}
}

func TestPACCallerContext(t *testing.T) {
	p, err := NewPAC([]byte(`function FindProxyForURL(url, host) { while (true) {} }`),
		PACOptions{Timeout: time.Second})
	if err == nil {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := p.Find(ctx, "https://a.example/", "a.example"); !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want canceled", err)
		}
		return
	}
	t.Fatal(err)
}

func TestPACThrows(t *testing.T) {
	p, err := NewPAC([]byte(`function FindProxyForURL(url, host) {
		if (host == "a.example") throw new Error("no route for " + host);
		if (host == "b.example") return undefinedFunction();
		if (host == "c.example") throw "bare";
		return "DIRECT"; }`), PACOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"a.example", "b.example", "c.example"} {
		if _, err := p.Find(context.Background(), "https://"+h+"/", h); !errors.Is(err, ErrPACScript) {
			t.Errorf("%s: err = %v, want script error", h, err)
		}
	}
	if _, err := p.Find(context.Background(), "https://d.example/", "d.example"); err != nil {
		t.Errorf("after throws: %v", err)
	}
}

func TestPACNoHostAccess(t *testing.T) {
	// The runtime offers no require, fetch, XMLHttpRequest or process.
	p, err := NewPAC([]byte(`function FindProxyForURL(url, host) {
		var g = [typeof require, typeof fetch, typeof XMLHttpRequest, typeof process, typeof setTimeout];
		return g.join(",") == "undefined,undefined,undefined,undefined,undefined" ? "DIRECT" : "BAD " + g; }`),
		PACOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Find(context.Background(), "https://a.example/", "a.example"); err != nil {
		t.Error(err)
	}
}

func TestPACBadInput(t *testing.T) {
	p, err := NewPAC([]byte(`function FindProxyForURL(url, host) { return "DIRECT"; }`), PACOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range [][2]string{
		{"a.example", "a.example"},
		{"https://a.example/", ""},
		{"%zz", "a"},
		{"https://a.example/", "a example"},
		{"https://a.example/", "a.example\n"},
		{"https://a.example/", strings.Repeat("a.", 130) + "example"},
		{"https://a.example/", "a.example/x"},
	} {
		if _, err := p.Find(context.Background(), c[0], c[1]); err == nil {
			t.Errorf("Find(%q, %q) succeeded", c[0], c[1])
		}
	}
}

func TestPACCache(t *testing.T) {
	// Every evaluation calls isResolvable, which calls Resolve: the
	// number of Resolve calls is the number of evaluations.
	var calls atomic.Int32
	count := func(context.Context, string) ([]netip.Addr, error) { calls.Add(1); return nil, nil }
	p, err := NewPAC([]byte(`function FindProxyForURL(url, host) { isResolvable("count"); return "PROXY proxy-a.corp.example:8080"; }`),
		PACOptions{Proxies: corpProxies, Resolve: count, Timeout: 10 * time.Second}) // counts, not times
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	find := func(u, h string) {
		t.Helper()
		if r, err := p.Find(ctx, u, h); err != nil || !slices.Equal(r, routes("a")) {
			t.Fatalf("Find(%q) = %v, %v", u, r, err)
		}
	}
	find("https://a.example/x", "a.example")
	find("https://a.example/y?z", "A.example.")
	find("https://A.EXAMPLE/", "a.example")
	if n := calls.Load(); n != 1 {
		t.Errorf("one host: %d evaluations, want 1", n)
	}
	find("http://a.example/", "a.example")       // another scheme
	find("https://a.example:8443/", "a.example") // another port
	find("https://b.example/", "b.example")
	if n := calls.Load(); n != 4 {
		t.Errorf("%d evaluations, want 4", n)
	}
	// Expiry: past the TTL the script runs again.
	now := time.Now()
	p.now = func() time.Time { return now.Add(pacCacheTTL - time.Second) }
	find("https://a.example/", "a.example")
	if n := calls.Load(); n != 4 {
		t.Errorf("before expiry: %d evaluations, want 4", n)
	}
	p.now = func() time.Time { return now.Add(pacCacheTTL + time.Second) }
	find("https://a.example/", "a.example")
	if n := calls.Load(); n != 5 {
		t.Errorf("after expiry: %d evaluations, want 5", n)
	}
	// The cache is bounded.
	for i := range pacCacheSize + 10 {
		h := fmt.Sprintf("h%d.example", i)
		find("https://"+h+"/", h)
	}
	if n := p.cache.Len(); n > pacCacheSize {
		t.Errorf("cache holds %d entries, bound %d", n, pacCacheSize)
	}
}

func TestPACConcurrent(t *testing.T) {
	p, err := NewPAC([]byte(corpPAC), PACOptions{Proxies: corpProxies})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				h := fmt.Sprintf("h%d.example", (g*7+i)%50)
				if i%3 == 0 {
					h = fmt.Sprintf("s%d.corp.example", i)
				}
				want := routes("a", "b", "")
				if strings.HasSuffix(h, ".corp.example") {
					want = routes("")
				}
				got, err := p.Find(context.Background(), "https://"+h+"/", h)
				if err != nil || !slices.Equal(got, want) {
					t.Errorf("Find(%s) = %v, %v; want %v", h, got, err, want)
					return
				}
			}
		})
	}
	wg.Wait()
	checkPool(t, p)
}

func TestPACConcurrentTimeouts(t *testing.T) {
	// Timeouts under load must not leak runtimes nor leave an interrupt
	// set on one that is reused.
	p, err := NewPAC([]byte(`function FindProxyForURL(url, host) {
		if (host.indexOf("loop") == 0) { while (true) {} } return "DIRECT"; }`),
		PACOptions{Timeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			for i := range 10 {
				h := fmt.Sprintf("ok%d-%d.example", g, i)
				if i%2 == 0 {
					h = fmt.Sprintf("loop%d-%d.example", g, i)
				}
				_, err := p.Find(context.Background(), "https://"+h+"/", h)
				if strings.HasPrefix(h, "ok") && err != nil && !errors.Is(err, ErrPACTimeout) {
					t.Errorf("%s: %v", h, err)
				}
				if strings.HasPrefix(h, "loop") && !errors.Is(err, ErrPACTimeout) {
					t.Errorf("%s: %v, want timeout", h, err)
				}
			}
		})
	}
	wg.Wait()
	if r, err := p.Find(context.Background(), "https://final.example/", "final.example"); err != nil || !slices.Equal(r, routes("")) {
		t.Errorf("after load: %v, %v", r, err)
	}
	checkPool(t, p)
}

func TestPACResolve(t *testing.T) {
	resolve := func(ctx context.Context, host string) ([]netip.Addr, error) {
		switch host {
		case "db.corp.example":
			return []netip.Addr{netip.MustParseAddr("fd00::5"), netip.MustParseAddr("10.1.2.3")}, nil
		case "v6only.example":
			return []netip.Addr{netip.MustParseAddr("2001:db8::7")}, nil
		case "slow.example":
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return nil, errors.New("no such host")
	}
	script := `function FindProxyForURL(url, host) {
		if (host == "slow.example") return dnsResolve(host) || "DIRECT";
		return "DIRECT; PROXY " + [String(dnsResolve(host)), isResolvable(host), isInNet(host, "10.0.0.0", "255.0.0.0")].join("/").replace(/[^a-z0-9.]/g, "-") + ":1";
	}`
	for name, c := range map[string]struct {
		resolve func(context.Context, string) ([]netip.Addr, error)
		host    string
		want    string
	}{
		"v4 preferred":    {resolve, "db.corp.example", "10.1.2.3/true/true"},
		"v6 only":         {resolve, "v6only.example", "2001:db8::7/true/false"},
		"nxdomain":        {resolve, "nx.example", "null/false/false"},
		"no resolver":     {nil, "db.corp.example", "null/false/false"},
		"literal no dns":  {nil, "10.9.8.7", "10.9.8.7/true/true"},
		"literal outside": {nil, "11.0.0.1", "11.0.0.1/true/false"},
	} {
		t.Run(name, func(t *testing.T) {
			want := regexp.MustCompile(`[^a-z0-9.]`).ReplaceAllString(c.want, "-")
			p, err := NewPAC([]byte(script), PACOptions{Resolve: c.resolve, Proxies: map[string]string{want + ":1": "seen"}})
			if err != nil {
				t.Fatal(err)
			}
			r, err := p.Find(context.Background(), "https://"+c.host+"/", c.host)
			if err != nil || !slices.Equal(r, routes("", "seen")) {
				t.Errorf("Find = %v, %v; want the script to see %s", r, err, want)
			}
		})
	}
	// A resolver that blocks is bounded by the evaluation's timeout.
	p, err := NewPAC([]byte(script), PACOptions{Resolve: resolve, Timeout: 30 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Find(context.Background(), "https://slow.example/", "slow.example"); !errors.Is(err, ErrPACTimeout) {
		t.Errorf("slow resolver: %v, want timeout", err)
	}
}

func TestPACMyIP(t *testing.T) {
	script := `function FindProxyForURL(url, host) {
		return isInNet(myIpAddress(), "10.20.0.0", "255.255.0.0") ? "DIRECT" : "PROXY p:1"; }`
	for ip, want := range map[string][]Route{"10.20.3.4": routes(""), "": routes("p"), "192.168.1.1": routes("p")} {
		var opts PACOptions
		opts.Proxies = map[string]string{"p:1": "p"}
		if ip != "" {
			opts.MyIP = netip.MustParseAddr(ip)
		}
		p, err := NewPAC([]byte(script), opts)
		if err != nil {
			t.Fatal(err)
		}
		if r, err := p.Find(context.Background(), "https://a.example/", "a.example"); err != nil || !slices.Equal(r, want) {
			t.Errorf("MyIP %q: %v, %v; want %v", ip, r, err, want)
		}
	}
}

// checkPool: at rest, no slot is held and no more runtimes are idle than
// the bound.
func checkPool(t *testing.T, p *PAC) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.slots) != 0 || len(p.idle) > cap(p.slots) || len(p.idle) < 1 {
		t.Errorf("slots held %d, idle %d, bound %d", len(p.slots), len(p.idle), cap(p.slots))
	}
}

func TestPACResultNotShared(t *testing.T) {
	p, err := NewPAC([]byte(corpPAC), PACOptions{Proxies: corpProxies})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := p.Find(context.Background(), "https://x.example/", "x.example")
	r[0].Proxy = "mutated"
	if r, _ := p.Find(context.Background(), "https://x.example/", "x.example"); r[0].Proxy != "a" {
		t.Errorf("a caller's change reached the cache: %v", r)
	}
}

func TestPACResolvePanics(t *testing.T) {
	boom := func(context.Context, string) ([]netip.Addr, error) { panic("resolver bug") }
	p, err := NewPAC([]byte(`function FindProxyForURL(url, host) { return dnsResolve(host) ? "DIRECT" : "DIRECT"; }`),
		PACOptions{Resolve: boom})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 { // more than once: the slot of the dropped runtime is freed
		if _, err := p.Find(context.Background(), "https://a.example/", "a.example"); !errors.Is(err, ErrPACScript) {
			t.Fatalf("err = %v, want a script error", err)
		}
	}
	if len(p.slots) != 0 {
		t.Errorf("%d slots held", len(p.slots))
	}
}
