package broker

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"
)

// BenchmarkTransparent is a pair: the same request (allowed, the credential injected, the
// response scrubbed) through the explicit proxy (CONNECT, intercepted) and through the
// transparent listener (a redirected connection, as netfilter would hand it over; the
// original destination comes from a fake), over loopback with the agent-side TLS, against an
// upstream answering from memory. "conn" opens a connection (and tunnel) per request: the
// listener's own cost (CONNECT round trip or peek, identity, connect decision, handshake);
// "request" reuses one: the per-request cost inside the tunnel. Run with -count to get
// adjacent pairs; compare medians.
func BenchmarkTransparent(b *testing.B) {
	e := newTransparentEnv(b)
	e.redirect(b, "api.github.com", 443)
	proxyLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { _ = e.b.Serve(ctx, proxyLn, time.Second); close(served) }()
	b.Cleanup(func() { cancel(); <-served })
	go func() { // audit events are not looked at here
		for range e.events {
		}
	}()
	proxyURL := &url.URL{Scheme: "http", User: url.UserPassword("dev-agent", "test-token"), Host: proxyLn.Addr().String()}

	for _, mode := range []string{"conn", "request"} {
		for _, path := range []string{"explicit", "transparent"} {
			b.Run(mode+"/"+path, func(b *testing.B) {
				tr := &http.Transport{
					TLSClientConfig:   &tls.Config{RootCAs: e.roots},
					DisableKeepAlives: mode == "conn",
					ForceAttemptHTTP2: false,
					TLSNextProto:      map[string]func(string, *tls.Conn) http.RoundTripper{},
				}
				if path == "explicit" {
					tr.Proxy = http.ProxyURL(proxyURL)
				} else {
					tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
						return (&net.Dialer{}).DialContext(ctx, "tcp", e.ln.Addr().String())
					}
				}
				defer tr.CloseIdleConnections()
				c := &http.Client{Transport: tr}
				b.ReportAllocs()
				for b.Loop() {
					resp, err := c.Get("https://api.github.com/user")
					if err != nil {
						b.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						b.Fatalf("status %d", resp.StatusCode)
					}
				}
			})
		}
	}
}
