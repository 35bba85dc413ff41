//go:build pprof

package main

import (
	"fmt"
	"net"
	"net/http"
	_ "net/http/pprof" // registers /debug/pprof on http.DefaultServeMux
	"os"
	"runtime"
	"strconv"
)

// A binary built with -tags pprof serves net/http/pprof on CAPBROKER_PPROF (a loopback
// address such as 127.0.0.1:6060), for profiling the broker under the bench's load: see
// docs/benchmarks.md. The default build has no such listener. With CAPBROKER_PPROF_ALLOCS
// set too, every allocation is recorded.
func init() {
	addr := os.Getenv("CAPBROKER_PPROF")
	if addr == "" {
		return
	}
	// Every allocation sampled: the bench's question is how many a request makes, not
	// only where most of the bytes go. It slows the broker; profile CPU without it.
	if os.Getenv("CAPBROKER_PPROF_ALLOCS") != "" {
		runtime.MemProfileRate = 1
	}
	ln, err := listenFrom(addr, 10)
	if err != nil {
		fmt.Fprintln(os.Stderr, "CAPBROKER_PPROF:", err)
		return
	}
	fmt.Fprintln(os.Stderr, "pprof on", ln.Addr())
	go func() { _ = http.Serve(ln, nil) }()
}

// listenFrom listens on addr or, when its port is taken, on the first free one of the next n:
// the bench starts its brokers in turn (the bare one first, then the full one), each with
// the same environment.
func listenFrom(addr string, n int) (net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, err
	}
	for i := 0; ; i++ {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p+i)))
		if err == nil || i == n || p == 0 {
			return ln, err
		}
	}
}
