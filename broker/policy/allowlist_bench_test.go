package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"testing/fstest"
)

// allowListSizes are the allow-list lengths BenchmarkAllowList measures (docs/policy.md).
var allowListSizes = []int{10, 1_000, 100_000}

// allowListForms are the two ways an author writes an allow-list of hosts: a JSON array
// tested with `in` (each evaluation scans it), and an object keyed by host (one lookup).
var allowListForms = []struct {
	name, rego string
	data       func(hosts []string) any
}{
	{"array_in", `package broker

decision := {"allow": true} if input.request.host in data.allow.hosts
`, func(hosts []string) any { return hosts }},
	{"object_lookup", `package broker

decision := {"allow": true} if data.allow.hosts[input.request.host]
`, func(hosts []string) any {
		m := make(map[string]any, len(hosts))
		for _, h := range hosts {
			m[h] = true
		}
		return m
	}},
}

// allowListHosts is n distinct host names, host-0.example.com first.
func allowListHosts(n int) []string {
	hosts := make([]string, n)
	for i := range hosts {
		hosts[i] = "host-" + strconv.Itoa(i) + ".example.com"
	}
	return hosts
}

// allowListPolicy is a policy directory holding form's rule and an allow-list of n hosts.
func allowListPolicy(tb testing.TB, form int, n int) fstest.MapFS {
	tb.Helper()
	f := allowListForms[form]
	data, err := json.Marshal(map[string]any{"allow": map[string]any{"hosts": f.data(allowListHosts(n))}})
	if err != nil {
		tb.Fatal(err)
	}
	return fstest.MapFS{"p.rego": {Data: []byte(f.rego)}, "data.json": {Data: data}}
}

// BenchmarkAllowList evaluates (no decision cache) a request to the last host of an
// allow-list of each size in each form: the cost per request of the list as the broker
// stores it.
func BenchmarkAllowList(b *testing.B) {
	ctx := context.Background()
	for _, n := range allowListSizes {
		for fi, f := range allowListForms {
			e, err := New(ctx, allowListPolicy(b, fi, n))
			if err != nil {
				b.Fatal(err)
			}
			in := Input{Phase: PhaseRequest, AgentID: "a", Method: "GET", Scheme: "https",
				Host: fmt.Sprintf("host-%d.example.com", n-1), Port: 443, Path: "/"}
			b.Run(fmt.Sprintf("%s/%d", f.name, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					in := in
					d, err := evaluateInput(ctx, e.cur.Load(), &in)
					if err != nil {
						b.Fatal(err)
					}
					if !d.Allow {
						b.Fatal("denied")
					}
				}
			})
		}
	}
}

// TestAllowListAllocationsDoNotGrow checks that the data store hands the evaluator its values
// as they are: an evaluation over a 10,000-entry array allocates no more than over a
// 10-entry one (OPA's default store converted the array on every read: 10,000 allocations).
func TestAllowListAllocationsDoNotGrow(t *testing.T) {
	ctx := context.Background()
	allocs := func(n int) float64 {
		e, err := New(ctx, allowListPolicy(t, 0, n))
		if err != nil {
			t.Fatal(err)
		}
		in := Input{Phase: PhaseRequest, AgentID: "a", Method: "GET", Scheme: "https",
			Host: fmt.Sprintf("host-%d.example.com", n-1), Port: 443, Path: "/"}
		return testing.AllocsPerRun(20, func() {
			in := in
			d, err := evaluateInput(ctx, e.cur.Load(), &in)
			if err != nil || !d.Allow {
				t.Fatalf("decision %+v, %v", d, err)
			}
		})
	}
	small, large := allocs(10), allocs(10_000)
	if large > small+50 {
		t.Errorf("an evaluation over 10,000 entries allocates %.0f times, over 10 entries %.0f: the data is converted per read", large, small)
	}
}
