package integration

// The agent as adversary: each test attacks one class of weakness and asserts both what the
// agent gets back and that the upstream saw nothing it should not.

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// rawTunnel opens an intercepted tunnel to the upstream and returns the TLS conn (SNI as given).
func (e *env) rawTunnel(t *testing.T, sni string) *tls.Conn {
	t.Helper()
	hostport := e.up.Listener.Addr().String()
	raw, err := net.Dial("tcp", e.broker.proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	auth := base64.StdEncoding.EncodeToString([]byte(agentID + ":" + e.token))
	fmt.Fprintf(raw, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", hostport, hostport, auth)
	resp, err := http.ReadResponse(bufio.NewReader(raw), &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	pool := x509.NewCertPool()
	pem, _ := os.ReadFile(e.broker.caFile)
	pool.AppendCertsFromPEM(pem)
	// The agent controls its TLS client: it may name any server and skip verification.
	conn := tls.Client(raw, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
	if err := conn.Handshake(); err != nil {
		t.Fatal(err)
	}
	return conn
}

// exchangeRaw writes raw request bytes into conn and reads one response; it also reports
// whether the broker then closed the connection.
func exchangeRaw(t *testing.T, conn net.Conn, raw string) (*http.Response, bool) {
	t.Helper()
	_ = conn.SetDeadline(time.Now().Add(waitTimeout))
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading response: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// A broker that keeps the connection open after a framing error fails here, after a
	// bounded wait for the close that should come at once.
	_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	_, err = br.ReadByte()
	return resp, err != nil
}

func TestAttackSNIMismatch(t *testing.T) {
	e := newEnv(t, envOpts{})
	conn := e.rawTunnel(t, "evil.example")
	resp, _ := exchangeRaw(t, conn, fmt.Sprintf("GET /api/echo HTTP/1.1\r\nHost: %s\r\n\r\n", e.up.Listener.Addr()))
	if resp.StatusCode != 403 {
		t.Fatalf("SNI naming another host: want 403, got %d", resp.StatusCode)
	}
	if n := len(e.received()); n != 0 {
		t.Fatalf("upstream received %d requests", n)
	}
	e.broker.auditLog.wait(t, `TLS server name \"evil.example\" does not match`)
}

func TestAttackHostMismatch(t *testing.T) {
	e := newEnv(t, envOpts{})
	for name, req := range map[string]string{
		"Host header":       "GET /open/x HTTP/1.1\r\nHost: other.example\r\n\r\n",
		"absolute-form URL": fmt.Sprintf("GET https://other.example/open/x HTTP/1.1\r\nHost: %s\r\n\r\n", e.up.Listener.Addr()),
		"other port":        "GET /open/x HTTP/1.1\r\nHost: 127.0.0.1:1\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			conn := e.rawTunnel(t, "127.0.0.1")
			resp, _ := exchangeRaw(t, conn, req)
			if resp.StatusCode != 403 {
				t.Fatalf("want 403, got %d", resp.StatusCode)
			}
		})
	}
	if n := len(e.received()); n != 0 {
		t.Fatalf("upstream received %d requests", n)
	}
}

// TestAttackRequestSmuggling sends malformed framing inside an intercepted tunnel and to the
// proxy port directly. Each must get 400 and a closed connection; nothing reaches upstream.
func TestAttackRequestSmuggling(t *testing.T) {
	e := newEnv(t, envOpts{})
	host := e.up.Listener.Addr().String()
	attacks := map[string]string{
		"CL and TE":             "POST /open/x HTTP/1.1\r\nHost: H\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"two different CLs":     "POST /open/x HTTP/1.1\r\nHost: H\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcde",
		"duplicate CL":          "POST /open/x HTTP/1.1\r\nHost: H\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\nabcd",
		"bad chunk size":        "POST /open/x HTTP/1.1\r\nHost: H\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
		"TE not chunked":        "POST /open/x HTTP/1.1\r\nHost: H\r\nTransfer-Encoding: gzip\r\n\r\nabc",
		"obs-fold":              "GET /open/x HTTP/1.1\r\nHost: H\r\nX-A: 1\r\n  folded\r\n\r\n",
		"space before colon":    "GET /open/x HTTP/1.1\r\nHost: H\r\nX-A : 1\r\n\r\n",
		"invalid header name":   "GET /open/x HTTP/1.1\r\nHost: H\r\nX(A): 1\r\n\r\n",
		"two Host headers":      "GET /open/x HTTP/1.1\r\nHost: H\r\nHost: other.example\r\n\r\n",
		"bare LF in header":     "GET /open/x HTTP/1.1\r\nHost: H\r\nX-A: 1\nX-B: 2\r\n\r\n",
		"NUL in header value":   "GET /open/x HTTP/1.1\r\nHost: H\r\nX-A: a\x00b\r\n\r\n",
		"negative CL":           "POST /open/x HTTP/1.1\r\nHost: H\r\nContent-Length: -1\r\n\r\n",
		"header too large":      "GET /open/x HTTP/1.1\r\nHost: H\r\nX-A: " + strings.Repeat("a", 70<<10) + "\r\n\r\n",
		"request line too long": "GET /open/" + strings.Repeat("a", 70<<10) + " HTTP/1.1\r\nHost: H\r\n\r\n",
	}
	for name, raw := range attacks {
		t.Run("tunnel/"+name, func(t *testing.T) {
			conn := e.rawTunnel(t, "127.0.0.1")
			resp, closed := exchangeRaw(t, conn, strings.ReplaceAll(raw, "Host: H", "Host: "+host))
			if resp.StatusCode != 400 && resp.StatusCode != 431 {
				t.Fatalf("want 400, got %d", resp.StatusCode)
			}
			if !closed {
				t.Fatal("connection left open after a framing error")
			}
		})
		t.Run("proxy/"+name, func(t *testing.T) {
			conn, err := net.Dial("tcp", e.broker.proxyAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			auth := "Proxy-Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(agentID+":"+e.token)) + "\r\n"
			absolute := strings.Replace(raw, " /open/x ", " http://"+host+"/open/x ", 1)
			absolute = strings.Replace(strings.ReplaceAll(absolute, "Host: H", "Host: "+host), "\r\n", "\r\n"+auth, 1)
			resp, closed := exchangeRaw(t, conn, absolute)
			if resp.StatusCode != 400 && resp.StatusCode != 431 {
				t.Fatalf("want 400, got %d", resp.StatusCode)
			}
			if !closed {
				t.Fatal("connection left open after a framing error")
			}
		})
	}
	if n := len(e.received()); n != 0 {
		t.Fatalf("upstream received %d requests", n)
	}
}

func TestAttackPolicyErrorFailsClosed(t *testing.T) {
	e := newEnv(t, envOpts{})
	out, _ := e.curl("-i", e.url("/broken/x"))
	if !hasStatus(out, 503) || !strings.Contains(out, `"error":"policy_error"`) {
		t.Fatalf("a policy evaluation error must deny with 503 policy_error:\n%s", out)
	}
	if strings.Contains(out, "to_number") {
		t.Fatal("internal policy error text reached the agent")
	}
	if n := len(e.received()); n != 0 {
		t.Fatalf("upstream received %d requests", n)
	}
}

func TestAttackCredentialForUnboundHost(t *testing.T) {
	e := newEnv(t, envOpts{})
	// The policy grants "canary" to any /api/ path; the credential is bound to 127.0.0.1 only.
	plain := httptest.NewServer(e.record(http.HandlerFunc(e.echo)))
	defer plain.Close()
	u := strings.Replace(plain.URL, "127.0.0.1", "localhost", 1) + "/api/echo"
	out, _ := e.curl("-i", u)
	if !hasStatus(out, 403) {
		t.Fatalf("want 403 for a credential granted to a host it is not bound to:\n%s", out)
	}
	if n := len(e.received()); n != 0 {
		t.Fatalf("upstream received %d requests", n)
	}
}

func TestAttackUpstreamTLSFailures(t *testing.T) {
	e := newEnv(t, envOpts{})
	var hits atomic.Int32
	h := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) })
	for name, leaf := range map[string]tls.Certificate{
		"wrong name": e.pki.issue(t, "other.example", time.Now().Add(time.Hour)),
		"expired":    e.pki.issue(t, "127.0.0.1", time.Now().Add(-time.Minute)),
	} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewUnstartedServer(h)
			srv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
			srv.StartTLS()
			defer srv.Close()
			out, _ := e.curl("-i", srv.URL+"/api/echo")
			if !hasStatus(out, 502) || !strings.Contains(out, `"error":"upstream_error"`) {
				t.Fatalf("want 502 upstream_error:\n%s", out)
			}
		})
	}
	if hits.Load() != 0 {
		t.Fatal("an upstream that failed TLS verification received a request (and so the credential)")
	}
}

func TestAttackConnectionCapPerAgent(t *testing.T) {
	e := newEnv(t, envOpts{proxy: "max_connections_per_agent: 2"})
	// Two open tunnels hold the agent's two slots.
	a := e.rawTunnel(t, "127.0.0.1")
	b := e.rawTunnel(t, "127.0.0.1")
	out, _ := e.curl("-o", "/dev/null", "-w", "%{http_connect}", e.url("/open/x"))
	if !strings.HasSuffix(out, "429") {
		t.Fatalf("third connection: want 429, got %q", out)
	}
	a.Close()
	b.Close()
	// Closing the tunnels frees the slots once the broker has seen both closes; each try is a
	// real request, bounded in number.
	for i := 0; ; i++ {
		out, _ = e.curl("-o", "/dev/null", "-w", "%{http_code}", e.url("/open/x"))
		if out == "200" {
			break
		}
		if i == 100 {
			t.Fatalf("slots never freed: %q", out)
		}
	}
}

func TestAttackBrokersOwnListenersRefused(t *testing.T) {
	e := newEnv(t, envOpts{})
	// allow_private covers 127.0.0.1, where the admin and proxy listeners are: still refused.
	for _, addr := range []string{e.broker.adminAddr, e.broker.proxyAddr} {
		out, _ := e.curl("-i", "http://"+addr+"/open/metrics")
		if !hasStatus(out, 403) || !strings.Contains(out, `"error":"denied"`) || strings.Contains(out, "capbroker_requests_total") {
			t.Fatalf("the broker forwarded to its own listener %s:\n%s", addr, out)
		}
	}
}

func TestAttackConnectionListedHeadersDropped(t *testing.T) {
	e := newEnv(t, envOpts{})
	// HTTP/1.1: in HTTP/2 there is no Connection header to list fields in.
	out, err := e.curl("--http1.1", "-H", "Connection: keep-alive, X-Hop", "-H", "X-Hop: drop-me", "-H", "Keep-Alive: 5",
		"-H", "Proxy-Authorization: Basic c2VjcmV0", "-H", "X-Kept: yes", e.url("/open/x"))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	r := e.received()
	if len(r) != 1 {
		t.Fatalf("upstream saw %d requests", len(r))
	}
	for _, h := range []string{"X-Hop", "Keep-Alive", "Proxy-Authorization"} {
		if v := r[0].Header.Get(h); v != "" {
			t.Errorf("%s reached the upstream: %q", h, v)
		}
	}
	if r[0].Header.Get("X-Kept") != "yes" {
		t.Error("an end-to-end header was dropped")
	}
}
