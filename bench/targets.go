package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Issue 25's targets, restated against the floor and checked in pairs in one run:
//
//   - the bare intercepted path carries at least 0.95x the relay's requests (the relay is the
//     floor: about the least an intercepting proxy in Go does per request);
//   - the full pipeline (a credentialed host, every response scrubbed, audit to a file) at
//     least 0.9x the bare intercepted path's;
//   - the opaque tunnel at least smokescreen's (1.0x);
//   - the full pipeline adds at most 0.3 ms to the median at 1,000 requests/s, open loop;
//   - and in each case the broker stays ahead of squid and mitmproxy by the margins of the
//     run in docs/benchmarks.md's table (2026-12-03), peerMargins.
//
// Each throughput ratio is the median of pairs of adjacent slices at 32 connections
// (pairedRatio); the added p50 the median of pairs of open-loop slices, direct and full.

// peerMargins are the margins by which the broker was ahead of squid and mitmproxy in the run
// of docs/benchmarks.md's table (2026-12-03, 2-core VM; best rounds at 32 connections, and
// the latency phase at 1,000 requests/s): throughput ratios num/den, and for the latency the
// peer's added p50 over the full pipeline's.
var peerMargins = []struct {
	num, den string
	margin   float64
	latency  bool
}{
	{"intercept", "squid", 1.78, false},     // 14,135 / 7,934 req/s
	{"intercept", "mitmproxy", 16.5, false}, // 14,135 / 855
	{"full", "squid", 1.65, false},          // 13,065 / 7,934
	{"full", "mitmproxy", 15.3, false},      // 13,065 / 855
	{"squid", "full", 2.3, true},            // added p50 0.65 / 0.28 ms
	// mitmproxy's added p50 was 1,727 ms: at 1,000 req/s it is over its capacity (best 917
	// req/s) and requests queue, for as long as the phase lasts. The margin kept is that: its
	// best throughput stays under the rate (checked as its best over the rate, at most 1x).
	{"mitmproxy", "full", 1, true},
}

// pairedDiff is one path's p50 minus another's at an open-loop rate, in pairs of slices.
type pairedDiff struct {
	Rate    int       `json:"rate_rps"`
	SliceMS int64     `json:"slice_ms"`
	DiffsMS []float64 `json:"diffs_ms"`
	Median  float64   `json:"median_ms"`
}

// measureTargets measures the pairs the targets are read from that the main run does not
// already (full/intercept is pairs(32)): the broker's paths over the relay and the peers, and
// the full pipeline's added p50 over direct. Paths missing (a peer skipped) are left out, and
// their targets say so.
func (s *summary) measureTargets(ctx context.Context, p *pki, all []*path, procs []*process, pairs int, slice time.Duration, rate int) {
	byName := map[string]*path{}
	for _, pa := range all {
		byName[pa.name] = pa
	}
	s.Paired = map[string]paired{}
	fmt.Fprintln(stderr, "the targets' pairs: the broker over the relay and the peers...")
	ratio := func(num, den string, n int) {
		a, b := byName[num], byName[den]
		if a == nil || b == nil {
			return
		}
		// A peer over its capacity in the latency phase (mitmproxy, at times squid) may
		// still be working off its queue: it would take CPU from the first pairs.
		settleBefore(procs, num+"/"+den)
		a.client, b.client = a.withConns(p, 32), b.withConns(p, 32)
		s.Paired[num+"/"+den] = pairedRatio(ctx, a, b, 32, n, slice)
	}
	ratio("intercept", "relay", pairs)
	ratio("tunnel", "smokescreen", pairs)
	for _, m := range peerMargins {
		if !m.latency {
			ratio(m.num, m.den, max(pairs/4, 3)) // a margin several times the noise needs fewer
		}
	}
	direct, full := byName["direct"], byName["full"]
	fmt.Fprintln(stderr, "the full pipeline's added p50, paired with direct...")
	settleBefore(procs, "added p50")
	direct.client, full.client = direct.withConns(p, 256), full.withConns(p, 256)
	d := pairedAddedP50(ctx, full, direct, max(pairs/4, 3), rate, time.Second).pairedDiff
	s.AddedP50Paired = d
}

// checkTargets states the targets of issue 25 and the rest of issue 7's against this run.
func (s *summary) checkTargets() {
	s.Targets = nil
	add := func(t target, atLeast bool, skipped string) {
		switch {
		case skipped != "":
			t.Skipped = skipped
		case atLeast:
			t.Met, t.Op = t.Value >= t.Limit, ">="
		default:
			t.Met, t.Op = t.Value <= t.Limit, "<="
		}
		s.Targets = append(s.Targets, t)
	}
	pairedTarget := func(name, key string, limit float64) {
		f, ok := s.Paired[key]
		if key == "full/intercept" {
			f, ok = s.FullOverIntercept, len(s.FullOverIntercept.Ratios) > 0
		}
		t := target{Name: name, Limit: limit, Unit: "x"}
		if !ok || len(f.Ratios) == 0 {
			add(t, true, "not measured: "+s.whyMissing(key))
			return
		}
		t.of(f.Ratios)
		add(t, true, "")
	}
	pairedTarget("bare intercepted / relay, c=32", "intercept/relay", 0.95)
	pairedTarget("full pipeline / bare intercepted, c=32", "full/intercept", 0.9)
	pairedTarget("opaque tunnel / smokescreen, c=32", "tunnel/smokescreen", 1)
	t := target{Name: fmt.Sprintf("added p50, full pipeline, %d req/s", s.AddedP50Paired.Rate), Limit: 0.3, Unit: "ms"}
	if d := s.AddedP50Paired; len(d.DiffsMS) > 0 {
		t.of(d.DiffsMS)
		add(t, false, "")
	} else {
		add(t, false, "not measured")
	}
	for _, m := range peerMargins {
		if !m.latency {
			pairedTarget(fmt.Sprintf("%s / %s, c=32 (margin of 2026-12-03)", pathLabel(m.num), m.den), m.num+"/"+m.den, m.margin)
			continue
		}
		// The peer's added p50 is from the latency phase, which measures every path in turn
		// at the same rate; the full pipeline's from its pairs with direct (or, without them,
		// from the same phase), and at least 10 µs, about what a median can resolve here.
		t := target{Name: fmt.Sprintf("%s's added p50 / full pipeline's (margin of 2026-12-03)", m.num), Limit: m.margin, Unit: "x"}
		peer, ok := s.AddedP50MS[m.num]
		full := s.AddedP50MS["full"]
		if d := s.AddedP50Paired; len(d.DiffsMS) > 0 {
			full = d.Median
		}
		switch full = max(full, 0.01); {
		case !ok || s.Peers[m.num].Skipped != "":
			add(t, true, "not measured: "+s.whyMissing(m.num+"/full"))
		case m.num == "mitmproxy":
			t.Name = "mitmproxy's best throughput / the latency rate (over capacity on 2026-12-03)"
			best := 0.0
			for _, v := range s.Throughput[m.num] {
				best = max(best, v)
			}
			t.Value = best / float64(max(s.LatencyRate, 1))
			add(t, false, "")
		default:
			t.Value = peer / full
			add(t, true, "")
		}
	}
	// Issue 40's: bulk transfers both ways, and scrubbing with many keys.
	for _, b := range []struct{ key, name string }{{"intercept/relay", "bare intercepted / relay"}, {"full/intercept", "full pipeline / bare intercepted"}} {
		pb, ok := s.Bulk[b.key]
		for _, w := range []struct {
			way string
			p   paired
		}{{"download", pb.Down}, {"upload", pb.Up}} {
			t := target{Name: fmt.Sprintf("%s, 256 MiB %s (issue 40)", b.name, w.way), Limit: 0.9, Unit: "x"}
			if !ok || len(w.p.Ratios) == 0 {
				add(t, true, "not measured: "+s.whyMissing(b.key))
				continue
			}
			t.of(w.p.Ratios)
			add(t, true, "")
		}
	}
	for _, kind := range []string{"plain", "special"} {
		t := target{Name: fmt.Sprintf("scrubbing, 100 %s keys / 1 key (issue 40)", kind), Limit: 0.9, Unit: "x"}
		r := s.Secrets[kind]
		if r == nil || len(r.Ratios) == 0 {
			add(t, true, "not measured")
			continue
		}
		t.of(r.Ratios)
		add(t, true, "")
	}
	for _, name := range []string{"intercept", "full"} {
		t := target{Name: fmt.Sprintf("broker CPU/request, h2 client / HTTP/1.1, %s (issue 40)", pathLabel(name)), Limit: 1.1, Unit: "x"}
		i := -1
		if s.AgentH2 != nil {
			i = slices.IndexFunc(s.AgentH2.Paths, func(pr agentH2Pair) bool { return pr.Path == name })
		}
		if i < 0 || len(s.AgentH2.Paths[i].cpuRatios) == 0 {
			add(t, false, "not measured")
			continue
		}
		t.of(s.AgentH2.Paths[i].cpuRatios)
		add(t, false, "")
	}
	s.Targets = append(s.Targets, s.perCommandTarget())
	// Issue 36's: OTLP logs and traces (every request traced) exported to the minimal sink.
	t = target{Name: "full pipeline with OTLP logs and traces / without, c=32 (issue 36)", Limit: 0.9, Unit: "x"}
	if o := s.OTel; o != nil && len(o.Ratios) > 0 {
		t.of(o.Ratios)
		add(t, true, "")
	} else {
		add(t, true, "not measured")
	}
	atMost := func(name string, v, limit float64, unit string) {
		add(target{Name: name, Value: v, Limit: limit, Unit: unit}, false, "")
	}
	atMost("idle intercepted connection (issue 7)", float64(s.IdleConnBytes)/1024, 40, "KiB")
	atMost("new host's first request over a cached host's (issue 7)", s.NewHost.ExtraMS, 2, "ms")
	atMost("SSE mean delay, full pipeline over direct (issue 7)", s.SSE["full"].MeanDelayMS-s.SSE["direct"].MeanDelayMS, 1, "ms")
}

func pathLabel(p string) string {
	switch p {
	case "intercept":
		return "bare intercepted"
	case "full":
		return "full pipeline"
	}
	return p
}

// whyMissing says why the pair num/den was not measured: a peer skipped, with its reason.
func (s *summary) whyMissing(key string) string {
	for _, name := range strings.Split(key, "/") {
		if r, ok := s.Peers[name]; ok && r.Skipped != "" {
			return name + ": " + r.Skipped
		}
	}
	return "the pair was not run"
}

// printTargets writes each target with its value, the pairs' range, and whether it is met.
func (s *summary) printTargets(out io.Writer) {
	fmt.Fprintln(out, "\ntargets (issue 25, issue 7's, issue 36's, issue 40's), each measured in this run:")
	ranges := make([]string, len(s.Targets))
	nameW, rngW := 0, 0
	for i, t := range s.Targets {
		if t.Pairs > 0 {
			ranges[i] = fmt.Sprintf("(%.2f to %.2f, %d pairs; CI %.2f-%.2f)", t.Min, t.Max, t.Pairs, t.Low, t.High)
		}
		nameW, rngW = max(nameW, len(t.Name)), max(rngW, len(ranges[i]))
	}
	for i, t := range s.Targets {
		verdict := "not met"
		if t.Met {
			verdict = "met"
		}
		if t.withinNoise() {
			verdict += ", within noise"
		}
		if t.Skipped != "" {
			fmt.Fprintf(out, "  %-*s %s\n", nameW, t.Name, t.Skipped)
			continue
		}
		fmt.Fprintf(out, "  %-*s %9.3f %-3s %-*s %s %-6g %s\n", nameW, t.Name, t.Value, t.Unit, rngW, ranges[i], t.Op, t.Limit, verdict)
	}
}
