package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
)

// A Curve is how one cost grows as a deployment grows (issue 25): each point is measured
// beside its own baseline, in the same run, so that a point reads as a ratio to the state of
// the machine when it was taken, not only as an absolute figure. Curves are written as JSON
// under bench/results/curves/ and drawn as charts under docs/benchmarks/.
type Curve struct {
	Name   string `json:"name"`  // file name: agents, policy-data, hosts, idle, credentials, concurrency
	Title  string `json:"title"` // the chart's title
	XLabel string `json:"x_label"`
	YLabel string `json:"y_label"`
	LogX   bool   `json:"log_x"`
	LogY   bool   `json:"log_y,omitempty"`
	// Series are the lines drawn: one per form measured (cached and uncached decisions, set
	// and array allow-lists...).
	Series []Series `json:"series"`
	// Note says what bounds the growth where it is not logarithmic per request, and why.
	Note string `json:"note,omitempty"`
	// Machine, Date and Commit are stated on every chart.
	Machine string `json:"machine"`
	Date    string `json:"date"`
	Commit  string `json:"commit"`
}

type Series struct {
	Name   string  `json:"name"`
	Points []Point `json:"points"`
}

// Point is one measurement, Y at X, and Baseline, the same measure taken beside it at the
// curve's smallest size (or with the feature off), in adjacent slices.
type Point struct {
	X        float64 `json:"x"`
	Y        float64 `json:"y"`
	Baseline float64 `json:"baseline,omitempty"`
	// Extra holds a point's other figures (memory, file descriptors, p99...) by name.
	Extra map[string]float64 `json:"extra,omitempty"`
}

// curvesDir is where curves are written as JSON.
const curvesDir = "bench/results/curves"

// writeCurve stores c as curvesDir/<name>.json.
func writeCurve(c Curve) error {
	if err := os.MkdirAll(curvesDir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(curvesDir, c.Name+".json"), append(b, '\n'), 0o644)
}

// curveEnv is what a curve's measurement is given: the broker binary built for this run and a
// scratch directory of its own (removed afterwards). Each curve starts its own upstream,
// brokers and clients (see setup.go), so curves run one at a time and apart from the rest.
type curveEnv struct {
	bin string
	dir string
	// quick asks for fewer and shorter points (make bench's quick mode).
	quick bool
}

// curveRuns are the curves `go run ./bench -curves NAME,...` measures, registered by each
// curve's file in its init function.
var curveRuns = map[string]func(ctx context.Context, env curveEnv) (Curve, error){}

func registerCurve(name string, run func(ctx context.Context, env curveEnv) (Curve, error)) {
	curveRuns[name] = run
}

// upstream starts the curve's TLS upstream, with a CA of its own in env.dir; the caller closes it.
func (env curveEnv) upstream() (*pki, *upstream, error) {
	p, err := newPKI("brokerbench curve CA", filepath.Join(env.dir, "upstream-ca.pem"), 0)
	if err != nil {
		return nil, nil, err
	}
	up, err := startUpstream(p, 0)
	return p, up, err
}
