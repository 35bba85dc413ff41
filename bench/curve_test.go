package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/capbroker/capbroker/credentials/vaulttest"
)

var builtBroker struct {
	once sync.Once
	bin  string
	err  error
	out  []byte
}

// brokerBinary builds the broker once for the curve tests.
func brokerBinary(t *testing.T) string {
	t.Helper()
	builtBroker.once.Do(func() {
		dir, err := os.MkdirTemp("", "brokerbench-test-")
		if err != nil {
			builtBroker.err = err
			return
		}
		builtBroker.bin = filepath.Join(dir, "broker")
		builtBroker.out, builtBroker.err = exec.Command("go", "build", "-o", builtBroker.bin, "../cmd/broker").CombinedOutput()
	})
	if builtBroker.err != nil {
		t.Fatalf("building the broker: %v: %s", builtBroker.err, builtBroker.out)
	}
	return builtBroker.bin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if builtBroker.bin != "" {
		os.RemoveAll(filepath.Dir(builtBroker.bin))
	}
	os.Exit(code)
}

// runQuickCurve runs the named curve in quick mode and checks its shape: every series has
// points, in increasing X, each with a measured value and its baseline.
func runQuickCurve(t *testing.T, name string) Curve {
	t.Helper()
	if testing.Short() {
		t.Skip("starts brokers and measures them; skipped with -short")
	}
	run, ok := curveRuns[name]
	if !ok {
		t.Fatalf("curve %q is not registered", name)
	}
	c, err := run(context.Background(), curveEnv{bin: brokerBinary(t), dir: t.TempDir(), quick: true})
	if err != nil {
		t.Fatal(err)
	}
	if c.Name != name || c.Machine == "" || c.Date == "" || len(c.Series) == 0 {
		t.Fatalf("curve header: %+v", c)
	}
	for _, s := range c.Series {
		if len(s.Points) < 2 {
			t.Fatalf("series %q: %d points, want at least 2", s.Name, len(s.Points))
		}
		for i, p := range s.Points {
			if i > 0 && p.X <= s.Points[i-1].X {
				t.Errorf("series %q: X not increasing at point %d: %v after %v", s.Name, i, p.X, s.Points[i-1].X)
			}
			if p.Y <= 0 || p.Baseline <= 0 {
				t.Errorf("series %q at %v: Y %v, baseline %v; want both measured", s.Name, p.X, p.Y, p.Baseline)
			}
		}
	}
	return c
}

func TestCurveAgents(t *testing.T) {
	c := runQuickCurve(t, "agents")
	for _, s := range c.Series {
		last := s.Points[len(s.Points)-1]
		if last.X != 10000 || last.Extra["rss_mib"] <= 0 {
			t.Errorf("series %q: last point %+v; want 10,000 agents with the broker's memory", s.Name, last)
		}
	}
}

func TestCurveHosts(t *testing.T) {
	c := runQuickCurve(t, "hosts")
	last := c.Series[0].Points[len(c.Series[0].Points)-1]
	if last.Extra["cache_entries"] < last.X {
		t.Errorf("after %v hosts the certificate cache holds %v leaves", last.X, last.Extra["cache_entries"])
	}
}

func TestCurveCredentials(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Vault and brokers; skipped with -short")
	}
	if _, err := vaulttest.Binary(); err != nil {
		if os.Getenv("CAPBROKER_REQUIRE_VAULT") == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	c := runQuickCurve(t, "credentials")
	last := c.Series[0].Points[len(c.Series[0].Points)-1]
	if last.Extra["ready_ms"] <= 0 || last.Extra["per_credential_per_refresh"] <= 0 {
		t.Errorf("last point %+v: want a readiness time and Vault requests", last)
	}
}
