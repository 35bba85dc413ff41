package main

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"
)

// TestPolicyCurves measures both policy curves at two sizes, briefly, and checks their shape
// and what they must show: an array allow-list's uncached decision grows with its length
// while an object's does not grow as much, and the larger policy holds more heap; rules OPA
// cannot index cost more as they grow while indexed ones do not. With
// BENCH_POLICY_CURVES=quick or full it measures the registered curves as `-curves` would and
// prints them as JSON.
func TestPolicyCurves(t *testing.T) {
	if mode := os.Getenv("BENCH_POLICY_CURVES"); mode != "" {
		for _, name := range []string{"policy-data", "policy-rules"} {
			c, err := curveRuns[name](context.Background(), curveEnv{quick: mode == "quick"})
			if err != nil {
				t.Fatal(err)
			}
			b, _ := json.MarshalIndent(c, "", "  ")
			t.Logf("%s", b)
		}
		return
	}
	o := policyCurveOptions{sizes: []int{10, 100_000}, pairs: 3, slice: 20 * time.Millisecond}
	c, err := policyDataCurve(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Series) != 4 || c.Note == "" || c.Machine == "" || c.Date == "" {
		t.Fatalf("curve %+v", c)
	}
	growth := map[string]float64{}
	for _, s := range c.Series {
		if len(s.Points) != 2 {
			t.Fatalf("%s: %d points, want 2", s.Name, len(s.Points))
		}
		p := s.Points[1]
		if p.Y <= 0 || p.Baseline <= 0 {
			t.Fatalf("%s: point %+v", s.Name, p)
		}
		if p.Extra["heap_mib"] <= p.Extra["baseline_heap_mib"] {
			t.Errorf("%s: 100,000 entries hold %.2f MiB, 10 hold %.2f", s.Name, p.Extra["heap_mib"], p.Extra["baseline_heap_mib"])
		}
		growth[s.Name] = p.Y / p.Baseline
	}
	array, object := growth["array (x in data.allow.hosts), uncached"], growth["object (data.allow.hosts[x]), uncached"]
	if array < 5 || array < 3*object {
		t.Errorf("uncached decisions over 100,000 entries: array %.1f× its baseline, object %.1f×: want the array's scan to show", array, object)
	}
	r, err := policyRulesCurve(context.Background(), policyCurveOptions{sizes: []int{10, 300}, pairs: 2, slice: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Series) != 4 {
		t.Fatalf("rules curve %+v", r)
	}
	growth = map[string]float64{}
	for _, s := range r.Series {
		p := s.Points[len(s.Points)-1]
		growth[s.Name] = p.Y / p.Baseline
	}
	indexed, scanned := growth["host == constant (indexed), uncached"], growth["contains (not indexed), uncached"]
	if scanned < 3 || scanned < 2*indexed {
		t.Errorf("uncached decisions over 300 rules: contains %.1f× its baseline, == %.1f×: want the unindexed rules' cost to show", scanned, indexed)
	}
}
