package upstream

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The tests below are about which requests may share a connection: never two pools, and never
// after an exchange whose framing the client cannot vouch for.

// ignoringServer is a raw HTTP/1.1 server that, like Python's http.server, never reads a
// request body unless the path is /read: a body it ignores is read as the next request. It
// answers each request with "path=<path>" and records what it parsed, on which connection.
type ignoringServer struct {
	*rawServer
	mu   sync.Mutex
	seen []seenRequest
}

type seenRequest struct {
	conn  int32  // the connection's number, from 1
	line  string // method and path
	close bool   // the request asked to close the connection
}

func newIgnoringServer(t *testing.T) *ignoringServer {
	t.Helper()
	s := &ignoringServer{}
	var conns atomic.Int32
	s.rawServer = newRawServer(t, true, func(conn net.Conn) {
		id := conns.Add(1)
		br := bufio.NewReader(conn)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.seen = append(s.seen, seenRequest{id, req.Method + " " + req.URL.Path, req.Close})
			s.mu.Unlock()
			status, body := "200 OK", "path="+req.URL.Path
			switch req.URL.Path {
			case "/read":
				_, _ = io.Copy(io.Discard, req.Body)
			case "/refuse":
				status = "404 Not Found"
			}
			resp := fmt.Sprintf("HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s", status, len(body), body)
			if _, err := io.WriteString(conn, resp); err != nil {
				return
			}
			if req.Close {
				return
			}
		}
	})
	return s
}

func (s *ignoringServer) requests() []seenRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seenRequest(nil), s.seen...)
}

// A connection whose request framing the client cannot vouch for is not reused; a request
// whose body the upstream may read as a next request is sent with Connection: close.
func TestClientNeverReusesUnvouchedFraming(t *testing.T) {
	const hidden = "GET /smuggled HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
	for name, tc := range map[string]struct {
		method, path string
		body         io.Reader
		header       http.Header
		length       int64 // ContentLength, when not the one NewRequest sets
		reused       bool  // the next request goes over the same connection
		close        bool  // the request was sent with Connection: close
	}{
		"GET":                          {method: "GET", path: "/x", reused: true},
		"POST with a body it reads":    {method: "POST", path: "/read", body: strings.NewReader("body"), reused: true},
		"GET with a body":              {method: "GET", path: "/x", body: strings.NewReader(hidden), close: true},
		"GET with a chunked body":      {method: "GET", path: "/x", body: io.NopCloser(strings.NewReader(hidden)), length: -1, close: true},
		"GET with a Body of length 0":  {method: "GET", path: "/x", body: io.NopCloser(strings.NewReader(hidden)), reused: true}, // none is sent
		"HEAD with a body":             {method: "HEAD", path: "/x", body: strings.NewReader(hidden), close: true},
		"DELETE with a body":           {method: "DELETE", path: "/x", body: strings.NewReader(hidden), close: true},
		"OPTIONS with a body":          {method: "OPTIONS", path: "/x", body: strings.NewReader(hidden), close: true},
		"OPTIONS with a typed body":    {method: "OPTIONS", path: "/x", body: strings.NewReader(hidden), header: http.Header{"Content-Type": {"text/plain"}}, close: true},
		"TRACE with a body":            {method: "TRACE", path: "/x", body: strings.NewReader(hidden), close: true},
		"Expect: 100-continue":         {method: "POST", path: "/x", body: strings.NewReader(hidden), header: http.Header{"Expect": {"100-continue"}}, close: true},
		"a refusal of a body":          {method: "POST", path: "/refuse", body: strings.NewReader(hidden)},
		"an upgrade that did not take": {method: "GET", path: "/x", header: http.Header{"Connection": {"Upgrade"}, "Upgrade": {"foo"}}},
	} {
		t.Run(name, func(t *testing.T) {
			srv := newIgnoringServer(t)
			c := newClient(t, srv.cert)
			req := request(t, tc.method, srv.URL+tc.path, tc.body)
			for k, v := range tc.header {
				req.Header[k] = v
			}
			if tc.length != 0 {
				req.ContentLength = tc.length // as net/http's server sets it for a chunked body
			}
			resp, err := c.RoundTrip(req, testPool)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			mustGet(t, c, srv.URL+"/after", "path=/after")

			seen := srv.requests()
			first, after := seen[0], seen[len(seen)-1]
			if first.line != tc.method+" "+tc.path || after.line != "GET /after" {
				t.Fatalf("the server saw %v", seen)
			}
			if first.close != tc.close {
				t.Errorf("Connection: close sent = %v, want %v", first.close, tc.close)
			}
			if reused := after.conn == first.conn; reused != tc.reused {
				t.Errorf("the next request reused the connection = %v, want %v (server saw %v)", reused, tc.reused, seen)
			}
			// Only a refusal, which comes after the body was sent, leaves the server free to
			// read the body as a request: the connection is closed after it.
			for _, r := range seen {
				if r.line == "GET /smuggled" && (tc.close || tc.reused) {
					t.Errorf("the server read a body as a request: %v", seen)
				}
			}
		})
	}
}

// heldConn sends what is written to it when flushed, while hold is set: TLS records written
// in a row then leave in one write, and arrive together.
type heldConn struct {
	net.Conn
	hold bool
	buf  []byte
}

func (h *heldConn) Write(p []byte) (int, error) {
	if h.hold {
		h.buf = append(h.buf, p...)
		return len(p), nil
	}
	return h.Conn.Write(p)
}

func (h *heldConn) flush() error {
	h.hold = false
	_, err := h.Conn.Write(h.buf)
	h.buf = nil
	return err
}

// A response followed at once by bytes that answer no request (here a second response, in a
// TLS record of its own) leaves those bytes in the tls.Conn's buffer, where neither the
// bufio.Reader nor a peek at the socket sees them: the connection must not be reused.
func TestClientStaleTLSRecord(t *testing.T) {
	hs := httptest.NewUnstartedServer(http.NotFoundHandler()) // for its certificate
	hs.StartTLS()
	hs.Close()
	var conns atomic.Int32
	srv := newRawServer(t, false, func(conn net.Conn) {
		conns.Add(1)
		hc := &heldConn{Conn: conn}
		tc := tls.Server(hc, &tls.Config{Certificates: hs.TLS.Certificates, NextProtos: []string{"http/1.1"}})
		br := bufio.NewReader(tc)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			hc.hold = true
			fmt.Fprintf(tc, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\npath=%s", len("path=")+len(req.URL.Path), req.URL.Path)
			if req.URL.Path == "/extra" {
				io.WriteString(tc, "HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\npath=/stale")
			}
			if hc.flush() != nil {
				return
			}
		}
	})
	c := newClient(t, hs.Certificate())
	url := strings.Replace(srv.URL, "http://", "https://", 1)
	mustGet(t, c, url+"/extra", "path=/extra")
	mustGet(t, c, url+"/after", "path=/after")
	if n := conns.Load(); n != 2 {
		t.Fatalf("server accepted %d connections, want 2", n)
	}
}

// getIn runs a GET for url in pool and returns the response body.
func getIn(t *testing.T, c *Client, pool Pool, url string) string {
	t.Helper()
	resp, err := c.RoundTrip(request(t, http.MethodGet, url, nil), pool)
	if err != nil {
		t.Fatalf("GET %s in %q: %v", url, pool, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Two pools never share a connection, over HTTP/1.1 (plain and TLS) and HTTP/2; each reuses
// its own.
func TestClientPoolsNeverShare(t *testing.T) {
	remote := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.RemoteAddr) // the client's port names the connection
	})
	for _, tc := range []struct {
		name       string
		useTLS, h2 bool
	}{{"http", false, false}, {"https", true, false}, {"h2", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			srv, ct := newServer(t, remote, tc.useTLS, tc.h2)
			c := clientFor(t, srv)
			a1, b1 := getIn(t, c, "agent-a", srv.URL), getIn(t, c, "agent-b", srv.URL)
			a2, b2 := getIn(t, c, "agent-a", srv.URL), getIn(t, c, "agent-b", srv.URL)
			c1 := getIn(t, c, "agent-a\x00github", srv.URL)
			if a1 == b1 || a1 == c1 || b1 == c1 {
				t.Fatalf("pools shared a connection: agent-a %s, agent-b %s, agent-a with github %s", a1, b1, c1)
			}
			if a1 != a2 || b1 != b2 {
				t.Fatalf("a pool did not reuse its connection: agent-a %s then %s, agent-b %s then %s", a1, a2, b1, b2)
			}
			ct.wantOpened(t, 3)
		})
	}
}

// A connection dialled before any request (Prepare's) belongs to no pool: the first request,
// of any pool, claims it; it is then that pool's alone.
func TestClientPreparedClaimedOnce(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			srv, ct := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, r.RemoteAddr)
			}), true, h2)
			c := clientFor(t, srv)
			addr := srv.Listener.Addr().String()
			c.Prepare(addr, false)
			if done, ok := c.preparing.Load(origin{https: true, addr: addr}); ok { // else the dial is over already
				within(t, done.(chan struct{}), "the prepared dial")
			}
			ct.wantOpened(t, 1)
			b1 := getIn(t, c, "agent-b", srv.URL)
			ct.wantOpened(t, 1) // agent-b claimed the prepared connection
			a1 := getIn(t, c, "agent-a", srv.URL)
			ct.wantOpened(t, 2) // not agent-b's
			if b2 := getIn(t, c, "agent-b", srv.URL); a1 == b1 || b1 != b2 {
				t.Fatalf("agent-b %s then %s, agent-a %s", b1, b2, a1)
			}
			ct.wantOpened(t, 2)
		})
	}
}

// eventually waits for cond, polling: for state the client changes on a goroutine of its own
// (an HTTP/2 connection's state hook).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(guard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
	}
}

func (c *Client) h2Pools() (pools, idle int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.h2conns), c.nidle
}

// An HTTP/2 connection that closes, on its idle timeout or the server's close, leaves the
// pool, and the pool's entry goes with its last connection: many agents do not leave entries
// behind.
func TestClientH2PoolEntryLeavesWithItsConnection(t *testing.T) {
	for _, serverCloses := range []bool{false, true} {
		t.Run(fmt.Sprintf("server closes=%v", serverCloses), func(t *testing.T) {
			srv, ct := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, r.Proto)
			}), true, true)
			c := clientFor(t, srv)
			if !serverCloses {
				c.h2.IdleConnTimeout = 50 * time.Millisecond
			}
			for i := range 3 {
				if got := getIn(t, c, Pool(fmt.Sprintf("agent-%d", i)), srv.URL); got != "HTTP/2.0" {
					t.Fatalf("response %q over HTTP/2", got)
				}
			}
			ct.wantOpened(t, 3) // one connection, so one pool entry, per agent
			if serverCloses {
				// With no idle timeout, all three are still pooled.
				if pools, idle := c.h2Pools(); pools != 3 {
					t.Fatalf("%d pools (%d idle connections), want 3", pools, idle)
				}
				srv.CloseClientConnections()
			}
			for range 3 {
				within(t, ct.closed, "the connections to be closed")
			}
			eventually(t, "the pools to empty", func() bool {
				pools, idle := c.h2Pools()
				return pools == 0 && idle == 0
			})
		})
	}
}

// Idle HTTP/2 connections count against maxIdle with the HTTP/1.1 ones: one over it is closed.
func TestClientH2IdleLimit(t *testing.T) {
	srv, ct := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.RemoteAddr)
	}), true, true)
	c := clientFor(t, srv)
	c.maxIdle = 1
	a := getIn(t, c, "agent-a", srv.URL)
	eventually(t, "agent-a's connection to be idle", func() bool { _, idle := c.h2Pools(); return idle == 1 })
	getIn(t, c, "agent-b", srv.URL)
	within(t, ct.closed, "agent-b's connection, over the limit, to be closed")
	if pools, idle := c.h2Pools(); pools != 1 || idle != 1 {
		t.Fatalf("%d pools and %d idle connections, want agent-a's one", pools, idle)
	}
	if again := getIn(t, c, "agent-a", srv.URL); again != a {
		t.Fatalf("agent-a's connection was not kept: %s then %s", a, again)
	}
	ct.wantOpened(t, 2)
}
