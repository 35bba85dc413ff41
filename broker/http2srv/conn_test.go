package http2srv

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// serveTCP serves h on a loopback listener with a Server like the broker's; the client
// speaks HTTP/2 over plain TCP (prior knowledge).
func serveTCP(t *testing.T, h http.Handler) (*http.Client, *sync.WaitGroup) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 30 * time.Second, PingTimeout: 5 * time.Second,
		MaxHeaderBytes: 64 << 10, MaxConcurrentStreams: 100}
	var wg sync.WaitGroup
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go s.NewConn(c, wg.Done).Serve()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	tr := &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, ln.Addr().String())
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}, &wg
}

func TestSmallRequests(t *testing.T) {
	c, _ := serveTCP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Method", r.Method)
		w.Write(append([]byte("got "), b...))
	}))
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.Post("http://x.test/a", "text/plain", strings.NewReader(strings.Repeat("y", i*1000)))
			if err != nil {
				t.Error(err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != "got "+strings.Repeat("y", i*1000) || resp.Header.Get("X-Method") != "POST" || resp.ProtoMajor != 2 {
				t.Errorf("got %d %q %v", len(b), resp.Header, resp.Proto)
			}
		}()
	}
	wg.Wait()
}

func TestLargeBothWays(t *testing.T) {
	c, _ := serveTCP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(w, r.Body)
	}))
	body := bytes.Repeat([]byte("0123456789abcdef"), 300000) // 4.8 MB: beyond every window
	resp, err := c.Post("http://x.test/a", "application/octet-stream", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("echo: %d bytes, %v", len(got), err)
	}
}
