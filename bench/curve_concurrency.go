package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The concurrency curve: throughput and p99 latency of small requests through the broker,
// intercepted (bare) and through the full pipeline, at 1 to 1,024 active keep-alive
// connections, each point beside the relay (the floor of an intercepting proxy) at the same
// number of connections, in adjacent slices taken in turn.
func init() { registerCurve("concurrency", concurrencyCurve) }

// concLimits let one agent hold and use every connection of the curve's largest point.
const concLimits = "max_connections: 8192, max_connections_per_agent: 4096, max_requests_per_agent: 4096"

func concurrencyCurve(ctx context.Context, env curveEnv) (Curve, error) {
	points, pairs, slice := []int{1, 4, 16, 64, 256, 1024}, 6, 500*time.Millisecond
	if env.quick {
		points, pairs, slice = []int{1, 16, 256}, 3, 300*time.Millisecond
	}
	c := Curve{
		Name: "concurrency", Title: "Throughput by active connections, beside the relay (dashed)",
		XLabel: "active keep-alive connections (closed loop, one agent)", YLabel: "requests per second", LogX: true,
		Note: fmt.Sprintf("Each point is the median of %d slices of %d ms of each path taken in turn (relay, intercepted, full; then the reverse), "+
			"client, upstream, broker and relay on the same cores. The broker's work per request does not depend on the number of connections; "+
			"past a few connections per core the machine is saturated and throughput stays flat while latency grows with the queue (Little's law). "+
			"Where a connection's requests come more than 100 ms apart (about 1,024 connections here) the broker parks its tunnel between them, and each request pays for taking it up again (a goroutine, pooled buffers).", pairs, slice.Milliseconds()),
	}
	p, up, err := env.upstream()
	if err != nil {
		return c, err
	}
	defer up.close()
	var bare, full *broker
	err = withLimits(concLimits, func() error {
		if bare, err = startBroker(env.bin, filepath.Join(env.dir, "bare"), up, p, false); err != nil {
			return err
		}
		full, err = startBroker(env.bin, filepath.Join(env.dir, "full"), up, p, true)
		return err
	})
	if bare != nil {
		defer bare.stop()
	}
	if full != nil {
		defer full.stop()
	}
	if err != nil {
		return c, err
	}
	relayBin, err := findRelay()
	if err != nil {
		return c, err
	}
	relayProc, relayVia, err := startRelay(relayBin, env.dir, p)
	if err != nil {
		return c, fmt.Errorf("relay: %w", err)
	}
	defer relayProc.stop()
	u := up.url(hostIntercept, chatPath)
	relay := &path{name: "relay", url: u, via: relayVia, proc: relayProc}
	paths := []*path{
		{name: "intercepted", url: u, via: bare.intercepting(), proc: bare.process},
		{name: "full pipeline", url: u, via: full.intercepting(), proc: full.process},
	}
	for _, pa := range append([]*path{relay}, paths...) {
		pa.client = pa.withConns(p, 1)
		if err := pa.check(ctx); err != nil {
			return c, fmt.Errorf("%s: %w", pa.name, err)
		}
	}
	c.Series = make([]Series, len(paths))
	for i, pa := range paths {
		c.Series[i].Name = pa.name
	}
	for _, conns := range points {
		order := append([]*path{relay}, paths...)
		got := map[*path][]concSlice{}
		for _, pa := range order {
			pa.client = pa.withConns(p, conns)
		}
		for i := range pairs {
			if i%2 == 1 {
				slices.Reverse(order)
			}
			for _, pa := range order {
				got[pa] = append(got[pa], concLoop(ctx, pa, conns, slice))
			}
			if i%2 == 1 {
				slices.Reverse(order)
			}
		}
		base := concSummarize(got[relay])
		for i, pa := range paths {
			s := concSummarize(got[pa])
			var ratios []float64
			for j, sl := range got[pa] {
				if r := got[relay][j].rps; r > 0 {
					ratios = append(ratios, sl.rps/r)
				}
			}
			pt := Point{X: float64(conns), Y: round3(s.rps), Baseline: round3(base.rps), Extra: map[string]float64{
				"p99_ms": round3(s.p99ms), "baseline_p99_ms": round3(base.p99ms),
				"vs_relay": round3(median(ratios)), "vs_relay_min": round3(slices.Min(ratios)), "vs_relay_max": round3(slices.Max(ratios)),
			}}
			if s.errors > 0 {
				pt.Extra["errors"] = float64(s.errors)
			}
			c.Series[i].Points = append(c.Series[i].Points, pt)
			fmt.Fprintf(stderr, "  c=%-5d %-14s %8.0f req/s p99 %7.2f ms; relay %8.0f req/s p99 %7.2f ms; %.2fx (%.2f-%.2f)\n",
				conns, pa.name, s.rps, s.p99ms, base.rps, base.p99ms, pt.Extra["vs_relay"], pt.Extra["vs_relay_min"], pt.Extra["vs_relay_max"])
		}
		for _, pa := range order {
			pa.client.CloseIdleConnections()
		}
	}
	return c, nil
}

// concSlice is one slice of closed-loop load on one path.
type concSlice struct {
	rps, p99ms float64
	errors     int64
}

// concSummarize is the median of the slices' throughputs and of their p99s, and their errors.
func concSummarize(s []concSlice) concSlice {
	var rps, p99 []float64
	var errs int64
	for _, sl := range s {
		rps, p99 = append(rps, sl.rps), append(p99, sl.p99ms)
		errs += sl.errors
	}
	return concSlice{rps: median(rps), p99ms: median(p99), errors: errs}
}

// concLoop runs conns closed-loop clients on pa for d, after one request each on its own
// connection, and times every request.
func concLoop(ctx context.Context, pa *path, conns int, d time.Duration) concSlice {
	var wg sync.WaitGroup
	for range conns {
		wg.Add(1)
		go func() { defer wg.Done(); _ = pa.do(ctx) }()
	}
	wg.Wait()
	var errs atomic.Int64
	lats := make([][]time.Duration, conns)
	start := time.Now()
	deadline := start.Add(d)
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				t := time.Now()
				if !t.Before(deadline) {
					return
				}
				if pa.do(ctx) != nil {
					errs.Add(1)
					continue
				}
				lats[i] = append(lats[i], time.Since(t))
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	all := slices.Concat(lats...)
	if len(all) == 0 {
		return concSlice{errors: errs.Load()}
	}
	slices.Sort(all)
	p99 := all[int(0.99*float64(len(all)-1))]
	return concSlice{rps: float64(len(all)) / el.Seconds(), p99ms: float64(p99.Microseconds()) / 1000, errors: errs.Load()}
}
