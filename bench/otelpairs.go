package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/capbroker/capbroker/internal/harness"
)

// otelPairs is -only otel-pairs: the cost of exporting the audit events and the request spans
// over OTLP (gRPC), in pairs of adjacent slices at conns connections: the full pipeline with
// telemetry (logs and traces; the same tracing a tenth of the requests; logs alone, to tell
// the costs apart) over the same pipeline without it, each exporting to two receivers in turn.
// First the OpenTelemetry Collector (integration/testdata/otelcol, built once and cached),
// writing what it receives to /dev/null; then the bench's minimal OTLP sink (otelsink.go),
// which decodes and discards. Both run with GOMAXPROCS=1, on the machine's cores: the
// collector's CPU is taken from the broker in a CPU-bound run, the sink's far less, so the pair
// of figures shows the broker's own cost apart from the receiver's. Each receiver's CPU is
// printed, and with the sink what it received per audit event (spans and log records).
func otelPairs(ctx context.Context, bin, dir string, up *upstream, p *pki, full *path, o options) error {
	col, colAddr, err := startBenchCollector(filepath.Join(dir, "otelcol"))
	if err != nil {
		return err
	}
	defer col.stop()
	sink, sinkAddr, err := startOTLPSink()
	if err != nil {
		return err
	}
	defer sink.stop()
	fmt.Fprintln(os.Stderr, "full pipeline with OTLP logs and traces, then with logs alone, over without, paired; to the collector, then to the minimal sink...")
	for _, rx := range []struct {
		name, addr string
		proc       *process
		sink       *sinkProcess
	}{{"collector", colAddr, col, nil}, {"sink", sinkAddr, sink.process, sink}} {
		before := rx.proc.cpu()
		fmt.Printf("to the %s:\n", rx.name)
		for _, v := range []struct{ name, signals string }{
			{"full-otel", "[logs, traces]"},
			{"full-otel-tenth", "[logs, traces]\n  trace_ratio: 0.1"},
			{"full-otel-logs", "[logs]"},
		} {
			name := v.name + "-" + rx.name
			tel := fmt.Sprintf("telemetry:\n  endpoint: \"http://%s\"\n  signals: %s\n", rx.addr, v.signals)
			withTel, err := startBrokerWith(bin, filepath.Join(dir, name), up, p, true, "", tel)
			if err != nil {
				return err
			}
			otel := &path{name: name, url: full.url, via: withTel.intercepting(), proc: withTel.process}
			for _, pa := range []*path{full, otel} {
				pa.client = pa.withConns(p, o.conns)
				if err := pa.check(ctx); err != nil {
					withTel.stop()
					return fmt.Errorf("%s: %w", pa.name, err)
				}
			}
			var spans0, records0 int64
			if rx.sink != nil {
				spans0, records0 = rx.sink.spans.Load(), rx.sink.records.Load()
			}
			rxCPU := rx.proc.cpu()
			warmUp(ctx, otel, o.conns, o.slice)
			pairedRatio(ctx, otel, full, o.conns, max(o.pairs, 1), o.slice).print(os.Stdout, "full with OTLP "+strings.ReplaceAll(v.signals, "\n ", ",")+" to the "+rx.name+"/full")
			withTel.stop() // exports what is queued
			if rx.sink != nil {
				events := auditLines(withTel.auditFile)
				spans, records := rx.sink.received(spans0, records0)
				fmt.Printf("  the sink received %.2f spans and %.2f log records per audit event (%d events), with %.1f µs of its CPU each\n",
					float64(spans)/float64(max(events, 1)), float64(records)/float64(max(events, 1)), events,
					float64((rx.proc.cpu()-rxCPU).Microseconds())/float64(max(events, 1)))
			}
		}
		fmt.Printf("%s CPU during its pairs: %.2f s (GOMAXPROCS=1)\n", rx.name, (rx.proc.cpu() - before).Seconds())
	}
	return nil
}

// otelCost is the whole run's measure of issue 36's target: the full pipeline exporting OTLP
// logs and traces (every request traced) to the minimal sink, over the same pipeline without
// telemetry, in pairs at 32 connections; the sink's counts show nothing was dropped.
type otelCost struct {
	paired
	SpansPerEvent   float64 `json:"spans_per_event"`
	RecordsPerEvent float64 `json:"records_per_event"`
	// SinkUS is the sink's CPU microseconds per audit event: on this machine, not the broker's.
	SinkUS float64 `json:"sink_us_per_event"`
}

func measureOTelCost(ctx context.Context, bin, dir string, up *upstream, p *pki, full *path, pairs int, slice time.Duration) (*otelCost, error) {
	sink, addr, err := startOTLPSink()
	if err != nil {
		return nil, err
	}
	defer sink.stop()
	tel := fmt.Sprintf("telemetry:\n  endpoint: \"http://%s\"\n  signals: [logs, traces]\n", addr)
	withTel, err := startBrokerWith(bin, filepath.Join(dir, "full-otel"), up, p, true, "", tel)
	if err != nil {
		return nil, err
	}
	otel := &path{name: "full-otel", url: full.url, via: withTel.intercepting(), proc: withTel.process}
	for _, pa := range []*path{full, otel} {
		pa.client = pa.withConns(p, 32)
		if err := pa.check(ctx); err != nil {
			withTel.stop()
			return nil, fmt.Errorf("%s: %w", pa.name, err)
		}
	}
	sinkCPU := sink.cpu()
	warmUp(ctx, otel, 32, slice)
	r := &otelCost{paired: pairedRatio(ctx, otel, full, 32, pairs, slice)}
	withTel.stop() // exports what is queued
	events := float64(max(auditLines(withTel.auditFile), 1))
	spans, records := sink.received(0, 0)
	r.SpansPerEvent, r.RecordsPerEvent = round3(float64(spans)/events), round3(float64(records)/events)
	r.SinkUS = round3(float64((sink.cpu() - sinkCPU).Microseconds()) / events)
	return r, nil
}

// warmUp runs a broker started for a pair under load for two slices, unmeasured, before its
// pairs: against the run's full broker, warm from the phases before, its first second (its
// heap growing and faulted in, its pools filling) cost it 1.37-1.41x that broker's CPU per
// request where the pairs after read about 1.15x, and in a run of ten pairs moved the median.
func warmUp(ctx context.Context, pa *path, conns int, slice time.Duration) {
	pa.closedLoop(ctx, conns, 2*slice)
}

// auditLines counts the events in an audit file.
func auditLines(file string) int {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	return bytes.Count(b, []byte("\n"))
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
