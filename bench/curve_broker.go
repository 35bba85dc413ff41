package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/capbroker/capbroker/internal/harness"
)

// This file holds what the agents, hosts and credentials curves share: a broker started from
// a config of the curve's own, and a point measured in slices alternating with its baseline.

// curveBroker is a broker a curve started with its own config.
type curveBroker struct {
	*broker
	admin string // the admin listener's host:port
	// listening is how long after its start the broker said it was listening.
	listening time.Duration
	started   time.Time
}

// curveCA initialises a broker CA in dir/ca and returns the config lines naming it.
func curveCA(bin, dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if out, err := exec.Command(bin, "ca", "init", "--out", filepath.Join(dir, "ca")).CombinedOutput(); err != nil {
		return "", fmt.Errorf("ca init: %v: %s", err, out)
	}
	return fmt.Sprintf("ca: {cert_file: %q, key_file: %q}\n", filepath.Join(dir, "ca", "ca.crt"), filepath.Join(dir, "ca", "ca.key")), nil
}

// startCurveBroker writes cfg (which must name dir's CA, from curveCA) to dir/broker.yaml and
// runs the broker with env added to its environment, its audit events discarded.
func startCurveBroker(bin, dir, cfg string, env ...string) (*curveBroker, error) {
	cfgFile := filepath.Join(dir, "broker.yaml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "run", "--config", cfgFile)
	cmd.Env = append(harness.Env(), env...)
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	defer devNull.Close()
	cmd.Stdout = devNull
	listening := make(chan string, 1)
	start := time.Now()
	proc, err := startProcess(cmd, func(line string) {
		if strings.Contains(line, `"message":"listening"`) {
			select {
			case listening <- line:
			default:
			}
		}
	})
	if err != nil {
		return nil, err
	}
	b := &curveBroker{broker: &broker{process: proc}, started: start}
	select {
	case line := <-listening:
		b.listening = time.Since(start)
		var l struct{ Proxy, Admin string }
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			b.stop()
			return nil, err
		}
		b.proxyAddr, b.admin = l.Proxy, l.Admin
	case <-proc.exited:
		return nil, fmt.Errorf("broker exited at start: %.2000s", proc.output())
	case <-time.After(2 * time.Minute):
		b.stop()
		return nil, errors.New("broker did not start listening within 2m")
	}
	if b.caPool, err = poolFromFile(filepath.Join(dir, "ca", "ca.crt")); err != nil {
		b.stop()
		return nil, err
	}
	return b, nil
}

// readyAfter polls /readyz?strict (every credential read, the policy loaded) until it answers
// 200, and returns how long after the broker's start that was.
func (b *curveBroker) readyAfter(ctx context.Context, limit time.Duration) (time.Duration, error) {
	c := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 5 * time.Second}
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.admin+"/readyz?strict", nil)
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Since(b.started), nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-b.exited:
			return 0, fmt.Errorf("broker exited: %.2000s", b.output())
		case <-time.After(5 * time.Millisecond):
		}
	}
	return 0, fmt.Errorf("not ready after %s", limit)
}

// settledRSS is the process's resident memory after a garbage collection has had a moment:
// the broker's idle heap, not the garbage of the last phase (read twice, the smaller kept).
func settledRSS(p *process) float64 {
	time.Sleep(300 * time.Millisecond)
	a := p.rss()
	time.Sleep(300 * time.Millisecond)
	return float64(min(a, p.rss())) / (1 << 20)
}

// slicePair is a point measured beside its baseline: throughput and the proxy's CPU time
// per request of each, medians over pairs of adjacent slices (baseline first in one pair,
// the point first in the next).
type slicePair struct {
	rps, baseRPS, cpu, baseCPU float64
	ratios                     []float64 // point over baseline, one per pair
}

func measurePair(ctx context.Context, pt, base *path, conns, pairs int, d time.Duration) slicePair {
	var rps, baseRPS, cpu, baseCPU, ratios []float64
	for i := range max(pairs, 1) {
		n, m := adjacentSlices(ctx, i, pt, base, conns, d)
		rps, baseRPS = append(rps, n.rps), append(baseRPS, m.rps)
		cpu, baseCPU = append(cpu, n.cpuPerReq), append(baseCPU, m.cpuPerReq)
		if m.rps > 0 {
			ratios = append(ratios, n.rps/m.rps)
		}
	}
	return slicePair{rps: median(rps), baseRPS: median(baseRPS), cpu: median(cpu), baseCPU: median(baseCPU), ratios: ratios}
}

// curveHeader fills in what every chart states: the machine, the date and the commit.
func curveHeader(c *Curve) {
	c.Machine = machine()
	c.Date = time.Now().UTC().Format("2006-01-02")
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		c.Commit = strings.TrimSpace(string(out))
	}
}

// curveSizes picks a curve's sizes: all of them, or in quick mode the first and the last.
func curveSizes(env curveEnv, all []int) []int {
	if env.quick && len(all) > 2 {
		return []int{all[0], all[len(all)-1]}
	}
	return all
}

func mkdirAll(dir string) error { return os.MkdirAll(dir, 0o755) }

// metrics reads the broker's /metrics and returns the samples without labels.
func (b *curveBroker) metrics(ctx context.Context) map[string]float64 {
	c := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 5 * time.Second}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.admin+"/metrics", nil)
	resp, err := c.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		name, v, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") {
			continue
		}
		if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
			m[name] = f
		}
	}
	return m
}

// heapMiB is the broker's heap as its metrics say (go_memstats_heap_alloc_bytes: live objects
// and garbage not yet collected), in MiB.
func (b *curveBroker) heapMiB(ctx context.Context) float64 {
	return b.metrics(ctx)["go_memstats_heap_alloc_bytes"] / (1 << 20)
}

// liveHeapMiB estimates the broker's live heap, in MiB: half the heap size at which its next
// collection starts (go_memstats_next_gc_bytes; GOGC 100 sets it at twice what the last
// collection left live, and at least 4 MiB).
func (b *curveBroker) liveHeapMiB(ctx context.Context) float64 {
	return b.metrics(ctx)["go_memstats_next_gc_bytes"] / 2 / (1 << 20)
}
