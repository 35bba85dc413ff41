package broker

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"
)

// BenchmarkTunnelRequest times one request and its response on an HTTP/1.1 tunnel served by
// net/http through a parkingConn, over loopback TCP (no TLS, no pipeline: a handler that
// answers at once), and reports the process's CPU time per request: what net/http's
// per-request work on a tunnel costs (its background read, its read deadlines).
func BenchmarkTunnelRequest(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	agent, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer agent.Close()
	conn := <-accepted
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "2")
			io.WriteString(w, "ok")
		}),
		ReadHeaderTimeout: readHeaderTimeout, IdleTimeout: idleTimeout,
		ErrorLog: discardLog, TLSNextProto: noNextProto,
	}
	pc := newParkingConn(conn, srv, parkAfter, func() {})
	go pc.serve()
	defer srv.Close()
	br := bufio.NewReader(agent)
	req := []byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	cpu := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	b.ReportAllocs()
	c0 := cpu()
	for b.Loop() {
		if _, err := agent.Write(req); err != nil {
			b.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	b.ReportMetric(float64((cpu()-c0).Nanoseconds())/float64(b.N)/1000, "cpu-µs/op")
}
