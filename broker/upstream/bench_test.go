package upstream

import (
	"io"
	"net/http"
	"testing"
)

// BenchmarkClient times one kept-alive exchange (a GET with a small response, read to its
// end) through Client against a loopback server: the pool's take and put, the liveness peek
// on every take, writing the request and reading the response. Most of the time is the
// server's and the loopback's; what the pool itself adds shows in the differences.
func BenchmarkClient(b *testing.B) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"ok":true}`)
	})
	for _, scheme := range []string{"http", "https"} {
		b.Run(scheme, func(b *testing.B) {
			srv, _ := newServer(b, h, scheme == "https", false)
			c := clientFor(b, srv)
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
				resp, err := c.RoundTrip(req, testPool)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.Copy(io.Discard, resp.Body); err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
			}
		})
	}
}

// BenchmarkAlive times the check of a connection taken from the pool alone (the probe of the
// tls.Conn and the peek at the socket), on a quiet kept-alive TLS connection.
func BenchmarkAlive(b *testing.B) {
	srv, _ := newServer(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), true, false)
	c := clientFor(b, srv)
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
	resp, err := c.RoundTrip(req, testPool)
	if err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	pc := c.take(keyOf(b, srv.URL))
	if pc == nil {
		b.Fatal("no pooled connection")
	}
	defer pc.close()
	for b.Loop() {
		if !pc.alive() {
			b.Fatal("the connection reads as closed")
		}
	}
}
