package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/capbroker/capbroker/credentials/vaulttest"
	"github.com/capbroker/capbroker/internal/harness"
)

// The credentials curve: 1 to 1,000 credentials read from a real Vault (a dev server, KV v2),
// each its own secret. Each point is a broker with that many credentials, started beside a
// broker with one (the baseline, started just before or just after it, alternately), each
// reaching Vault through a counting reverse proxy of its own: how long each took to be ready
// (/readyz?strict: every credential read; the median of five starts), the Vault requests each made per minute at steady
// state (after its first refresh), the largest number in one second, and its memory.
func init() { registerCurve("credentials", curveCredentials) }

// vaultCounter is a reverse proxy in front of Vault counting the requests through it, per
// second since it started.
type vaultCounter struct {
	url   string
	srv   *http.Server
	mu    sync.Mutex
	start time.Time
	secs  []int
}

func startVaultCounter(vaultAddr string) (*vaultCounter, error) {
	target, err := url.Parse(vaultAddr)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64}
	vc := &vaultCounter{url: "http://" + ln.Addr().String(), start: time.Now()}
	vc.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		vc.mu.Lock()
		s := int(time.Since(vc.start) / time.Second)
		for len(vc.secs) <= s {
			vc.secs = append(vc.secs, 0)
		}
		vc.secs[s]++
		vc.mu.Unlock()
		rp.ServeHTTP(w, r)
	})}
	go func() { _ = vc.srv.Serve(ln) }()
	return vc, nil
}

// window returns the requests counted in [from, to) (times since the counter started, whole
// seconds) and the most in one second.
func (vc *vaultCounter) window(from, to int) (total, peak int) {
	vc.mu.Lock()
	defer vc.mu.Unlock()
	for s := from; s < to && s < len(vc.secs); s++ {
		total += vc.secs[s]
		peak = max(peak, vc.secs[s])
	}
	return total, peak
}

func (vc *vaultCounter) now() int { return int(time.Since(vc.start) / time.Second) }

// startVault runs a Vault dev server on a free loopback port (root token "root") and waits
// until it answers; stop kills it.
func startVault(ctx context.Context, dir string) (addr string, stop func(), err error) {
	bin, err := vaulttest.Binary()
	if err != nil {
		return "", nil, err
	}
	listen, err := harness.FreeAddr()
	if err != nil {
		return "", nil, err
	}
	home := filepath.Join(dir, "vault-home")
	if err := mkdirAll(home); err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "server", "-dev", "-dev-root-token-id=root", "-dev-listen-address="+listen, "-dev-no-store-token")
	for _, kv := range harness.Env() {
		if !strings.HasPrefix(kv, "VAULT_") && !strings.HasPrefix(kv, "HOME=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "HOME="+home)
	proc, err := startProcess(cmd, nil)
	if err != nil {
		return "", nil, err
	}
	stop = func() { _ = proc.cmd.Process.Kill(); <-proc.exited }
	addr = "http://" + listen
	client, err := vaulttest.NewClient(addr, "root")
	if err != nil {
		stop()
		return "", nil, err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		h, err := client.Sys().HealthWithContext(ctx)
		if err == nil && h.Initialized && !h.Sealed && !h.Standby {
			return addr, stop, nil
		}
		select {
		case <-proc.exited:
			return "", nil, fmt.Errorf("vault exited: %.2000s", proc.output())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, errors.New("vault not ready within a minute")
		}
	}
}

func credentialsConfig(caLines, polDir, vaultURL string, refresh time.Duration, n int) string {
	var b strings.Builder
	b.WriteString("proxy: {listen: \"127.0.0.1:0\"}\nadmin: {listen: \"127.0.0.1:0\"}\n")
	b.WriteString(caLines)
	fmt.Fprintf(&b, "policy: {dir: %q, mode: enforce}\nagents:\n  - {id: %s, token_env: BENCH_AGENT_TOKEN}\n", polDir, agentID)
	fmt.Fprintf(&b, "vault:\n  address: %s\n  refresh_interval: %s\n  auth: {method: token, token_env: BENCH_VAULT_TOKEN}\ncredentials:\n", vaultURL, refresh)
	for i := range n {
		fmt.Fprintf(&b, "  - {name: cred-%d, hosts: [\"h%d.bench.test\"], source: {vault: {mount: secret, path: bench/cred-%d, field: token}}, inject: {header: Authorization, value: \"Bearer {{secret}}\"}}\n", i, i, i)
	}
	return b.String()
}

func curveCredentials(ctx context.Context, env curveEnv) (Curve, error) {
	refresh, settle, window := 10*time.Second, 12*time.Second, 20*time.Second
	sizes := []int{1, 10, 100, 1000}
	if env.quick {
		refresh, settle, window = 2*time.Second, 3*time.Second, 4*time.Second
		sizes = []int{1, 20}
	}
	c := Curve{Name: "credentials", Title: "Vault-backed credentials: Vault requests at steady state",
		XLabel: "credentials (Vault KV v2)", YLabel: fmt.Sprintf("Vault requests per minute (refresh_interval %s)", refresh), LogX: true, LogY: true}
	curveHeader(&c)
	vaultAddr, stopVault, err := startVault(ctx, env.dir)
	if err != nil {
		return c, err
	}
	defer stopVault()
	client, err := vaulttest.NewClient(vaultAddr, "root")
	if err != nil {
		return c, err
	}
	for i := range sizes[len(sizes)-1] {
		if _, err := client.KVv2("secret").Put(ctx, fmt.Sprintf("bench/cred-%d", i), map[string]any{"token": fmt.Sprintf("vault-secret-%d", i)}); err != nil {
			return c, fmt.Errorf("seeding vault: %w", err)
		}
	}
	start := func(name string, n int, vc *vaultCounter) (*curveBroker, time.Duration, error) {
		dir := filepath.Join(env.dir, name)
		caLines, err := curveCA(env.bin, dir)
		if err != nil {
			return nil, 0, err
		}
		polDir := filepath.Join(dir, "policies")
		if err := mkdirAll(polDir); err != nil {
			return nil, 0, err
		}
		if err := writeAllowAll(polDir); err != nil {
			return nil, 0, err
		}
		b, err := startCurveBroker(env.bin, dir, credentialsConfig(caLines, polDir, vc.url, refresh, n),
			"BENCH_AGENT_TOKEN=bench-token", "BENCH_VAULT_TOKEN=root")
		if err != nil {
			return nil, 0, err
		}
		ready, err := b.readyAfter(ctx, 2*time.Minute)
		if err != nil {
			b.stop()
			return nil, 0, err
		}
		return b, ready, nil
	}
	s := Series{Name: "Vault requests per minute"}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	readyStarts := 4
	if env.quick {
		readyStarts = 1
	}
	for k, n := range sizes {
		vc, err := startVaultCounter(vaultAddr)
		if err != nil {
			return c, err
		}
		bvc, err := startVaultCounter(vaultAddr)
		if err != nil {
			vc.srv.Close()
			return c, err
		}
		var b, base *curveBroker
		var ready, baseReady time.Duration
		order := []bool{k%2 == 0, k%2 != 0} // true: the baseline
		for _, isBase := range order {
			if isBase {
				base, baseReady, err = start(fmt.Sprintf("credentials-%d-base", n), 1, bvc)
			} else {
				b, ready, err = start(fmt.Sprintf("credentials-%d", n), n, vc)
			}
			if err != nil {
				break
			}
		}
		stopAll := func() {
			for _, x := range []*curveBroker{b, base} {
				if x != nil {
					x.stop()
				}
			}
			vc.srv.Close()
			bvc.srv.Close()
		}
		if err != nil {
			stopAll()
			return c, fmt.Errorf("%d credentials: %w", n, err)
		}
		startup, _ := vc.window(0, vc.now()+1)
		// Readiness is noisy on a shared machine: the pair is started readyStarts more times,
		// alternately, each stopped once ready, and the medians kept.
		readies, baseReadies := []float64{ms(ready)}, []float64{ms(baseReady)}
		for r := range readyStarts {
			for _, isBase := range []bool{r%2 == 0, r%2 != 0} {
				name, size, counter := fmt.Sprintf("credentials-%d-again-%d", n, r), n, vc
				if isBase {
					name, size, counter = fmt.Sprintf("credentials-%d-base-again-%d", n, r), 1, bvc
				}
				x, d, err := start(name, size, counter)
				if err != nil {
					stopAll()
					return c, fmt.Errorf("%d credentials, started again: %w", n, err)
				}
				x.stop()
				if isBase {
					baseReadies = append(baseReadies, ms(d))
				} else {
					readies = append(readies, ms(d))
				}
			}
		}
		// Steady state: past the first refresh of every credential.
		time.Sleep(settle)
		from, bfrom := vc.now()+1, bvc.now()+1
		ready, baseReady = time.Duration(median(readies)*1e6), time.Duration(median(baseReadies)*1e6)
		time.Sleep(window + 1100*time.Millisecond)
		secs := int(window / time.Second)
		total, peak := vc.window(from, from+secs)
		btotal, bpeak := bvc.window(bfrom, bfrom+secs)
		perMin := float64(total) * float64(time.Minute) / float64(window)
		basePerMin := float64(btotal) * float64(time.Minute) / float64(window)
		rss, baseRSS := settledRSS(b.process), settledRSS(base.process)
		heap, baseHeap := b.heapMiB(ctx), base.heapMiB(ctx)
		s.Points = append(s.Points, Point{X: float64(n), Y: round3(perMin), Baseline: round3(basePerMin), Extra: map[string]float64{
			"per_credential_per_refresh": round3(float64(total) / (float64(window) / float64(refresh)) / float64(n)),
			"peak_per_second":            float64(peak), "baseline_peak_per_second": float64(bpeak),
			"startup_requests": float64(startup),
			"ready_ms":         float64(ready.Milliseconds()), "baseline_ready_ms": float64(baseReady.Milliseconds()),
			"ready_ms_min": round3(minOf(readies)), "ready_ms_max": round3(maxOf(readies)),
			"baseline_ready_ms_min": round3(minOf(baseReadies)), "baseline_ready_ms_max": round3(maxOf(baseReadies)),
			"rss_mib": round3(rss), "baseline_rss_mib": round3(baseRSS), "heap_mib": round3(heap), "baseline_heap_mib": round3(baseHeap),
		}})
		fmt.Fprintf(stderr, "  credentials=%-4d %6.0f Vault req/min (baseline %.0f), peak %d/s, %d at start; ready %s (baseline %s); RSS %.1f MiB (baseline %.1f), heap %.1f (%.1f)\n",
			n, perMin, basePerMin, peak, startup, ready.Round(time.Millisecond), baseReady.Round(time.Millisecond), rss, baseRSS, heap, baseHeap)
		stopAll()
	}
	c.Series = []Series{s}
	c.Note = "Each credential is read once per refresh_interval (one KV read; a lease is renewed on " +
		"Vault's schedule instead): Vault requests grow linearly with the credentials, no faster, and " +
		"the first background re-read of each comes a random part of the interval early, once, so " +
		"that the reads spread over the interval. Readiness grows linearly too: every credential is " +
		"read once at start, up to 16 at a time, before the broker listens. Memory grows linearly: " +
		"each credential has a goroutine keeping it fresh and its cached value."
	return c, nil
}
