package upstream

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/capbroker/capbroker/internal/testpki"
)

// tls_inspected is what happened on the connection, not what is configured: true only when
// the origin's certificate, reached through a proxy, verified through the TLS-inspection CA
// alone; false for an origin whose own certificate verified, over HTTP/1.1 and HTTP/2 alike.
func TestInspectedOnlyWhenVerifiedThroughTheInspectionCA(t *testing.T) {
	origins := testpki.New(t, "origins CA")
	inspection := testpki.New(t, "inspection CA")
	serve := func(pki *testpki.PKI, h2 bool) string {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(r.Proto))
		}))
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{pki.Server(t, time.Now().Add(time.Hour), "127.0.0.1")}}
		srv.EnableHTTP2 = h2
		srv.StartTLS()
		t.Cleanup(srv.Close)
		return srv.URL
	}
	proxy := newConnectProxy(t)
	u, _ := url.Parse("http://" + proxy.ln.Addr().String())
	c, _, err := New(Options{
		CAFile:       origins.File,
		AllowPrivate: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Proxy:        &ProxyOptions{Proxies: []ProxyServer{{Name: "corp", URL: u}}, InspectionCAFile: inspection.File},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseIdleConnections()
	for name, tc := range map[string]struct {
		pki       *testpki.PKI
		h2        bool
		inspected bool
	}{
		"own certificate, HTTP/1.1":   {origins, false, false},
		"own certificate, HTTP/2":     {origins, true, false},
		"re-signed by the proxy, 1.1": {inspection, false, true},
		"re-signed by the proxy, h2":  {inspection, true, true},
	} {
		t.Run(name, func(t *testing.T) {
			target := serve(tc.pki, tc.h2)
			for range 2 { // a new connection, then a reused one
				r := &Route{}
				req := request(t, http.MethodGet, target+"/", nil)
				req = req.WithContext(WithRoute(req.Context(), r))
				if code, _ := do(t, c, req); code != http.StatusOK {
					t.Fatalf("status %d", code)
				}
				if r.Via() != "corp" || r.Inspected() != tc.inspected {
					t.Fatalf("via %q inspected %v, want corp %v", r.Via(), r.Inspected(), tc.inspected)
				}
			}
		})
	}
}

// A kept-alive connection through a proxy gets the liveness peek a direct one gets: when the
// origin has closed it (and the proxy the tunnel), the pool does not hand it out, and a
// request that cannot be replayed goes over a new connection instead of failing.
func TestProxiedConnectionLiveness(t *testing.T) {
	origins := testpki.New(t, "origins CA")
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte("ok"))
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{origins.Server(t, time.Now().Add(time.Hour), "127.0.0.1")}}
	idle := make(chan net.Conn, 4)
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateIdle {
			idle <- c
		}
	}
	srv.StartTLS()
	defer srv.Close()
	proxy := newConnectProxy(t)
	u, _ := url.Parse("http://" + proxy.ln.Addr().String())
	c, _, err := New(Options{
		CAFile:       origins.File,
		AllowPrivate: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Proxy:        &ProxyOptions{Proxies: []ProxyServer{{Name: "corp", URL: u}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseIdleConnections()
	mustGet(t, c, srv.URL+"/", "ok")
	(<-idle).Close() // as an idle timeout would, once the connection is back in the pool
	<-proxy.closed   // and the proxy has closed the tunnel
	// A body that cannot be read twice: on a stale connection, the request would fail.
	req := request(t, http.MethodPost, srv.URL+"/", io.NopCloser(strings.NewReader("once")))
	req.ContentLength = 4
	if code, body := do(t, c, req); code != http.StatusOK || body != "ok" {
		t.Fatalf("POST after the origin closed: %d %q", code, body)
	}
	if n := len(proxy.asked()); n != 2 {
		t.Fatalf("the proxy was asked for %d tunnels, want 2", n)
	}
}
