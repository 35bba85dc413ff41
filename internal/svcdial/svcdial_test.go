package svcdial

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// CloseIdle makes the next request of every transport built dial anew: after a reload that
// changed upstream.proxy, no kept-alive connection that went the old way carries it.
func TestCloseIdleRedials(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	var dials atomic.Int32
	tr := Transport(func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}, nil, 0)
	get := func() {
		resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	get()
	get()
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d dials for two requests, want 1 (kept alive)", n)
	}
	CloseIdle()
	get()
	if n := dials.Load(); n != 2 {
		t.Fatalf("%d dials after CloseIdle, want 2", n)
	}
}
