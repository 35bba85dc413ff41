package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCurveChart(t *testing.T) {
	dir := t.TempDir()
	c := Curve{
		Name: "concurrency", Title: "Throughput by active connections", XLabel: "connections", YLabel: "requests/s",
		LogX: true, Machine: "2 cores (test CPU)", Date: "2026-12-04", Commit: "abc123def456",
		Series: []Series{
			{Name: "intercepted", Points: []Point{
				{X: 1, Y: 3000, Baseline: 5000, Extra: map[string]float64{"p99_ms": 1.5, "baseline_p99_ms": 1.1}},
				{X: 32, Y: 14000, Baseline: 15000, Extra: map[string]float64{"p99_ms": 6, "p99_ms_min": 5, "p99_ms_max": 7}},
				{X: 1024, Y: 12000, Baseline: 13000, Extra: map[string]float64{"p99_ms": 90}},
			}},
			{Name: "full pipeline", Points: []Point{{X: 1, Y: 2900}, {X: 1024, Y: 11000}}},
		},
	}
	drawn, err := curveCharts(c, dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "concurrency.svg"), filepath.Join(dir, "concurrency-p99-ms.svg")}
	if strings.Join(drawn, ",") != strings.Join(want, ",") {
		t.Fatalf("drawn %v, want %v", drawn, want)
	}
	for _, f := range drawn {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		svg := string(b)
		if !strings.HasPrefix(strings.TrimSpace(svg), "<?xml") || !strings.Contains(svg, "<svg") {
			t.Errorf("%s is not an SVG: %.100s", f, svg)
		}
		for _, s := range []string{"Throughput by active connections", "2 cores (test CPU) · 2026-12-04 · commit abc123def456",
			"intercepted", "intercepted: baseline", "connections"} {
			if !strings.Contains(svg, s) {
				t.Errorf("%s lacks %q", filepath.Base(f), s)
			}
		}
	}
	main, _ := os.ReadFile(want[0])
	if !strings.Contains(string(main), "full pipeline") {
		t.Error("the curve's chart lacks its second series")
	}
	// The baseline is dashed: one line in the plot and one in the legend.
	if n := strings.Count(string(main), "stroke-dasharray"); n != 2 {
		t.Errorf("the curve's chart has %d dashed lines, want 2 (the baseline and its legend)", n)
	}
}

func TestHeadlineChart(t *testing.T) {
	dir := t.TempDir()
	s := &summary{
		Machine: "2 cores (test CPU)", Started: "2026-12-04T12:00:00Z", Commit: "abc123def456", LatencyRate: 1000,
		Throughput: map[string]map[int]float64{"direct": {32: 30000}, "intercept": {32: 14000}, "full": {32: 13000}, "mitmproxy": {32: 850}},
		AddedP50MS: map[string]float64{"intercept": 0.2, "full": 0.25, "mitmproxy": 1700},
	}
	file := filepath.Join(dir, "headline.svg")
	if err := headlineChart(s, file); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	svg := string(b)
	for _, want := range []string{"2 cores (test CPU) · 2026-12-04 · commit abc123def456", "broker, full pipeline", "mitmproxy",
		"30000", "0.25 ms", "1700.00 ms (over capacity: queued)"} {
		if !strings.Contains(svg, want) {
			t.Errorf("headline lacks %q", want)
		}
	}
	if strings.Contains(svg, "squid") {
		t.Error("headline draws squid, which was not measured")
	}
}

func TestTargetsChart(t *testing.T) {
	dir := t.TempDir()
	s := &summary{Machine: "2 cores (test CPU)", Started: "2026-12-06T02:00:00Z", Commit: "abc123def456", Targets: []target{
		{Name: "bare intercepted / relay, c=32", Value: 0.9, Limit: 0.95, Op: ">="},
		{Name: "full pipeline / bare intercepted, 256 MiB download (issue 40)", Value: 0.93, Limit: 0.9, Unit: "x", Op: ">=", Min: 0.8, Max: 1.1, Pairs: 3, Met: true},
		{Name: "connection per request, the CONNECT's broker CPU / the floor's (our bar)", Value: 1.45, Limit: 1.5, Unit: "x", Op: "<=", Min: 1.2, Max: 1.8, Pairs: 20, Met: true},
		{Name: "scrubbing, 100 plain keys / 1 key (issue 40)", Limit: 0.9, Unit: "x", Skipped: "not measured"},
	}}
	file := filepath.Join(dir, "targets.svg")
	if err := targetsChart(s, file); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	svg := string(b)
	for _, want := range []string{"commit abc123def456", "full pipeline / bare intercepted, 256 MiB download", "0.93 x (0.8 to 1.1) &gt;= 0.9",
		"1.45 x (1.2 to 1.8) &lt;= 1.5", "not measured", "bars: the pairs&#39; range"} {
		if !strings.Contains(svg, want) {
			t.Errorf("targets chart lacks %q", want)
		}
	}
	if strings.Contains(svg, "c=32") {
		t.Error("the targets chart draws a target of the small-request pipeline")
	}
}
