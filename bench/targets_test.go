package main

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestCheckTargets(t *testing.T) {
	pair := func(r ...float64) paired { return paired{Conns: 32, Ratios: r, Median: median(r)} }
	s := &summary{
		FullOverIntercept: pair(0.88, 0.93, 0.95),
		Paired: map[string]paired{
			"intercept/relay": pair(0.9, 0.97, 1.1), "tunnel/smokescreen": pair(0.97, 0.99, 1.0),
			"intercept/mitmproxy": pair(17, 18, 19), "full/mitmproxy": pair(14, 15, 16),
		},
		AddedP50Paired: pairedDiff{Rate: 1000, DiffsMS: []float64{0.2, 0.25, 0.4}},
		AddedP50MS:     map[string]float64{"full": 0.25, "mitmproxy": 1500},
		Throughput:     map[string]map[int]float64{"mitmproxy": {8: 900, 32: 850}},
		LatencyRate:    1000,
		Peers:          map[string]peerResult{"squid": {Skipped: "not installed"}, "mitmproxy": {}, "relay": {}, "smokescreen": {}},
	}
	s.AddedP50Paired.Median = median(s.AddedP50Paired.DiffsMS)
	s.checkTargets()
	got := map[string]target{}
	for _, tg := range s.Targets {
		got[tg.Name] = tg
	}
	for name, want := range map[string]struct {
		met       bool
		value     float64
		skipped   bool
		op        string
		lo, hi    float64
		pairCount int
	}{
		"bare intercepted / relay, c=32":                                               {true, 0.97, false, ">=", 0.9, 1.1, 3},
		"full pipeline / bare intercepted, c=32":                                       {true, 0.93, false, ">=", 0.88, 0.95, 3},
		"opaque tunnel / smokescreen, c=32":                                            {false, 0.99, false, ">=", 0.97, 1.0, 3},
		"added p50, full pipeline, 1000 req/s":                                         {true, 0.25, false, "<=", 0.2, 0.4, 3},
		"bare intercepted / mitmproxy, c=32 (margin of 2026-12-03)":                    {true, 18, false, ">=", 17, 19, 3},
		"full pipeline / mitmproxy, c=32 (margin of 2026-12-03)":                       {false, 15, false, ">=", 14, 16, 3},
		"bare intercepted / squid, c=32 (margin of 2026-12-03)":                        {false, 0, true, "", 0, 0, 0},
		"squid's added p50 / full pipeline's (margin of 2026-12-03)":                   {false, 0, true, "", 0, 0, 0},
		"mitmproxy's best throughput / the latency rate (over capacity on 2026-12-03)": {true, 0.9, false, "<=", 0, 0, 0},
	} {
		tg, ok := got[name]
		if !ok {
			t.Errorf("no target %q", name)
			continue
		}
		if tg.Met != want.met || tg.Value != want.value || (tg.Skipped != "") != want.skipped || tg.Op != want.op ||
			tg.Min != want.lo || tg.Max != want.hi || tg.Pairs != want.pairCount {
			t.Errorf("%s: %+v, want %+v", name, tg, want)
		}
	}
	if tg := got["bare intercepted / squid, c=32 (margin of 2026-12-03)"]; !strings.Contains(tg.Skipped, "squid: not installed") {
		t.Errorf("skipped squid target says %q", tg.Skipped)
	}
	var out bytes.Buffer
	s.printTargets(&out)
	for _, want := range []string{"bare intercepted / relay, c=32", "0.970 x   (0.90 to 1.10, 3 pairs; CI 0.90-1.10)", ">= 0.95   met, within noise", "not met", "squid: not installed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("printed targets lack %q:\n%s", want, out.String())
		}
	}
}

func TestLatencyMargin(t *testing.T) {
	const name = "squid's added p50 / full pipeline's (margin of 2026-12-03)"
	for _, c := range []struct {
		paired, phase, squid, want float64
		met                        bool
	}{
		{paired: 0.2, phase: 0.5, squid: 0.65, want: 3.25, met: true}, // the pairs' figure, not the phase's
		{paired: 0.5, phase: 0.2, squid: 0.65, want: 1.3, met: false},
		{paired: -0.1, phase: 0.2, squid: 0.65, want: 65, met: true}, // nothing measurable: 10 µs
	} {
		s := &summary{
			AddedP50Paired: pairedDiff{Rate: 1000, DiffsMS: []float64{c.paired}, Median: c.paired},
			AddedP50MS:     map[string]float64{"full": c.phase, "squid": c.squid},
			Peers:          map[string]peerResult{"squid": {}},
		}
		s.checkTargets()
		i := slices.IndexFunc(s.Targets, func(tg target) bool { return tg.Name == name })
		if i < 0 {
			t.Fatalf("no target %q", name)
		}
		if tg := s.Targets[i]; math.Abs(tg.Value-c.want) > 1e-9 || tg.Met != c.met || tg.Skipped != "" {
			t.Errorf("paired %v, phase %v: %+v, want %v (met %v)", c.paired, c.phase, tg, c.want, c.met)
		}
	}
}

func TestAgentH2Target(t *testing.T) {
	s := &summary{AgentH2: &agentH2Result{Paths: []agentH2Pair{
		{Path: "intercept", cpuRatios: []float64{1.2, 0.9, 1.04, 1.1, 1.0}},
		{Path: "full", cpuRatios: []float64{1.3, 1.1, 1.2, 1.25, 1.15}},
	}}}
	s.checkTargets()
	got := map[string]target{}
	for _, tg := range s.Targets {
		got[tg.Name] = tg
	}
	for name, met := range map[string]bool{
		"broker CPU/request, h2 client / HTTP/1.1, bare intercepted (issue 40)": true,
		"broker CPU/request, h2 client / HTTP/1.1, full pipeline (issue 40)":    false,
	} {
		tg, ok := got[name]
		if !ok || tg.Met != met || tg.Op != "<=" || tg.Limit != 1.1 || tg.Pairs != 5 {
			t.Errorf("%s: %+v (found %v), want met %v", name, tg, ok, met)
		}
	}
	empty := &summary{}
	empty.checkTargets()
	for _, tg := range empty.Targets {
		if strings.Contains(tg.Name, "h2 client") && tg.Skipped == "" {
			t.Errorf("%s: checked without a measure", tg.Name)
		}
	}
}

// TestMedianCI: the interval is the sign test's, from the order statistics: the range under 6
// pairs (7 pairs: the range, at 98.4%), the 4th to the 12th of 15, the 6th to the 15th of 20,
// the 7th to the 18th of 24, in whatever order the pairs came.
func TestMedianCI(t *testing.T) {
	for _, c := range []struct{ n, lo, hi int }{{1, 1, 1}, {2, 1, 2}, {5, 1, 5}, {7, 1, 7}, {15, 4, 12}, {20, 6, 15}, {24, 7, 18}, {100, 40, 61}} {
		v := make([]float64, c.n)
		for i := range v {
			v[i] = float64((i*11)%c.n + 1) // 1..n, shuffled (11 is prime to every n here)
		}
		if lo, hi := medianCI(v); lo != float64(c.lo) || hi != float64(c.hi) {
			t.Errorf("n=%d: %v-%v, want %d-%d", c.n, lo, hi, c.lo, c.hi)
		}
	}
}

// TestTargetWithinNoise: a target is within noise when its limit lies in its median's
// interval, met or not; outside it, the run tells.
func TestTargetWithinNoise(t *testing.T) {
	ratios := func(lo float64) []float64 { // 20 pairs: the interval is the 6th to the 15th
		v := make([]float64, 20)
		for i := range v {
			v[i] = lo + 0.01*float64(i)
		}
		return v
	}
	for _, c := range []struct {
		lo          float64
		met, within bool
	}{{0.74, false, false}, {0.8, false, true}, {0.82, true, true}, {0.86, true, false}} {
		s := &summary{OTel: &otelCost{paired: paired{Ratios: ratios(c.lo)}}}
		s.checkTargets()
		i := slices.IndexFunc(s.Targets, func(tg target) bool { return strings.Contains(tg.Name, "issue 36") })
		if tg := s.Targets[i]; tg.Met != c.met || tg.withinNoise() != c.within {
			t.Errorf("pairs from %.2f: %+v, want met %v, within noise %v", c.lo, tg, c.met, c.within)
		}
	}
}
