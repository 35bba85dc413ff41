package broker

import (
	"context"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/capbroker/capbroker/broker/policy"
)

// BenchmarkConnect is a pair: a CONNECT read by the front, as the explicit listener reads a
// connection's first request, and the same CONNECT read by net/http's server with goproxy, as
// the listener read it before (and still reads one sent after another request on a
// connection). Each iteration dials, sends the CONNECT, reads the 200 and closes; the client's
// share, the decision and the tunnel's start are the same in both, so the difference is the
// servers'. Run with -count for adjacent pairs; the allocations per CONNECT do not depend on
// the machine's load.
func BenchmarkConnect(b *testing.B) {
	cfg := testConfig(b)
	cfg.Proxy.MaxConnections, cfg.Proxy.MaxConnectionsPerAgent = 1<<20, 1<<20
	br, _ := testBroker(b, cfg, Deps{Policy: interceptAll{}, Secrets: benchSecrets{}}, &echoUpstream{}, "api.github.com")
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		return ln
	}
	front, old := listen(), listen()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { _ = br.Serve(ctx, front, time.Second); close(served) }()
	srv := &http.Server{Handler: br.proxy, ReadHeaderTimeout: readHeaderTimeout, MaxHeaderBytes: maxHeaderBytes, ConnContext: withAdmitted}
	go func() { _ = srv.Serve(admittingListener{Listener: old, a: br.admission}) }()
	b.Cleanup(func() { cancel(); <-served; _ = srv.Close() })

	req := "CONNECT api.github.com:443 HTTP/1.1\r\nHost: api.github.com:443\r\nProxy-Authorization: Basic " +
		base64.StdEncoding.EncodeToString([]byte("dev-agent:test-token")) + "\r\n\r\n"
	for _, p := range []struct {
		name string
		addr string
	}{{"front", front.Addr().String()}, {"net-http", old.Addr().String()}} {
		b.Run(p.name, func(b *testing.B) {
			b.ReportAllocs()
			buf := make([]byte, 64)
			cpu0 := processCPU()
			for b.Loop() {
				c, err := net.Dial("tcp", p.addr)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.WriteString(c, req); err != nil {
					b.Fatal(err)
				}
				if n, err := io.ReadAtLeast(c, buf, 12); err != nil || string(buf[:12]) != "HTTP/1.1 200" {
					b.Fatalf("CONNECT: %q %v", buf[:n], err)
				}
				c.Close()
			}
			// The process's CPU time (the client's and the broker's): unlike the wall time,
			// what other processes take of the machine does not count.
			b.ReportMetric(float64(processCPU()-cpu0)/1e3/float64(b.N), "cpu-µs/op")
		})
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// interceptAll allows and intercepts every tunnel.
type interceptAll struct{}

func (interceptAll) Decide(context.Context, *policy.Input) (policy.Decision, error) {
	return policy.Decision{Allow: true, Intercept: true, Revision: "t"}, nil
}
