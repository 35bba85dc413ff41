package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing/fstest"
	"time"

	"github.com/capbroker/capbroker/broker/policy"
)

// The policy curves (issue 25): how the broker's policy decision grows with the allow-lists
// in its data ("policy-data", 10 -> 100,000 entries) and with the number of rules
// ("policy-rules", 10 -> 1,000), measured in process with the broker's policy engine
// (policy.Engine.Decide, the decision cache included). Each point is a policy of that size
// measured in slices alternating with its baseline, the same policy at the smallest size,
// loaded beside it; Y is the median over the pairs of the time per decision. "uncached"
// varies the request's path, which the policies read, so that every decision misses the
// decision cache and is evaluated; "cached" repeats one request. Each point's Extra holds the
// heap the loaded policy holds (heap_mib, and baseline_heap_mib), the allocations per
// decision and the time to load the policy (load_ms).

func init() {
	registerCurve("policy-data", func(ctx context.Context, env curveEnv) (Curve, error) {
		o := policyCurveOptions{sizes: []int{10, 100, 1_000, 10_000, 100_000}, pairs: 7, slice: 200 * time.Millisecond}
		if env.quick {
			o = policyCurveOptions{sizes: []int{10, 1_000, 100_000}, pairs: 3, slice: 50 * time.Millisecond}
		}
		return policyDataCurve(ctx, o)
	})
	registerCurve("policy-rules", func(ctx context.Context, env curveEnv) (Curve, error) {
		o := policyCurveOptions{sizes: []int{10, 30, 100, 300, 1_000}, pairs: 7, slice: 200 * time.Millisecond}
		if env.quick {
			o = policyCurveOptions{sizes: []int{10, 100, 1_000}, pairs: 3, slice: 50 * time.Millisecond}
		}
		return policyRulesCurve(ctx, o)
	})
}

type policyCurveOptions struct {
	sizes []int // the first is every point's baseline
	pairs int   // pairs of adjacent slices per point
	slice time.Duration
}

// policyForm is one way of writing the policy: its files for a size n, and the host and path
// prefix of the requests it allows that are measured (the worst case: the last entry or rule).
type policyForm struct {
	name    string
	files   func(n int) (fstest.MapFS, error)
	request func(n int) (host, prefix string)
}

func policyCurveHost(i int) string { return "host-" + strconv.Itoa(i) + ".example.com" }

// lastListedHost: a request to the last entry of an allow-list of n.
func lastListedHost(n int) (string, string) { return policyCurveHost(n - 1), "/api/" }

// lastRuleRequest: a request that the last of n rules allows.
func lastRuleRequest(n int) (string, string) { return policyCurveHost(n - 1), "/api/" }

// allowListCurveForms: the same allow-list of n hosts as an array tested with `in`, and as an
// object keyed by host, looked up. Both policies read the path too (nothing under /admin/),
// so that a request to another path is another decision for the cache.
var allowListCurveForms = []policyForm{
	{"array (x in data.allow.hosts)", func(n int) (fstest.MapFS, error) {
		hosts := make([]string, n)
		for i := range hosts {
			hosts[i] = policyCurveHost(i)
		}
		return allowListCurveFS(`input.request.host in data.allow.hosts`, hosts)
	}, lastListedHost},
	{"object (data.allow.hosts[x])", func(n int) (fstest.MapFS, error) {
		hosts := make(map[string]bool, n)
		for i := range n {
			hosts[policyCurveHost(i)] = true
		}
		return allowListCurveFS(`data.allow.hosts[input.request.host]`, hosts)
	}, lastListedHost},
}

func allowListCurveFS(test string, hosts any) (fstest.MapFS, error) {
	data, err := json.Marshal(map[string]any{"allow": map[string]any{"hosts": hosts}})
	if err != nil {
		return nil, err
	}
	rego := `package broker

default decision := {"allow": false, "reason": "not on the allow-list"}

decision := {"allow": true} if {
	` + test + `
	not startswith(input.request.path, "/admin/")
}
`
	return fstest.MapFS{"broker.rego": {Data: []byte(rego)}, "data.json": {Data: data}}, nil
}

// ruleCurveForms: n rules, one per host, as authors write them: comparing the host with a
// constant, which OPA indexes (as it does glob.match, startswith and endswith against
// constants), or testing it with contains, which it cannot index.
var ruleCurveForms = []policyForm{
	{"host == constant (indexed)", func(n int) (fstest.MapFS, error) {
		return rulesCurveFS(n, func(i int) string { return fmt.Sprintf("input.request.host == %q", policyCurveHost(i)) })
	}, lastRuleRequest},
	{"contains (not indexed)", func(n int) (fstest.MapFS, error) {
		return rulesCurveFS(n, func(i int) string {
			return fmt.Sprintf("contains(input.request.host, %q)", "-"+strconv.Itoa(i)+".")
		})
	}, lastRuleRequest},
}

func rulesCurveFS(n int, match func(i int) string) (fstest.MapFS, error) {
	var b strings.Builder
	b.WriteString("package broker\n\ndefault allow := false\n\ndecision := {\"allow\": allow}\n")
	for i := range n {
		fmt.Fprintf(&b, "\nallow if {\n\t%s\n\tnot startswith(input.request.path, \"/admin/\")\n}\n", match(i))
	}
	return fstest.MapFS{"broker.rego": {Data: []byte(b.String())}}, nil
}

func policyDataCurve(ctx context.Context, o policyCurveOptions) (Curve, error) {
	c := Curve{
		Name: "policy-data", Title: "Policy decision time by allow-list length",
		XLabel: "allow-list entries", YLabel: "µs per decision", LogX: true, LogY: true,
	}
	if err := measurePolicyForms(ctx, &c, o, allowListCurveForms); err != nil {
		return c, err
	}
	c.Note = policyNote(c, "entries",
		"An array tested with `in` is scanned on every evaluation: linear in its length, "+
			"bounded only by the list (check-config warns above 1,000 entries). An object keyed "+
			"by host is one hash lookup, flat at any length. The data is converted to the "+
			"evaluator's values once per load, so memory grows linearly with the entries and "+
			"nothing is converted per decision. A cached decision is a lookup keyed on the input "+
			"the policy reads: it does not depend on the data.")
	stampPolicyCurve(&c)
	return c, nil
}

func policyRulesCurve(ctx context.Context, o policyCurveOptions) (Curve, error) {
	c := Curve{
		Name: "policy-rules", Title: "Policy decision time by number of rules",
		XLabel: "rules", YLabel: "µs per decision", LogX: true, LogY: true,
	}
	if err := measurePolicyForms(ctx, &c, o, ruleCurveForms); err != nil {
		return c, err
	}
	c.Note = policyNote(c, "rules",
		"OPA indexes rules that compare the input with a constant (==, glob.match, startswith, endswith): an "+
			"evaluation visits only the rules whose constants match, so its cost is flat in the "+
			"number of rules. Rules it cannot index (contains, regex.match, a function of the input) are each "+
			"evaluated: linear in their number, bounded by the policy's size. Memory grows "+
			"linearly with the rules, compiled once per load. A cached decision does not depend "+
			"on the rules.")
	stampPolicyCurve(&c)
	return c, nil
}

// measurePolicyForms adds to c, for each form, a series of uncached and one of cached
// decisions: each point a policy of that size, measured beside the form at o.sizes[0].
func measurePolicyForms(ctx context.Context, c *Curve, o policyCurveOptions, forms []policyForm) error {
	base := o.sizes[0]
	for _, f := range forms {
		uncached := Series{Name: f.name + ", uncached"}
		cached := Series{Name: f.name + ", cached"}
		baseEngine, baseHeap, baseLoad, err := loadCurvePolicy(ctx, f, base)
		if err != nil {
			return err
		}
		for _, n := range o.sizes {
			e, heap, load, err := loadCurvePolicy(ctx, f, n)
			if err != nil {
				return err
			}
			for _, vary := range []bool{true, false} {
				host, prefix := f.request(n)
				point := &policyDecider{e: e, host: host, prefix: prefix, vary: vary}
				host, prefix = f.request(base)
				baseline := &policyDecider{e: baseEngine, host: host, prefix: prefix, vary: vary}
				y, by, err := measurePolicyPair(ctx, point, baseline, o)
				if err != nil {
					return fmt.Errorf("%s at %d: %w", f.name, n, err)
				}
				p := Point{X: float64(n), Y: y.us, Baseline: by.us, Extra: map[string]float64{
					"heap_mib": policyMiB(heap), "baseline_heap_mib": policyMiB(baseHeap),
					"allocs_per_decision": y.allocs, "baseline_allocs_per_decision": by.allocs,
					"load_ms": policyMs(load), "baseline_load_ms": policyMs(baseLoad),
				}}
				if vary {
					uncached.Points = append(uncached.Points, p)
				} else {
					cached.Points = append(cached.Points, p)
				}
			}
			runtime.KeepAlive(e)
		}
		runtime.KeepAlive(baseEngine)
		c.Series = append(c.Series, uncached, cached)
	}
	return nil
}

// loadCurvePolicy loads form f at size n and reports the heap the loaded policy holds (data,
// compiled rules, the evaluator's copy of the data) and the time it took to load.
func loadCurvePolicy(ctx context.Context, f policyForm, n int) (*policy.Engine, uint64, time.Duration, error) {
	fsys, err := f.files(n)
	if err != nil {
		return nil, 0, 0, err
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	e, err := policy.New(ctx, fsys)
	took := time.Since(start)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("%s at %d: %w", f.name, n, err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(fsys) // counted before and after: the difference is the Engine's
	var held uint64
	if after.HeapAlloc > before.HeapAlloc {
		held = after.HeapAlloc - before.HeapAlloc
	}
	return e, held, took, nil
}

// policyDecider decides requests to host: with vary, each to a path never asked before (a cache
// miss, evaluated); without, the same request each time (a cache hit after the first).
type policyDecider struct {
	e      *policy.Engine
	host   string
	prefix string
	vary   bool
	seq    int
}

type policySlice struct{ us, allocs float64 }

// run decides for d (at least once) and returns the time and allocations per decision.
func (d *policyDecider) run(ctx context.Context, dur time.Duration) (policySlice, error) {
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	start := time.Now()
	n := 0
	for n == 0 || time.Since(start) < dur {
		path := d.prefix + "x"
		if d.vary {
			d.seq++
			path = d.prefix + strconv.Itoa(d.seq)
		}
		in := policy.Input{Phase: policy.PhaseRequest, AgentID: "bench", Method: "GET", Scheme: "https",
			Host: d.host, Port: 443, Path: path}
		dec, err := d.e.Decide(ctx, &in)
		if err != nil {
			return policySlice{}, err
		}
		if !dec.Allow {
			return policySlice{}, fmt.Errorf("GET https://%s%s denied: %s", d.host, path, dec.Reason)
		}
		n++
	}
	el := time.Since(start)
	runtime.ReadMemStats(&m1)
	return policySlice{us: float64(el.Nanoseconds()) / float64(n) / 1e3, allocs: float64(m1.Mallocs-m0.Mallocs) / float64(n)}, nil
}

// measurePolicyPair runs a and b in o.pairs pairs of adjacent slices, alternating which goes
// first, and returns each one's median per decision.
func measurePolicyPair(ctx context.Context, a, b *policyDecider, o policyCurveOptions) (policySlice, policySlice, error) {
	// Warm both: the first decision of a cached series fills the cache.
	for _, d := range []*policyDecider{a, b} {
		if _, err := d.run(ctx, o.slice/10); err != nil {
			return policySlice{}, policySlice{}, err
		}
	}
	var as, bs []policySlice
	for i := range o.pairs {
		order := []*policyDecider{a, b}
		if i%2 == 1 {
			order = []*policyDecider{b, a}
		}
		for _, d := range order {
			r, err := d.run(ctx, o.slice)
			if err != nil {
				return policySlice{}, policySlice{}, err
			}
			if d == a {
				as = append(as, r)
			} else {
				bs = append(bs, r)
			}
		}
	}
	return policyMedianSlice(as), policyMedianSlice(bs), nil
}

func policyMedianSlice(rs []policySlice) policySlice {
	us := make([]float64, len(rs))
	al := make([]float64, len(rs))
	for i, r := range rs {
		us[i], al[i] = r.us, r.allocs
	}
	return policySlice{us: policyMedian(us), allocs: policyMedian(al)}
}

func policyMedian(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func policyMiB(b uint64) float64 { return float64(b) / (1 << 20) }

func policyMs(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

// policyNote is the curve's note: what bounds the growth, and each series' ratio at the
// largest size to its baseline as measured.
func policyNote(c Curve, unit, why string) string {
	var parts []string
	for _, s := range c.Series {
		if len(s.Points) == 0 {
			continue
		}
		p := s.Points[len(s.Points)-1]
		if p.Baseline > 0 {
			parts = append(parts, fmt.Sprintf("%s: %.1f µs at %.0f %s, %.1f× its baseline", s.Name, p.Y, p.X, unit, p.Y/p.Baseline))
		}
	}
	return why + " Measured: " + strings.Join(parts, "; ") + "."
}

// stamp states the machine, the date and the commit on c.
func stampPolicyCurve(c *Curve) {
	c.Machine = machine()
	c.Date = time.Now().UTC().Format(time.RFC3339)
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		c.Commit = strings.TrimSpace(string(out))
	}
}
