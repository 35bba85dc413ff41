//go:build pprof

package main

import (
	"fmt"
	"net"
	"net/http"
	_ "net/http/pprof" // registers /debug/pprof on http.DefaultServeMux
	"os"
	"runtime"
)

// A binary built with -tags pprof serves net/http/pprof on CAPBROKER_PPROF (a loopback
// address such as 127.0.0.1:6060), for profiling the broker under the bench's load: see
// docs/development.md. The default build has no such listener. With CAPBROKER_PPROF_ALLOCS
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
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "CAPBROKER_PPROF:", err)
		return
	}
	fmt.Fprintln(os.Stderr, "pprof on", ln.Addr())
	go func() { _ = http.Serve(ln, nil) }()
}
