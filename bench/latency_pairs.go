package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// latencyWarmUp is how long openLoop runs at its rate, uncounted, before the slice it
// measures (-latency-warm); 0 is the eight sequential requests it sent before (see openLoop).
var latencyWarmUp = 300 * time.Millisecond

// preciseSend makes sendAt sleep in nanosleep rather than time.Sleep (-latency-precise).
var preciseSend = true

// loopStats is what an open-loop slice measured besides its quantiles: how many connections
// the client opened during it, and how late the load generator sent its requests.
type loopStats struct {
	Dials        int64
	LagP50US     float64 // scheduled send to the request's goroutine starting, microseconds
	LagP99US     float64
	P50MS, P99MS float64
	SentP50MS    float64 // the p50 timed from each request's goroutine starting instead
}

// timedLoop is openLoop's measurement: rate requests per second for d, each timed from its
// scheduled send, after the warm-up (latencyWarmUp).
func (pa *path) timedLoop(ctx context.Context, rate int, d time.Duration) (latency, loopStats) {
	if latencyWarmUp > 0 {
		pa.sendAt(ctx, rate, latencyWarmUp, nil, nil)
	} else {
		for range 8 {
			_ = pa.do(ctx)
		}
	}
	n := int(d.Seconds() * float64(rate))
	lat, lag := make([]time.Duration, n), make([]time.Duration, n)
	dials := pa.dialCount()
	errs := pa.sendAt(ctx, rate, d, lat, lag)
	st := loopStats{Dials: pa.dialCount() - dials}
	svc := make([]time.Duration, n)
	for i := range n {
		svc[i] = lat[i] - lag[i]
	}
	slices.Sort(svc)
	slices.Sort(lat)
	slices.Sort(lag)
	q := func(v []time.Duration, f float64) time.Duration { return v[int(f*float64(len(v)-1))] }
	ms := func(v time.Duration) float64 { return float64(v.Microseconds()) / 1000 }
	l := latency{P50MS: ms(q(lat, 0.5)), P99MS: ms(q(lat, 0.99)), Sent: n, Errors: errs}
	st.P50MS, st.P99MS, st.SentP50MS = l.P50MS, l.P99MS, ms(q(svc, 0.5))
	st.LagP50US, st.LagP99US = float64(q(lag, 0.5).Microseconds()), float64(q(lag, 0.99).Microseconds())
	return l, st
}

// sendAt sends rate requests per second for d, each on a goroutine of its own started at its
// scheduled time, and waits for them; with lat and lag (len rate*d), it records each
// request's latency from its scheduled send, and how late its goroutine started. It returns
// the requests that failed.
func (pa *path) sendAt(ctx context.Context, rate int, d time.Duration, lat, lag []time.Duration) int {
	n := int(d.Seconds() * float64(rate))
	var errs atomic.Int64
	var wg sync.WaitGroup
	interval := time.Second / time.Duration(rate)
	sleep := time.Sleep
	if preciseSend {
		var done func()
		sleep, done = preciseSleeper()
		defer done()
	}
	start := time.Now()
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		if d := time.Until(at); d > 0 {
			sleep(d)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if lag != nil {
				lag[i] = time.Since(at)
			}
			if pa.do(ctx) != nil {
				errs.Add(1)
			}
			if lat != nil {
				lat[i] = time.Since(at)
			}
		}()
	}
	wg.Wait()
	return int(errs.Load())
}

// dials counts the connections each path's client has opened (see countDials).
var dials sync.Map // *path -> *atomic.Int64

func (pa *path) dialCount() int64 {
	if v, ok := dials.Load(pa); ok {
		return v.(*atomic.Int64).Load()
	}
	return 0
}

// countingDial is a DialContext that counts into pa's counter.
func (pa *path) countingDial() func(ctx context.Context, network, addr string) (net.Conn, error) {
	v, _ := dials.LoadOrStore(pa, new(atomic.Int64))
	c := v.(*atomic.Int64)
	var d net.Dialer
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c.Add(1)
		return d.DialContext(ctx, network, addr)
	}
}

// addedP50 is a path's open-loop p50 minus another's (direct's, mostly), in pairs of adjacent
// slices.
type addedP50 struct {
	pairedDiff
	Stats [][2]loopStats `json:"stats"` // each pair's slices: the path's, the base's
}

// pairedAddedP50 measures pa's p50 minus base's at rate in pairs of adjacent open-loop slices
// of d, base first in even pairs, pa first in odd ones. Each slice follows a warm-up at the
// same rate (latencyWarmUp): see openLoop.
func pairedAddedP50(ctx context.Context, pa, base *path, pairs, rate int, d time.Duration) addedP50 {
	r := addedP50{pairedDiff: pairedDiff{Rate: rate, SliceMS: d.Milliseconds()}}
	for i := range max(pairs, 1) {
		var a, b loopStats
		if i%2 == 0 {
			_, b = base.timedLoop(ctx, rate, d)
			_, a = pa.timedLoop(ctx, rate, d)
		} else {
			_, a = pa.timedLoop(ctx, rate, d)
			_, b = base.timedLoop(ctx, rate, d)
		}
		r.DiffsMS = append(r.DiffsMS, round3(a.P50MS-b.P50MS))
		r.Stats = append(r.Stats, [2]loopStats{a, b})
	}
	r.Median = median(r.DiffsMS)
	return r
}

func (r addedP50) print(w io.Writer, name string) {
	if len(r.DiffsMS) == 0 {
		return
	}
	fmt.Fprintf(w, "%s added p50 at %d req/s, %d pairs of %d ms slices: median %.3f ms (%.3f to %.3f)\n",
		name, r.Rate, len(r.DiffsMS), r.SliceMS, r.Median, slices.Min(r.DiffsMS), slices.Max(r.DiffsMS))
	for i, s := range r.Stats {
		fmt.Fprintf(w, "  pair %d: %+.3f ms; p50 %.3f / %.3f ms (from send %.3f / %.3f), p99 %.2f / %.2f ms, dials %d / %d, send lag p50 %.0f / %.0f µs, p99 %.0f / %.0f µs\n",
			i, r.DiffsMS[i], s[0].P50MS, s[1].P50MS, s[0].SentP50MS, s[1].SentP50MS, s[0].P99MS, s[1].P99MS, s[0].Dials, s[1].Dials,
			s[0].LagP50US, s[1].LagP50US, s[0].LagP99US, s[1].LagP99US)
	}
}

// latencyPairs is -only latency-pairs: the added p50 at -rate of the full pipeline, the bare
// intercepted path and the relay, each over direct in pairs of adjacent open-loop slices (a
// quarter of -pairs, at least 3, of -latency-slice each), and the full pipeline's over the
// relay's: the target's measurement alone, in about a minute.
func latencyPairs(ctx context.Context, up *upstream, p *pki, direct, intercept, full *path, o options) error {
	peers, results, stop := startPeers(ctx, up, p, []string{"relay"})
	defer stop()
	compared := []*path{full, intercept}
	if len(peers) > 0 {
		compared = append(compared, peers[0])
	} else {
		fmt.Fprintln(os.Stderr, "  relay skipped:", results["relay"].Skipped)
	}
	for _, pa := range append(compared, direct) {
		pa.client = pa.withConns(p, 256)
	}
	n := max(o.pairs/4, 3)
	for _, pa := range compared {
		r := pairedAddedP50(ctx, pa, direct, n, o.rate, o.latencySlice)
		r.print(os.Stdout, pa.name+" over direct:")
	}
	// The full pipeline over the relay, paired too: what the broker adds over the floor of an
	// intercepting proxy, the relay's extra hop and its two TLS legs being on both sides. (On
	// a machine loaded by others it moved as much as the added p50 over direct.)
	if len(peers) > 0 {
		r := pairedAddedP50(ctx, full, peers[0], n, o.rate, o.latencySlice)
		r.print(os.Stdout, "full over relay:")
	}
	return nil
}
