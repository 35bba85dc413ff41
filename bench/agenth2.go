package main

// Clients that speak HTTP/2 to the broker (issue 40): curl by default, browsers, Go, gRPC. The
// same path (the bare intercepted one, and the full pipeline) is measured with a client that
// speaks HTTP/1.1 to the broker and one that speaks h2, in adjacent slices, to the HTTP/1.1
// upstream: the upstream leg is HTTP/1.1 either way, so what differs is the agent's leg alone.
//
// The HTTP/1.1 client uses 32 connections, one request on each at a time. The h2 client is
// Go's Transport offering h2, which is what Go programs, gRPC and browsers do with one origin:
// one connection, the 32 requests multiplexed on it as streams.

import (
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"
)

// agentH2Pair is one path's figures with an HTTP/1.1 client and an h2 client, slice by slice.
type agentH2Pair struct {
	Path string `json:"path"`
	// H1CPUUS and H2CPUUS are the broker's CPU microseconds per request with each client;
	// CPUH2OverH1 is the h2 client's over the HTTP/1.1 client's, pair by pair (the target).
	H1CPUUS     spread `json:"h1_cpu_us"`
	H2CPUUS     spread `json:"h2_cpu_us"`
	CPUH2OverH1 spread `json:"cpu_h2_over_h1"`
	// H1RPS and H2RPS are requests per second; RPSH2OverH1 their ratio, pair by pair.
	H1RPS       spread `json:"h1_rps"`
	H2RPS       spread `json:"h2_rps"`
	RPSH2OverH1 spread `json:"rps_h2_over_h1"`
	Pairs       int    `json:"pairs"` // of CPU figures

	cpuRatios []float64
}

// agentH2Result is the JSON summary's agent_h2: each path with both clients, paired.
type agentH2Result struct {
	Conns   int           `json:"conns"`
	SliceMS int64         `json:"slice_ms"`
	Rounds  int           `json:"rounds"`
	Paths   []agentH2Pair `json:"paths"`
}

// h2Client returns a path like pa whose client speaks h2 to the broker.
func h2Client(pa *path) *path {
	return &path{name: pa.name + "-agent-h2", url: pa.url, via: pa.via, proc: pa.proc, h2: true}
}

// measureAgentH2 measures each of paths with an HTTP/1.1 client and with an h2 client in
// rounds of adjacent slices of d at conns concurrent requests, the HTTP/1.1 slice first in one
// round and the h2 one first in the next (adjacentSlices).
func measureAgentH2(ctx context.Context, p *pki, paths []*path, conns, rounds int, d time.Duration) (*agentH2Result, error) {
	fmt.Fprintln(stderr, "HTTP/1.1 client against h2 client, paired...")
	r := &agentH2Result{Conns: conns, SliceMS: d.Milliseconds(), Rounds: rounds}
	for _, h1 := range paths {
		h2 := h2Client(h1)
		h1.client, h2.client = h1.withConns(p, conns), h2.withConns(p, conns)
		if proto, err := h2.proto(ctx); err != nil || proto != "HTTP/2.0" {
			return nil, fmt.Errorf("%s: the h2 client spoke %q to the broker (%v)", h2.name, proto, err)
		}
		if proto, err := h1.proto(ctx); err != nil || proto != "HTTP/1.1" {
			return nil, fmt.Errorf("%s: the HTTP/1.1 client spoke %q to the broker (%v)", h1.name, proto, err)
		}
		var h1cpu, h2cpu, h1rps, h2rps, rpsRatio []float64
		pr := agentH2Pair{Path: h1.name}
		for i := range rounds {
			b, a := adjacentSlices(ctx, i, h2, h1, conns, d)
			h1rps, h2rps = append(h1rps, a.rps), append(h2rps, b.rps)
			if a.rps > 0 {
				rpsRatio = append(rpsRatio, b.rps/a.rps)
			}
			if a.cpuPerReq > 0 && b.cpuPerReq > 0 {
				h1cpu, h2cpu = append(h1cpu, a.cpuPerReq), append(h2cpu, b.cpuPerReq)
				pr.cpuRatios = append(pr.cpuRatios, b.cpuPerReq/a.cpuPerReq)
			}
		}
		pr.H1CPUUS, pr.H2CPUUS, pr.CPUH2OverH1 = spreadOf(h1cpu), spreadOf(h2cpu), spreadOf(pr.cpuRatios)
		pr.H1RPS, pr.H2RPS, pr.RPSH2OverH1 = spreadOf(h1rps), spreadOf(h2rps), spreadOf(rpsRatio)
		pr.Pairs = len(pr.cpuRatios)
		fmt.Fprintf(stderr, "  %s: h2/h1 CPU per request median %.2fx of %d pairs\n", h1.name, pr.CPUH2OverH1.Median, len(pr.cpuRatios))
		r.Paths = append(r.Paths, pr)
		h2.client.CloseIdleConnections()
		h1.client = h1.withConns(p, 0)
	}
	return r, nil
}

// agentH2Pairs is -only agent-h2-pairs: the bare intercepted path and the full pipeline, each
// with an HTTP/1.1 and an h2 client in -pairs pairs of -slice at -conns concurrent requests.
func agentH2Pairs(ctx context.Context, p *pki, intercept, full *path, o options) error {
	r, err := measureAgentH2(ctx, p, []*path{intercept, full}, o.conns, max(o.pairs, 1), o.slice)
	if err != nil {
		return err
	}
	r.print(os.Stdout)
	return nil
}

func (r *agentH2Result) print(out io.Writer) {
	if r == nil {
		return
	}
	fmt.Fprintf(out, "\nHTTP/1.1 client (%d connections) against h2 client (one connection, %d streams), %d rounds of adjacent %d ms slices (median, range):\n",
		r.Conns, r.Conns, r.Rounds, r.SliceMS)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "path\th1 CPU µs/req\th2 CPU µs/req\th2/h1 CPU\th1 req/s\th2 req/s\th2/h1 req/s\t")
	sp := func(s spread, f string) string {
		return fmt.Sprintf(f+" ("+f+"-"+f+")", s.Median, s.Min, s.Max)
	}
	for _, pr := range r.Paths {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", pr.Path, sp(pr.H1CPUUS, "%.0f"), sp(pr.H2CPUUS, "%.0f"), sp(pr.CPUH2OverH1, "%.2f"),
			sp(pr.H1RPS, "%.0f"), sp(pr.H2RPS, "%.0f"), sp(pr.RPSH2OverH1, "%.2f"))
	}
	w.Flush()
}
