package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/capbroker/capbroker/broker/budget/redistest"
)

// TestBudgetAcrossBrokers: three brokers (the built binary) share a real redis-server. A
// requests budget of 60 a day for an agent, under concurrent load through all three, lets
// exactly 60 requests reach the upstream (the check and the count are one atomic script, so
// the overshoot is 0) and refuses the rest with 429 budget_exceeded and Retry-After; it still
// holds after a broker restarts and after Redis restarts (its append-only file keeps the
// counter); `broker usage` reports it; with Redis down the budget fails closed (503).
func TestBudgetAcrossBrokers(t *testing.T) {
	srv := redistest.Start(t)
	pki := newUpstreamPKI(t)
	var reached atomic.Int64
	up := pki.serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		_, _ = io.WriteString(w, "ok")
	}), false, nil)
	const agent, limit = "coder-1", 60
	token, token2 := randHex(16), randHex(16)
	opts := brokerOpts{
		policy: testPolicy,
		files: map[string]string{"budgets.json": `{"budgets": {"agent-day":
		  {"agent": "coder-1", "requests": ` + strconv.Itoa(limit) + `, "window": "day"}}}`},
		mode: "enforce",
		config: canaryConfig(pki.File, []string{agent, "coder-2"}, `budgets:
  store: {redis: {address: "`+srv.Addr+`", key_prefix: "it:"}}
  on_store_error: fail_closed
`),
		env: []string{tokenEnv(agent) + "=" + token, tokenEnv("coder-2") + "=" + token2, "CANARY_SECRET=sk-canary-" + randHex(8)},
	}
	brokers := []*brokerProc{startBroker(t, opts), startBroker(t, opts), startBroker(t, opts)}
	target := up.URL + "/open/x"

	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	for _, b := range brokers {
		c := b.client(t, agent, token)
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 10 {
					resp, err := c.Get(target)
					if err != nil {
						t.Error(err)
						return
					}
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					switch resp.StatusCode {
					case http.StatusOK:
						ok.Add(1)
					case http.StatusTooManyRequests:
						refused.Add(1)
						if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 || ra > 86400 {
							t.Errorf("Retry-After %q", resp.Header.Get("Retry-After"))
						}
						var e struct{ Error, Reason string }
						if json.Unmarshal(body, &e) != nil || e.Error != "budget_exceeded" || !strings.Contains(e.Reason, `"agent-day"`) {
							t.Errorf("refusal body %s", body)
						}
					default:
						t.Errorf("status %d: %s", resp.StatusCode, body)
					}
				}
			}()
		}
	}
	wg.Wait()
	t.Logf("120 requests through 3 brokers for a budget of %d: %d allowed, %d refused, %d reached the upstream (overshoot %d)",
		limit, ok.Load(), refused.Load(), reached.Load(), reached.Load()-limit)
	if ok.Load() != limit || reached.Load() != limit {
		t.Fatalf("%d allowed, %d reached the upstream; want exactly %d", ok.Load(), reached.Load(), limit)
	}
	brokers[0].waitAuditWhere(t, 1, "an audit event naming the budget", func(ev auditEvent) bool {
		return ev["budget"] == "agent-day" && ev["status"] == float64(429) && ev["decision"] == "deny"
	})

	status := func(b *brokerProc) int {
		t.Helper()
		resp, err := b.client(t, agent, token).Get(target)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// A broker restarts: the counter is in Redis, not in the broker.
	if err := brokers[0].stop(t); err != nil {
		t.Fatal(err)
	}
	brokers[0] = startBroker(t, opts)
	if s := status(brokers[0]); s != http.StatusTooManyRequests {
		t.Fatalf("after a broker restart: %d, want 429", s)
	}
	// Redis restarts: its append-only file keeps the counter.
	srv.Restart()
	if s := status(brokers[1]); s != http.StatusTooManyRequests {
		t.Fatalf("after a Redis restart: %d, want 429", s)
	}
	if n := reached.Load(); n != limit {
		t.Fatalf("%d requests reached the upstream, want %d", n, limit)
	}
	out, err := exec.Command(brokerBin, "usage", "--admin", "http://"+brokers[2].adminAddr).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "agent-day") || !strings.Contains(string(out), " 60 ") {
		t.Fatalf("broker usage: %v\n%s", err, out)
	}
	t.Logf("broker usage:\n%s", out)
	// The agent cannot reach the store through the broker (its budgets, its grants).
	resp, err := brokers[2].client(t, "coder-2", token2).Get("https://" + srv.Addr + "/open/x")
	if err == nil {
		resp.Body.Close()
	}
	brokers[2].waitAuditWhere(t, 1, "the store refused as a destination", func(ev auditEvent) bool {
		r, _ := ev["reason"].(string)
		return ev["agent"] == "coder-2" && ev["decision"] == "deny" && ev["status"] == float64(http.StatusForbidden) &&
			strings.Contains(r, "a service the broker uses")
	})
	// Redis is down and the budget fails closed: 503, and nothing is sent.
	srv.Stop()
	if s := status(brokers[2]); s != http.StatusServiceUnavailable {
		t.Fatalf("Redis down, fail_closed: %d, want 503", s)
	}
	if n := reached.Load(); n != limit {
		t.Fatalf("%d requests reached the upstream, want %d", n, limit)
	}
}
