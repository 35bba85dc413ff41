package upstream

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// The tests below are about which requests may share a connection: never one after an
// exchange whose framing the client cannot vouch for.

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
		reused       bool // the next request goes over the same connection
		close        bool // the request was sent with Connection: close
	}{
		"GET":                          {method: "GET", path: "/x", reused: true},
		"POST with a body it reads":    {method: "POST", path: "/read", body: strings.NewReader("body"), reused: true},
		"GET with a body":              {method: "GET", path: "/x", body: strings.NewReader(hidden), close: true},
		"GET with a chunked body":      {method: "GET", path: "/x", body: io.NopCloser(strings.NewReader(hidden)), close: true},
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
			resp, err := c.RoundTrip(req)
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
			for _, r := range seen {
				if r.line == "GET /smuggled" && tc.close {
					t.Errorf("the server read the body of a request sent with Connection: close as a request: %v", seen)
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
