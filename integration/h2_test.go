package integration

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/net/http2"
)

// h2Conn opens an intercepted tunnel that negotiates h2 and returns one HTTP/2 client
// connection over it: every request sent with it is a stream on that one connection.
func (e *env) h2Conn(t *testing.T) *http2.ClientConn {
	t.Helper()
	tc := e.dialTunnel(t, e.up.Listener.Addr().String(), "h2", "http/1.1")
	if p := tc.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("ALPN negotiated %q, want h2", p)
	}
	cc, err := (&http2.Transport{}).NewClientConn(tc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func (e *env) h2Request(t *testing.T, method, path string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, e.url(path), body)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestHTTP2StreamsDecidedOneByOne: two concurrent streams on one HTTP/2 connection are two
// requests, each decided, injected and audited on its own. The allowed one is held open
// upstream until the denied one has been answered, so they really overlap.
func TestHTTP2StreamsDecidedOneByOne(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
		auth := r.Header.Get("Authorization")
		w.Header().Set("X-Echo-Authorization", auth)
		w.Header().Set("Trailer", "X-Echo-Trailer")
		fmt.Fprintf(w, "proto=%s auth=%s", r.Proto, auth)
		w.Header().Set("X-Echo-Trailer", auth)
		w.Header().Set(http.TrailerPrefix+"X-Undeclared-Trailer", "late "+auth)
	})
	e := newEnv(t, envOpts{handler: slow, upstreamH2: true})
	cc := e.h2Conn(t)

	type result struct {
		resp *http.Response
		body string
		err  error
	}
	allowed := make(chan result, 1)
	go func() {
		resp, err := cc.RoundTrip(e.h2Request(t, http.MethodGet, "/api/custom/slow", nil))
		if err != nil {
			allowed <- result{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body) // trailers are set once the body is read to its end
		resp.Body.Close()
		allowed <- result{resp, string(b), err}
	}()
	<-arrived

	denied, err := cc.RoundTrip(e.h2Request(t, http.MethodGet, "/admin/users", nil))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(denied.Body)
	denied.Body.Close()
	if denied.StatusCode != http.StatusForbidden || denied.ProtoMajor != 2 || !strings.Contains(string(body), `"error":"denied"`) {
		t.Fatalf("denied stream: %d %s %s", denied.StatusCode, denied.Proto, body)
	}
	close(release)

	r := <-allowed
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.resp.StatusCode != 200 || r.resp.ProtoMajor != 2 {
		t.Fatalf("allowed stream: %d %s", r.resp.StatusCode, r.resp.Proto)
	}
	if r.body != "proto=HTTP/2.0 auth=Bearer [REDACTED]" {
		t.Errorf("body: %q (want HTTP/2 upstream, scrubbed)", r.body)
	}
	if v := r.resp.Header.Get("X-Echo-Authorization"); v != "Bearer [REDACTED]" {
		t.Errorf("header not scrubbed: %q", v)
	}
	if v := r.resp.Trailer.Get("X-Echo-Trailer"); v != "Bearer [REDACTED]" {
		t.Errorf("declared trailer: %q, want it passed and scrubbed (trailers %v)", v, r.resp.Trailer)
	}
	if v := r.resp.Trailer.Get("X-Undeclared-Trailer"); v != "late Bearer [REDACTED]" {
		t.Errorf("undeclared trailer: %q, want it passed and scrubbed", v)
	}

	got := e.received()
	if len(got) != 1 || got[0].Header.Get("Authorization") != "Bearer "+e.canary || got[0].ProtoMajor != 2 {
		t.Fatalf("upstream should see exactly the allowed request, with the credential, over HTTP/2: %v", got)
	}
	allowEv := e.broker.waitAudit(t, r.resp.Header.Get("X-Broker-Request-Id"))
	denyEv := e.broker.waitAudit(t, denied.Header.Get("X-Broker-Request-Id"))
	if allowEv["decision"] != "allow" || allowEv["status"] != float64(200) || allowEv["path"] != "/api/custom/slow" {
		t.Errorf("allowed stream's audit event: %v", allowEv)
	}
	if creds, _ := allowEv["credentials"].([]any); len(creds) != 1 || creds[0] != "canary" {
		t.Errorf("allowed stream's credentials: %v", allowEv["credentials"])
	}
	if denyEv["decision"] != "deny" || denyEv["status"] != float64(403) || denyEv["path"] != "/admin/users" {
		t.Errorf("denied stream's audit event: %v", denyEv)
	}
	if n := countPhase(e.broker.audit(t), "request"); n != 2 {
		t.Errorf("%d request events, want one per stream (2)", n)
	}
}

func countPhase(evs []auditEvent, phase string) int {
	n := 0
	for _, ev := range evs {
		if ev["phase"] == phase {
			n++
		}
	}
	return n
}

// TestHTTP2TunnelChecks: the tunnel's checks hold per stream. An :authority other than the
// CONNECT host is denied like a Host header would be; a CONNECT stream (a tunnel, or a
// WebSocket by extended CONNECT) is refused; neither reaches the upstream.
func TestHTTP2TunnelChecks(t *testing.T) {
	e := newEnv(t, envOpts{upstreamH2: true})
	cc := e.h2Conn(t)

	other := e.h2Request(t, http.MethodGet, "/open/x", nil)
	other.Host = "other.example"
	connect := e.h2Request(t, http.MethodConnect, "/", nil) // :authority is the tunnel's host

	for name, tc := range map[string]struct {
		req    *http.Request
		status int
	}{
		":authority mismatch": {other, http.StatusForbidden},
		"CONNECT stream":      {connect, http.StatusBadRequest},
	} {
		t.Run(name, func(t *testing.T) {
			resp, err := cc.RoundTrip(tc.req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			ev := e.broker.waitAudit(t, resp.Header.Get("X-Broker-Request-Id"))
			if ev["decision"] != "deny" || ev["status"] != float64(tc.status) {
				t.Errorf("audit event: %v", ev)
			}
		})
	}
	// The connection survives refusals: a following stream is served.
	resp, err := cc.RoundTrip(e.h2Request(t, http.MethodGet, "/open/after", nil))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("stream after the refusals: %d", resp.StatusCode)
	}
	if got := e.received(); len(got) != 1 || got[0].URL.Path != "/open/after" {
		t.Fatalf("upstream received %v", got)
	}
}

// TestHTTP2RequestTrailers: an agent's request trailers are forwarded after the body, except
// one that names a credential-bearing header; "TE: trailers" reaches the upstream.
func TestHTTP2RequestTrailers(t *testing.T) {
	type seen struct {
		body, te string
		trailer  http.Header
	}
	got := make(chan seen, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{string(b), r.Header.Get("Te"), r.Trailer.Clone()}
	})
	e := newEnv(t, envOpts{handler: h, upstreamH2: true})
	cc := e.h2Conn(t)

	req := e.h2Request(t, http.MethodPost, "/api/custom/upload", io.NopCloser(strings.NewReader("payload")))
	req.ContentLength = -1
	req.Header.Set("Te", "trailers")
	req.Trailer = http.Header{"X-Checksum": {"abc123"}, "X-Api-Key": {"agent-made-this-up"}}
	resp, err := cc.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	s := <-got
	if s.body != "payload" || s.te != "trailers" {
		t.Errorf("upstream saw body %q, TE %q", s.body, s.te)
	}
	if s.trailer.Get("X-Checksum") != "abc123" {
		t.Errorf("request trailer not forwarded: %v", s.trailer)
	}
	if _, ok := s.trailer["X-Api-Key"]; ok {
		t.Errorf("a credential-bearing trailer was forwarded: %v", s.trailer)
	}
}

// TestTunnelALPN: the broker offers h2 and http/1.1. Whatever the agent offers, a tunnel that
// did not negotiate h2 is HTTP/1.1 behind the framing guard: an ambiguous message is refused.
func TestTunnelALPN(t *testing.T) {
	e := newEnv(t, envOpts{})
	hostport := e.up.Listener.Addr().String()
	for name, tc := range map[string]struct {
		offer []string
		want  string
	}{
		"none":            {nil, ""},
		"http/1.1":        {[]string{"http/1.1"}, "http/1.1"},
		"h2 and http/1.1": {[]string{"h2", "http/1.1"}, "h2"},
		"unknown and h1":  {[]string{"spdy/3", "http/1.1"}, "http/1.1"},
		"http/1.1 before": {[]string{"http/1.1", "h2"}, "h2"}, // the server's preference decides
		"h2 only":         {[]string{"h2"}, "h2"},
	} {
		t.Run(name, func(t *testing.T) {
			conn := e.dialTunnel(t, hostport, tc.offer...)
			defer conn.Close()
			if got := conn.ConnectionState().NegotiatedProtocol; got != tc.want {
				t.Fatalf("negotiated %q, want %q", got, tc.want)
			}
			if tc.want == "h2" {
				return
			}
			smuggle := "POST /open/x HTTP/1.1\r\nHost: H\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
			if _, err := io.WriteString(conn, smuggle); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil || resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("want 400 from the framing guard: %v %v", resp, err)
			}
		})
	}
	if n := len(e.received()); n != 0 {
		t.Fatalf("upstream received %d requests", n)
	}
}

// TestCurlHTTP2: curl negotiates HTTP/2 with the broker inside the tunnel, and the broker
// speaks HTTP/2 to an upstream that offers it; the credential is injected and scrubbed.
func TestCurlHTTP2(t *testing.T) {
	e := newEnv(t, envOpts{upstreamH2: true})
	out, err := e.curl("-i", "--http2", e.url("/api/echo"))
	if err != nil {
		t.Fatalf("curl: %v\n%s", err, out)
	}
	if !strings.HasPrefix(out, "HTTP/2 200") {
		t.Fatalf("want HTTP/2 to the agent:\n%s", out)
	}
	if headerValue(out, "X-Echo-Authorization") != "Bearer [REDACTED]" || !strings.Contains(out, "auth=Bearer [REDACTED] end") || strings.Contains(out, e.canary) {
		t.Fatalf("response not scrubbed:\n%s", out)
	}
	got := e.received()
	if len(got) != 1 || got[0].ProtoMajor != 2 || got[0].Header.Get("Authorization") != "Bearer "+e.canary {
		t.Fatalf("upstream should see one HTTP/2 request with the credential: %v", got)
	}
	ev := e.broker.waitAudit(t, headerValue(out, "X-Broker-Request-Id"))
	if ev["decision"] != "allow" || ev["status"] != float64(200) {
		t.Errorf("audit event: %v", ev)
	}

	// An HTTP/1.1-only upstream still works for an HTTP/2 agent.
	e1 := newEnv(t, envOpts{})
	out, err = e1.curl("-i", "--http2", e1.url("/open/x"))
	if err != nil || !strings.HasPrefix(out, "HTTP/2 200") {
		t.Fatalf("h2 agent, HTTP/1.1 upstream: %v\n%s", err, out)
	}
	if got := e1.received(); len(got) != 1 || got[0].ProtoMajor != 1 {
		t.Fatalf("upstream: %v", got)
	}
}

// TestCurlHTTP1ToH2Upstream: an agent that speaks HTTP/1.1 in the tunnel reaches an upstream
// that offers h2 over HTTP/1.1 (the protocol the agent spoke), on one upstream connection
// (dialled during the agent's handshake, then kept alive); the credential is injected and
// scrubbed.
func TestCurlHTTP1ToH2Upstream(t *testing.T) {
	var opened atomic.Int32
	e := newEnv(t, envOpts{upstreamH2: true, upstreamConnState: func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			opened.Add(1)
		}
	}})
	out, err := e.curl("-i", "--http1.1", e.url("/api/echo"), e.url("/api/echo"))
	if err != nil {
		t.Fatalf("curl: %v\n%s", err, out)
	}
	if strings.Count(out, "HTTP/1.1 200") != 2 {
		t.Fatalf("want two HTTP/1.1 200 responses to the agent:\n%s", out)
	}
	if strings.Count(out, "auth=Bearer [REDACTED] end") != 2 || strings.Contains(out, e.canary) {
		t.Fatalf("response not scrubbed:\n%s", out)
	}
	got := e.received()
	if len(got) != 2 {
		t.Fatalf("upstream received %d requests, want 2", len(got))
	}
	for _, r := range got {
		if r.ProtoMajor != 1 || r.Header.Get("Authorization") != "Bearer "+e.canary {
			t.Fatalf("upstream should see HTTP/1.1 requests with the credential: %s, credential present %v", r.Proto, r.Header.Get("Authorization") != "")
		}
	}
	if n := opened.Load(); n != 1 {
		t.Fatalf("upstream saw %d connections, want 1", n)
	}
}

// connectDialer returns a dialer that opens a CONNECT tunnel through the broker as the test
// agent and returns the raw tunnel, for clients (gRPC) that do their own TLS over it.
func (e *env) connectDialer() func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		raw, err := d.DialContext(ctx, "tcp", e.broker.proxyAddr)
		if err != nil {
			return nil, err
		}
		auth := base64.StdEncoding.EncodeToString([]byte(agentID + ":" + e.token))
		fmt.Fprintf(raw, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", addr, addr, auth)
		br := bufio.NewReader(raw)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil {
			raw.Close()
			return nil, err
		}
		if resp.StatusCode != 200 {
			raw.Close()
			return nil, fmt.Errorf("CONNECT: %s", resp.Status)
		}
		if br.Buffered() > 0 {
			raw.Close()
			return nil, fmt.Errorf("bytes after the CONNECT response")
		}
		return raw, nil
	}
}

// TestHTTP2TunnelFreesAgentSlot: an HTTP/2 tunnel holds one of the agent's connection slots
// and frees it when it closes. With one slot, each curl can only get through once the broker
// has seen the previous tunnel close; each try is a real request, bounded in number.
func TestHTTP2TunnelFreesAgentSlot(t *testing.T) {
	e := newEnv(t, envOpts{proxy: "max_connections_per_agent: 1"})
	for n := 0; n < 3; n++ {
		for i := 0; ; i++ {
			out, _ := e.curl("--http2", "-o", "/dev/null", "-w", "%{http_code} %{http_version}", e.url("/open/x"))
			if out == "200 2" {
				break
			}
			if i == 100 {
				t.Fatalf("tunnel %d: slot never freed: %q", n+1, out)
			}
		}
	}
}

// TestH2CNotOffered: plain HTTP inside a tunnel stays HTTP/1.1. An HTTP/2 connection preface
// ("prior knowledge" h2c) gets an HTTP/1.1 error and reaches nothing upstream.
func TestH2CNotOffered(t *testing.T) {
	e := newEnv(t, envOpts{})
	conn, err := e.connectDialer()(t.Context(), e.up.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("want an HTTP/1.1 error response: %v", err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 1 || resp.StatusCode < 400 {
		t.Fatalf("h2c preface answered %s %d", resp.Proto, resp.StatusCode)
	}
	if n := len(e.received()); n != 0 {
		t.Fatalf("upstream received %d requests", n)
	}
}
