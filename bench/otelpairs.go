package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/capbroker/capbroker/internal/harness"
)

// otelPairs is -only otel-pairs: the cost of exporting the audit events and the request spans
// over OTLP (gRPC) to a local OpenTelemetry Collector, in pairs of adjacent slices at conns
// connections: the full pipeline with telemetry (logs and traces; the same tracing a tenth of
// the requests; logs alone, to tell the costs apart) over the same pipeline without it. The collector (integration/testdata/otelcol, built once and cached) writes what
// it receives to /dev/null, with GOMAXPROCS=1 so that it takes at most one core of the
// machine from the broker; its CPU per request is printed beside the ratio.
func otelPairs(ctx context.Context, bin, dir string, up *upstream, p *pki, full *path, o options) error {
	col, addr, err := startBenchCollector(filepath.Join(dir, "otelcol"))
	if err != nil {
		return err
	}
	defer col.stop()
	fmt.Fprintln(os.Stderr, "full pipeline with OTLP logs and traces, then with logs alone, over without, paired...")
	before := col.cpu()
	for _, v := range []struct{ name, signals string }{
		{"full-otel", "[logs, traces]"},
		{"full-otel-tenth", "[logs, traces]\n  trace_ratio: 0.1"},
		{"full-otel-logs", "[logs]"},
	} {
		tel := fmt.Sprintf("telemetry:\n  endpoint: \"http://%s\"\n  signals: %s\n", addr, v.signals)
		withTel, err := startBrokerWith(bin, filepath.Join(dir, v.name), up, p, true, "", tel)
		if err != nil {
			return err
		}
		otel := &path{name: v.name, url: full.url, via: withTel.intercepting(), proc: withTel.process}
		for _, pa := range []*path{full, otel} {
			pa.client = pa.withConns(p, o.conns)
			if err := pa.check(ctx); err != nil {
				withTel.stop()
				return fmt.Errorf("%s: %w", pa.name, err)
			}
		}
		pairedRatio(ctx, otel, full, o.conns, max(o.pairs, 1), o.slice).print(os.Stdout, "full with OTLP "+strings.ReplaceAll(v.signals, "\n ", ",")+"/full")
		withTel.stop()
	}
	fmt.Printf("collector CPU during the pairs: %.2f s (GOMAXPROCS=1)\n", (col.cpu() - before).Seconds())
	return nil
}

// startBenchCollector builds (or takes from the cache) the test collector and runs it with an
// OTLP gRPC receiver on a free loopback port, exporting to /dev/null.
func startBenchCollector(dir string) (*process, string, error) {
	bin, err := collectorBinary()
	if err != nil {
		return nil, "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	addr, err := harness.FreeAddr()
	if err != nil {
		return nil, "", err
	}
	conf := fmt.Sprintf(`receivers:
  otlp:
    protocols:
      grpc: {endpoint: %q}
exporters:
  file: {path: /dev/null}
service:
  telemetry: {metrics: {level: none}}
  pipelines:
    logs: {receivers: [otlp], exporters: [file]}
    traces: {receivers: [otlp], exporters: [file]}
`, addr)
	confFile := filepath.Join(dir, "otelcol.yaml")
	if err := os.WriteFile(confFile, []byte(conf), 0o644); err != nil {
		return nil, "", err
	}
	cmd := exec.Command(bin, "--config", "file:"+confFile)
	cmd.Env = append(harness.Env(), "GOMAXPROCS=1")
	proc, err := startServing(cmd, addr)
	return proc, addr, err
}

// collectorBinary builds integration/testdata/otelcol (a module of its own), cached under the
// user cache directory by the hash of its files, as the integration tests do.
func collectorBinary() (string, error) {
	src := filepath.Join("integration", "testdata", "otelcol")
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum", "main.go"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			return "", fmt.Errorf("the test collector (run from the repository root): %w", err)
		}
		h.Write(b)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	bin := filepath.Join(cache, "capbroker-otelcol", hex.EncodeToString(h.Sum(nil))[:16], "otelcol")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	fmt.Fprintln(os.Stderr, "building the OpenTelemetry Collector (about a minute, once)...")
	build := exec.Command("go", "build", "-o", bin+".tmp", ".")
	build.Dir = src
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("building the test collector: %w", err)
	}
	return bin, os.Rename(bin+".tmp", bin)
}
