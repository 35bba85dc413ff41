package integration

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/capbroker/capbroker/broker/budget/redistest"
	"github.com/capbroker/capbroker/internal/harness"
	"github.com/capbroker/capbroker/internal/testpki"
)

type benchBroker struct{ proxy, caFile string }

// startBenchBroker runs the built broker with the test policy and config after the
// listeners, CA and policy sections, for a benchmark; it is stopped when b ends.
func startBenchBroker(b *testing.B, config string, env []string) *benchBroker {
	dir := b.TempDir()
	if out, err := exec.Command(brokerBin, "ca", "init", "--out", filepath.Join(dir, "ca")).CombinedOutput(); err != nil {
		b.Fatalf("ca init: %v\n%s", err, out)
	}
	pol := filepath.Join(dir, "policies")
	if err := os.MkdirAll(pol, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pol, "broker.rego"), []byte(testPolicy), 0o644); err != nil {
		b.Fatal(err)
	}
	cfg := fmt.Sprintf("proxy: {listen: \"127.0.0.1:0\"}\nadmin: {listen: \"127.0.0.1:0\"}\nca: {cert_file: %q, key_file: %q}\n"+
		"policy: {dir: %q, mode: enforce}\naudit: {file: %q}\n", filepath.Join(dir, "ca", "ca.crt"), filepath.Join(dir, "ca", "ca.key"),
		pol, filepath.Join(dir, "audit.jsonl")) + config
	if err := os.WriteFile(filepath.Join(dir, "broker.yaml"), []byte(cfg), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(brokerBin, "run", "--config", filepath.Join(dir, "broker.yaml"))
	cmd.Env = append(harness.Env(), env...)
	logs := newLogTail()
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
	deadline := time.Now().Add(waitTimeout)
	for !strings.Contains(logs.String(), `"message":"listening"`) {
		if time.Now().After(deadline) {
			b.Fatalf("the broker did not start:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond) // polling a starting process
	}
	var l struct{ Proxy string }
	for _, line := range logs.snapshot() {
		if strings.Contains(line, `"message":"listening"`) {
			_ = json.Unmarshal([]byte(line), &l)
		}
	}
	return &benchBroker{proxy: l.Proxy, caFile: filepath.Join(dir, "ca", "ca.crt")}
}

// BenchmarkFleetOnOff: one broker with the fleet's features on (shared MCP sessions and held
// requests, per-agent caps synced every 100ms, the audit's instance field, a budget store in
// a real redis-server) against the same broker with them off, in alternating slices (pairs),
// on requests that need no round trip to Redis: the price of the fleet on the common path.
//
//	go test -run '^$' -bench BenchmarkFleetOnOff -benchtime 1x ./integration/
func BenchmarkFleetOnOff(b *testing.B) {
	srv := redistest.Start(b)
	pki := testpki.New(b, "bench upstream CA")
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	up.TLS = &tls.Config{Certificates: []tls.Certificate{pki.Leaf}}
	up.StartTLS()
	b.Cleanup(up.Close)
	token := randHex(16)
	env := []string{tokenEnv("bench-agent") + "=" + token, "CANARY_SECRET=sk-canary-" + randHex(8)}
	base := canaryConfig(pki.File, []string{"bench-agent"}, "")
	off := startBenchBroker(b, base, env)
	on := startBenchBroker(b, base+fmt.Sprintf(`budgets:
  store: {redis: {address: %q, key_prefix: "bench:"}}
fleet: {agent_requests_per_second: 1000000, agent_connections: 100000}
`, srv.Addr), env)
	client := func(bp *benchBroker) *http.Client {
		pu, _ := url.Parse(fmt.Sprintf("http://bench-agent:%s@%s", token, bp.proxy))
		pool := x509.NewCertPool()
		pem, err := os.ReadFile(bp.caFile)
		if err != nil {
			b.Fatal(err)
		}
		pool.AppendCertsFromPEM(pem)
		return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu), MaxIdleConnsPerHost: 64,
			TLSClientConfig: &tls.Config{RootCAs: pool}}}
	}
	cOn, cOff := client(on), client(off)
	slice := func(c *http.Client) float64 {
		var n atomic.Int64
		var wg sync.WaitGroup
		end := time.Now().Add(300 * time.Millisecond)
		for range 16 {
			wg.Go(func() {
				for time.Now().Before(end) {
					resp, err := c.Get(up.URL + "/open/bench")
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					n.Add(1)
				}
			})
		}
		wg.Wait()
		return float64(n.Load()) / 0.3
	}
	slice(cOn)
	slice(cOff) // warm both
	for range b.N {
		var ratios, rOn, rOff []float64
		for i := range 20 {
			var a, o float64
			if i%2 == 0 {
				a, o = slice(cOn), slice(cOff)
			} else {
				o, a = slice(cOff), slice(cOn)
			}
			rOn, rOff, ratios = append(rOn, a), append(rOff, o), append(ratios, a/o)
		}
		slices.Sort(ratios)
		slices.Sort(rOn)
		slices.Sort(rOff)
		b.ReportMetric(rOn[len(rOn)/2], "req/s-fleet-on")
		b.ReportMetric(rOff[len(rOff)/2], "req/s-fleet-off")
		b.ReportMetric(ratios[len(ratios)/2], "on/off-median")
	}
}
