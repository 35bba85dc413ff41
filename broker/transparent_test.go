package broker

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/broker/upstream"
)

// hostPolicy allows api.github.com with the github credential, intercepted, and denies every
// other host; it keeps the inputs it was asked about.
type hostPolicy struct {
	mu     sync.Mutex
	inputs []policy.Input
}

func (p *hostPolicy) Decide(_ context.Context, in *policy.Input) (policy.Decision, error) {
	p.mu.Lock()
	p.inputs = append(p.inputs, *in)
	p.mu.Unlock()
	switch in.Host {
	case "api.github.com":
		return policy.Decision{Allow: true, Intercept: true, Credentials: []string{"github"}, Revision: "t"}, nil
	case "plain.test":
		return policy.Decision{Allow: true, Intercept: true, Revision: "t"}, nil
	case "localhost":
		return policy.Decision{Allow: true, Intercept: false, Revision: "t"}, nil // opaque
	}
	return policy.Decision{Reason: "host not allowed", Revision: "t"}, nil
}

func (p *hostPolicy) modes() (out []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, in := range p.inputs {
		out = append(out, in.Phase+":"+in.Mode)
	}
	return out
}

// echoUpstream answers with the Authorization header it received, so that the test sees
// both the injection (the upstream got the secret) and the scrubbing (the agent did not).
type echoUpstream struct{ got atomic.Value }

func (u *echoUpstream) RoundTrip(r *http.Request, _ upstream.Pool) (*http.Response, error) {
	u.got.Store(r.Header.Get("Authorization"))
	body := []byte(`{"you_sent":"` + r.Header.Get("Authorization") + `","host":"` + r.Host + `"}`)
	h := http.Header{"Content-Type": {"application/json"}, "Content-Length": {strconv.Itoa(len(body))}}
	return &http.Response{StatusCode: 200, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: h,
		Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)), Request: r}, nil
}
func (*echoUpstream) Prepare(string, bool)  {}
func (*echoUpstream) CloseIdleConnections() {}

type transparentEnv struct {
	b      *Broker
	pol    *hostPolicy
	up     *echoUpstream
	ln     net.Listener
	roots  *x509.CertPool
	dst    atomic.Value // netip.AddrPort: the original destination the fake netfilter reports
	events chan map[string]any
}

// adminToken gives cfg's admin listener a token: with a transparent listener or an agent on
// loopback, the agent would share it, and the config refuses a tokenless one.
func adminToken(cfg *config.Config) { cfg.Admin.TokenEnv = "CAPBROKER_TEST_ADMIN_TOKEN" }

func newTransparentEnv(t testing.TB, configure ...func(*config.Config)) *transparentEnv {
	t.Helper()
	cfg := testConfig(t)
	cfg.Agents[0].Addresses = []string{"127.0.0.1/32"}
	cfg.Transparent.Listen = "127.0.0.1:0"
	adminToken(cfg)
	for _, f := range configure {
		f(cfg)
	}
	ca, caFile := testCA(t)
	pem, _ := os.ReadFile(caFile)
	e := &transparentEnv{pol: &hostPolicy{}, up: &echoUpstream{}, roots: x509.NewCertPool(), events: make(chan map[string]any, 1000)}
	e.roots.AppendCertsFromPEM(pem)
	al := audit.New(io.Discard)
	t.Cleanup(al.Close)
	al.SetTap(func(line []byte) {
		var ev map[string]any
		if json.Unmarshal(line, &ev) == nil && ev["msg"] == "decision" {
			e.events <- ev
		}
	})
	e.b, _ = testBroker(t, cfg, Deps{Policy: e.pol, Secrets: benchSecrets{}, CA: ca, Audit: al}, e.up, "api.github.com")
	e.b.origDst = func(net.Conn) (netip.AddrPort, error) { return e.dst.Load().(netip.AddrPort), nil }
	var err error
	e.ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.b.ServeTransparent(ctx, e.ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeTransparent: %v", err)
		}
	})
	return e
}

// redirect makes the next connections look redirected from name's pool address, port.
func (e *transparentEnv) redirect(t testing.TB, name string, port uint16) {
	a, ok := e.b.names.Assign(name, false)
	if !ok {
		t.Fatal("no pool address")
	}
	e.dst.Store(netip.AddrPortFrom(a, port))
}

// client speaks to the transparent listener as a client with no proxy settings would to
// whatever address it resolved.
func (e *transparentEnv) client() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", e.ln.Addr().String())
		},
		TLSClientConfig:   &tls.Config{RootCAs: e.roots},
		ForceAttemptHTTP2: true,
	}, Timeout: 10 * time.Second}
}

// event waits for the next audit event matching pred.
func (e *transparentEnv) event(t testing.TB, pred func(map[string]any) bool) map[string]any {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev := <-e.events:
			if pred(ev) {
				return ev
			}
		case <-deadline:
			t.Fatal("no such audit event")
		}
	}
}

func phase(p string) func(map[string]any) bool {
	return func(ev map[string]any) bool { return ev["phase"] == p }
}

func TestTransparentAllowedInjectedAndScrubbed(t *testing.T) {
	e := newTransparentEnv(t)
	e.redirect(t, "api.github.com", 443)
	for _, h2 := range []bool{true, false} {
		c := e.client()
		if !h2 {
			c.Transport.(*http.Transport).ForceAttemptHTTP2 = false
			c.Transport.(*http.Transport).TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		}
		resp, err := c.Get("https://api.github.com/user")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || strings.Contains(string(body), benchSecret) || !strings.Contains(string(body), redacted) {
			t.Fatalf("h2=%v: %d %s", h2, resp.StatusCode, body)
		}
		if got, _ := e.up.got.Load().(string); got != "Bearer "+benchSecret {
			t.Fatalf("upstream got Authorization %q", got)
		}
		for _, p := range []string{"connect", "request"} {
			ev := e.event(t, phase(p))
			if ev["mode"] != "transparent" || ev["decision"] != "allow" || ev["agent"] != "dev-agent" || ev["host"] != "api.github.com" || ev["port"] != float64(443) {
				t.Fatalf("%s event: %v", p, ev)
			}
		}
	}
	for _, m := range e.pol.modes() {
		if !strings.HasSuffix(m, ":transparent") {
			t.Fatalf("policy inputs: %v", e.pol.modes())
		}
	}
}

func TestTransparentDenied(t *testing.T) {
	e := newTransparentEnv(t)
	// TLS: the refusal comes inside a session with the broker's CA, so the client reports it.
	e.redirect(t, "denied.test", 443)
	resp, err := e.client().Get("https://denied.test/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var eb struct{ Error, Reason string }
	if resp.StatusCode != 403 || json.Unmarshal(body, &eb) != nil || eb.Error != "denied" || eb.Reason != "host not allowed" {
		t.Fatalf("TLS: %d %s", resp.StatusCode, body)
	}
	if ev := e.event(t, phase("connect")); ev["decision"] != "deny" || ev["mode"] != "transparent" || ev["host"] != "denied.test" {
		t.Fatalf("event: %v", ev)
	}
	// Plain HTTP.
	e.redirect(t, "denied.test", 80)
	resp, err = e.client().Get("http://denied.test/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 403 || !strings.Contains(string(body), `"error":"denied"`) {
		t.Fatalf("HTTP: %d %s", resp.StatusCode, body)
	}
	if ev := e.event(t, phase("connect")); ev["decision"] != "deny" || ev["port"] != float64(80) {
		t.Fatalf("event: %v", ev)
	}
}

func TestTransparentPlainHTTP(t *testing.T) {
	e := newTransparentEnv(t)
	e.redirect(t, "plain.test", 80)
	resp, err := e.client().Get("http://plain.test/x")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"host":"plain.test"`) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if ev := e.event(t, phase("request")); ev["mode"] != "transparent" || ev["scheme"] != "http" {
		t.Fatalf("event: %v", ev)
	}
}

// A ClientHello or Host for an allowed name, sent to another name's address, is refused: the
// redirect cannot be used to reach one host under another's name.
func TestTransparentFrontingRefused(t *testing.T) {
	e := newTransparentEnv(t)
	e.redirect(t, "other.test", 443)
	_, err := e.client().Get("https://api.github.com/user")
	if err == nil {
		t.Fatal("fronted TLS connection served")
	}
	ev := e.event(t, phase("connect"))
	if ev["decision"] != "deny" || !strings.Contains(ev["reason"].(string), "domain fronting") {
		t.Fatalf("event: %v", ev)
	}
	e.redirect(t, "other.test", 80)
	resp, err := e.client().Get("http://api.github.com/user")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Fatalf("fronted HTTP: %d", resp.StatusCode)
	}
	e.event(t, func(ev map[string]any) bool { return ev["decision"] == "deny" })
	// A literal address outside the pool: the host must resolve to it here.
	e.b.lookup = func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("192.0.2.1")}, nil
	}
	e.dst.Store(netip.MustParseAddrPort("192.0.2.9:443"))
	if _, err := e.client().Get("https://api.github.com/user"); err == nil {
		t.Fatal("TLS to an address the host does not resolve to was served")
	}
	e.event(t, func(ev map[string]any) bool { return ev["decision"] == "deny" })
	e.dst.Store(netip.MustParseAddrPort("192.0.2.1:443"))
	resp, err = e.client().Get("https://api.github.com/user")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("literal address of the host: %d", resp.StatusCode)
	}
	if len(e.pol.modes()) != 2 { // the one served connection, connect and request phase
		t.Fatalf("the policy was asked about refused connections: %v", e.pol.modes())
	}
}

// TestTransparentFrontingReasonNamesItsSource: a refused fronting says where the host came
// from: the TLS server name for TLS, the HTTP Host header for plain HTTP.
func TestTransparentFrontingReasonNamesItsSource(t *testing.T) {
	e := newTransparentEnv(t)
	e.redirect(t, "other.test", 443)
	if _, err := e.client().Get("https://api.github.com/user"); err == nil {
		t.Fatal("fronted TLS connection served")
	}
	if ev := e.event(t, phase("connect")); !strings.HasPrefix(ev["reason"].(string), `TLS server name "api.github.com" does not belong`) {
		t.Errorf("TLS: %v", ev["reason"])
	}
	e.redirect(t, "other.test", 80)
	resp, err := e.client().Get("http://api.github.com/user")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := `HTTP Host "api.github.com" does not belong`
	if resp.StatusCode != 403 || !strings.Contains(string(body), `"reason":"HTTP Host \"api.github.com\" does not belong`) {
		t.Errorf("plain HTTP: %d %s", resp.StatusCode, body)
	}
	e.event(t, func(ev map[string]any) bool { return strings.HasPrefix(fmt.Sprint(ev["reason"]), want) })

	// A later request on a served plain-HTTP connection naming another host: no CONNECT, no TLS.
	e.redirect(t, "plain.test", 80)
	conn, err := net.Dial("tcp", e.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = conn.Write([]byte("GET /a HTTP/1.1\r\nHost: plain.test\r\n\r\nGET /b HTTP/1.1\r\nHost: api.github.com\r\n\r\n"))
	br := bufio.NewReader(conn)
	for i, wantStatus := range []int{200, 403} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != wantStatus || i == 1 && (!strings.Contains(string(body), `the host this redirected connection was opened for \"plain.test:80\"`) ||
			strings.Contains(string(body), "TLS") || strings.Contains(string(body), "CONNECT")) {
			t.Errorf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
}

func TestTransparentRefusedFlows(t *testing.T) {
	e := newTransparentEnv(t)
	read := func(c net.Conn) error {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := bufio.NewReader(c).ReadByte()
		return err
	}
	// A port outside transparent.ports: reset at once.
	e.redirect(t, "api.github.com", 22)
	c, err := net.Dial("tcp", e.ln.Addr().String())
	if err == nil { // else the reset came before the dial returned
		err = read(c)
		c.Close()
	}
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("port 22: %v", err)
	}
	ev := e.event(t, phase("connect"))
	if ev["reason"] != "port 22 is not served (transparent.ports)" || ev["method"] != "TCP" || ev["agent"] != "dev-agent" || ev["host"] != "api.github.com" {
		t.Fatalf("event: %v", ev)
	}
	// Neither TLS nor HTTP on a served port.
	e.redirect(t, "api.github.com", 443)
	c, err = net.Dial("tcp", e.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte("SSH-2.0-OpenSSH_9.6\r\n"))
	if err := read(c); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("SSH: %v", err)
	}
	c.Close()
	ev = e.event(t, phase("connect"))
	if !strings.HasPrefix(ev["reason"].(string), "not TLS or HTTP") || ev["mode"] != "transparent" || ev["port"] != float64(443) {
		t.Fatalf("event: %v", ev)
	}
	// Not redirected at all (the listener's own address).
	e.dst.Store(netip.MustParseAddrPort(e.ln.Addr().String()))
	c, err = net.Dial("tcp", e.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if err := read(c); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("not redirected: %v", err)
	}
	c.Close()
	if ev := e.event(t, phase("connect")); !strings.HasPrefix(ev["reason"].(string), "not redirected") {
		t.Fatalf("event: %v", ev)
	}
	if n := len(e.pol.modes()); n != 0 {
		t.Fatalf("the policy was asked %d times", n)
	}
}

// A connection redirected from the explicit proxy's own address (rules that redirect that
// port too) is served by the explicit proxy: its clients keep working, as explicit ones. A
// proxy on the wildcard address owns its port on every local address.
func TestTransparentHandsExplicitProxyConnections(t *testing.T) {
	t.Run("its address", func(t *testing.T) { testHandsExplicitProxy(t, false) })
	t.Run("wildcard", func(t *testing.T) { testHandsExplicitProxy(t, true) })
}

// wildcardListener reports the wildcard address with its port (as a listener on
// 0.0.0.0:PORT does) while listening on loopback only.
type wildcardListener struct{ net.Listener }

func (l wildcardListener) Addr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4zero, Port: l.Listener.Addr().(*net.TCPAddr).Port}
}

func testHandsExplicitProxy(t *testing.T, wildcard bool) {
	e := newTransparentEnv(t)
	var proxyLn net.Listener
	proxyLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dst := netip.MustParseAddrPort(proxyLn.Addr().String())
	if wildcard {
		proxyLn = wildcardListener{proxyLn}
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- e.b.Serve(ctx, proxyLn, time.Second) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	e.dst.Store(dst)
	proxyURL, _ := url.Parse("http://dev-agent:test-token@" + dst.String())
	c := &http.Client{Transport: &http.Transport{
		Proxy: http.ProxyURL(proxyURL),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", e.ln.Addr().String()) // "redirected"
		},
		TLSClientConfig: &tls.Config{RootCAs: e.roots},
	}, Timeout: 10 * time.Second}
	for e.b.explicit.Load() == nil { // Serve has not taken its listener yet
		runtime.Gosched()
	}
	resp, err := c.Get("https://api.github.com/user")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), redacted) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if ev := e.event(t, phase("request")); ev["mode"] != "explicit" || ev["decision"] != "allow" {
		t.Fatalf("event: %v", ev)
	}
}

// intercept: false pipes the connection, bytes untouched (the peeked ones first), to the
// host the policy decided on, dialled by name.
func TestTransparentOpaque(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "opaque "+r.Host+" "+r.Header.Get("Authorization"))
	}))
	defer up.Close()
	port := up.Listener.Addr().(*net.TCPAddr).Port
	e := newTransparentEnv(t, func(cfg *config.Config) {
		cfg.Transparent.Ports = []int{80, 443, port}
		cfg.Upstream.AllowPrivate = []string{"127.0.0.1/32", "::1/128"}
	})
	e.redirect(t, "localhost", uint16(port))
	c := e.client()
	resp, err := c.Get(fmt.Sprintf("http://localhost:%d/x", port))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != fmt.Sprintf("opaque localhost:%d ", port) {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	c.CloseIdleConnections() // the tunnel's event is written when it ends
	if ev := e.event(t, phase("connect")); ev["decision"] != "allow" || ev["mode"] != "transparent" || ev["bytes_in"].(float64) == 0 {
		t.Fatalf("event: %v", ev)
	}
}

// A source address no agent has is refused before anything is read.
func TestTransparentNoAgent(t *testing.T) {
	e := newTransparentEnv(t, func(cfg *config.Config) { cfg.Agents[0].Addresses = []string{"127.0.0.2/32"} })
	e.redirect(t, "api.github.com", 443)
	if _, err := e.client().Get("https://api.github.com/user"); err == nil {
		t.Fatal("served without an agent")
	}
	ev := e.event(t, phase("connect"))
	if ev["reason"] != "no agent is configured with source address 127.0.0.1" || ev["agent"] != "" || ev["mode"] != "transparent" {
		t.Fatalf("event: %v", ev)
	}
	if n := len(e.pol.modes()); n != 0 {
		t.Fatalf("the policy was asked %d times", n)
	}
}

// gatedUpstream holds each response until release is closed.
type gatedUpstream struct {
	echoUpstream
	arrived chan struct{}
	release chan struct{}
}

func (u *gatedUpstream) RoundTrip(r *http.Request, p upstream.Pool) (*http.Response, error) {
	u.arrived <- struct{}{}
	<-u.release
	return u.echoUpstream.RoundTrip(r, p)
}

// On shutdown the transparent listener stops accepting, and a request in flight in one of its
// tunnels is answered before Serve returns: they drain with the explicit proxy's.
func TestTransparentDrains(t *testing.T) {
	e := newTransparentEnv(t)
	up := &gatedUpstream{arrived: make(chan struct{}, 1), release: make(chan struct{})}
	e.b.setTransport(up)
	e.redirect(t, "api.github.com", 443)
	proxyLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- e.b.Serve(ctx, proxyLn, 10*time.Second) }()
	// ServeTransparent under the same ctx: the env's own runs under another, so a second
	// listener is served here.
	tln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tdone := make(chan error, 1)
	go func() { tdone <- e.b.ServeTransparent(ctx, tln) }()
	c := e.client()
	c.Transport.(*http.Transport).DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", tln.Addr().String())
	}
	type result struct {
		status int
		err    error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := c.Get("https://api.github.com/user")
		if err != nil {
			got <- result{err: err}
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got <- result{status: resp.StatusCode}
	}()
	<-up.arrived // the request is in the pipeline
	cancel()
	if err := <-tdone; err != nil {
		t.Fatalf("ServeTransparent: %v", err)
	}
	if c, err := net.Dial("tcp", tln.Addr().String()); err == nil {
		c.Close()
		t.Fatal("the transparent listener still accepts after shutdown")
	}
	select {
	case err := <-served:
		t.Fatalf("Serve returned with a request in flight: %v", err)
	default:
	}
	close(up.release)
	if r := <-got; r.err != nil || r.status != 200 {
		t.Fatalf("the request in flight: %d %v", r.status, r.err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}
