package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// selectCurves reads -curves: "none" (or empty), "all", or names of registered curves.
func selectCurves(spec string) ([]string, error) {
	switch spec = strings.TrimSpace(spec); spec {
	case "", "none":
		return nil, nil
	case "all":
		return slices.Sorted(func(yield func(string) bool) {
			for name := range curveRuns {
				if !yield(name) {
					return
				}
			}
		}), nil
	}
	var names []string
	for _, n := range strings.Split(spec, ",") {
		n = strings.TrimSpace(n)
		if _, ok := curveRuns[n]; !ok {
			return nil, fmt.Errorf("-curves: no curve %q (registered: %s)", n, strings.Join(registeredCurves(), ", "))
		}
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names, nil
}

func registeredCurves() []string {
	names, _ := selectCurves("all")
	return names
}

// curveFiles is how many file descriptors the curves may need: 10,000 idle connections are
// held by the bench (the agents' ends and the upstream's) and by the broker.
const curveFiles = 65536

// runCurves measures the named curves one after another, each with a broker binary built for
// the run and a scratch directory of its own, and writes each as JSON (writeCurve). A curve
// that fails is reported and the others still run; the error names the ones that failed.
func runCurves(ctx context.Context, names []string, quick bool) error {
	if n, err := raiseFileLimit(curveFiles); err != nil || n < curveFiles {
		fmt.Fprintf(stderr, "curves: open files limited to %d (raising the limit to %d: %v)\n", n, curveFiles, err)
	}
	dir, err := os.MkdirTemp("", "brokerbench-curves-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin, err := buildBroker(dir)
	if err != nil {
		return err
	}
	mach, commit := machine(), gitCommit()
	var failed []string
	for _, name := range names {
		start := time.Now()
		fmt.Fprintf(stderr, "curve %s...\n", name)
		env := curveEnv{bin: bin, dir: filepath.Join(dir, name), quick: quick}
		if err := os.MkdirAll(env.dir, 0o755); err != nil {
			return err
		}
		c, err := curveRuns[name](ctx, env)
		os.RemoveAll(env.dir)
		if err != nil {
			fmt.Fprintf(stderr, "curve %s: %v\n", name, err)
			failed = append(failed, name)
			continue
		}
		if c.Name == "" {
			c.Name = name
		}
		if c.Machine == "" {
			c.Machine = mach
		}
		if c.Date == "" {
			c.Date = start.UTC().Format("2006-01-02")
		}
		if c.Commit == "" {
			c.Commit = commit
		}
		if err := writeCurve(c); err != nil {
			return err
		}
		printCurve(c)
		fmt.Fprintf(stderr, "curve %s: %s in %.0f s\n", name, filepath.Join(curvesDir, c.Name+".json"), time.Since(start).Seconds())
	}
	if len(failed) > 0 {
		return fmt.Errorf("curves failed: %s", strings.Join(failed, ", "))
	}
	return nil
}

// printCurve writes c's points to stdout, a line each.
func printCurve(c Curve) {
	fmt.Printf("\n%s (%s by %s)\n", c.Title, c.YLabel, c.XLabel)
	for _, s := range c.Series {
		for _, p := range s.Points {
			fmt.Printf("  %-24s x=%-8g y=%-10.4g", s.Name, p.X, p.Y)
			if p.Baseline != 0 {
				fmt.Printf(" baseline=%-10.4g (%.2fx)", p.Baseline, p.Y/p.Baseline)
			}
			for _, k := range slices.Sorted(func(yield func(string) bool) {
				for k := range p.Extra {
					if !yield(k) {
						return
					}
				}
			}) {
				fmt.Printf(" %s=%.4g", k, p.Extra[k])
			}
			fmt.Println()
		}
	}
	if c.Note != "" {
		fmt.Printf("  note: %s\n", c.Note)
	}
}

// raiseFileLimit raises the soft limit on open files to want, and the hard one too when the
// bench may (as root). Children inherit both; the broker, a Go program, raises its own soft
// limit to the hard one. It returns the soft limit now in force.
func raiseFileLimit(want uint64) (uint64, error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, err
	}
	if r.Cur >= want {
		return r.Cur, nil
	}
	n := r
	n.Cur, n.Max = want, max(r.Max, want)
	err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &n)
	if err == nil {
		return want, nil
	}
	n = r
	n.Cur = r.Max
	if err2 := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &n); err2 != nil {
		err = err2
	}
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r)
	return r.Cur, err
}

// openFiles counts the open file descriptors of a process.
func openFiles(pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0
	}
	return len(ents)
}

// withLimits runs f with the brokers it starts allowed limits (proxyLimits), and restores
// the bench's own after.
func withLimits(limits string, f func() error) error {
	saved := proxyLimits
	proxyLimits = limits
	defer func() { proxyLimits = saved }()
	return f()
}

// afterMain runs what the bench does besides its main run: the curves of -curves, then the
// charts (-charts). only is -only: "curves" skips the main run, "charts" only draws.
func afterMain(ctx context.Context, curves []string, quick, charts bool, results string) error {
	var errs []error
	if len(curves) > 0 {
		errs = append(errs, runCurves(ctx, curves, quick))
	}
	if charts {
		drawn, err := drawCharts(results, curvesDir, chartsDir)
		for _, f := range drawn {
			fmt.Fprintln(stderr, "chart:", f)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
