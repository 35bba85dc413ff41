package upstream

import (
	"io"
	"net/http"
	"testing"
)

// protoServer answers every request with its protocol, offering h2 in ALPN.
func protoServer(t *testing.T) (*Client, string, *connTracker) {
	t.Helper()
	srv, ct := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Proto)
	}), true, true)
	return clientFor(t, srv), srv.URL, ct
}

// getHTTP1 is mustGet for a request marked WithHTTP1.
func getHTTP1(t *testing.T, c *Client, url, want string) {
	t.Helper()
	req := request(t, http.MethodGet, url, nil)
	req = req.WithContext(WithHTTP1(req.Context()))
	code, body := do(t, c, req)
	if code != http.StatusOK || body != want {
		t.Fatalf("GET %s (HTTP/1.1 only) = %d %q, want 200 %q", url, code, body, want)
	}
}

// A request marked WithHTTP1 goes over HTTP/1.1 to a host that offers h2, on one kept-alive
// connection, and leaves no h2 state behind; an unmarked one still negotiates h2, and an
// HTTP/1.1 request after it does not take its connection.
func TestClientHTTP1ToH2Host(t *testing.T) {
	c, url, ct := protoServer(t)
	for range 3 {
		getHTTP1(t, c, url+"/", "HTTP/1.1")
	}
	ct.wantOpened(t, 1)
	addr := url[len("https://"):]
	if c.isH2(addr) {
		t.Fatal("an HTTP/1.1-only dial marked the host h2")
	}
	c.handoff.Range(func(k, _ any) bool {
		t.Errorf("HTTP/1.1-only dial handed a connection to %v over to HTTP/2", k)
		return true
	})

	mustGet(t, c, url+"/", "HTTP/2.0")
	ct.wantOpened(t, 2)
	getHTTP1(t, c, url+"/", "HTTP/1.1") // the pooled HTTP/1.1 connection, not the h2 one
	mustGet(t, c, url+"/", "HTTP/2.0")
	ct.wantOpened(t, 2)
}

// Prepare with http1 dials a connection that offers only http/1.1, even to a host known to
// speak h2, and an HTTP/1.1 request claims it; one without http1 dials nothing for such a
// host, as before.
func TestClientPrepareHTTP1(t *testing.T) {
	c, url, ct := protoServer(t)
	addr := url[len("https://"):]
	mustGet(t, c, url+"/", "HTTP/2.0")
	ct.wantOpened(t, 1)
	c.Prepare(addr, false) // h2 host: nothing to prepare
	ct.wantOpened(t, 1)

	prepared := make(chan struct{}, 1)
	c.prepared = func() { prepared <- struct{}{} }
	c.Prepare(addr, true)
	within(t, prepared, "the prepared HTTP/1.1 connection")
	ct.wantOpened(t, 2)
	getHTTP1(t, c, url+"/", "HTTP/1.1")
	ct.wantOpened(t, 2)
}
