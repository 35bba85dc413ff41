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

// TestTokensBudgetAcrossBrokers: a tokens budget of 1,000 shared by three brokers (the built
// binary) through a real redis-server, against an OpenAI-compatible upstream whose every call
// uses 45 tokens. The overrun is at most the calls in flight across the fleet when the budget
// was spent (docs/budgets.md): each check reads the counter in Redis, and a call's usage is
// written there before the broker is done with it. With one agent calling the brokers in turn,
// one call at a time, that is at most the one call plus one finishing per broker: 1,000 +
// (1 + 3) x 45 tokens at most; 23 calls (1,035) is what a single broker lets through. With
// six agents' loops calling at once, at most six calls plus one finishing per connection.
// Afterwards every broker refuses, and Redis counts exactly what reached the upstream.
func TestTokensBudgetAcrossBrokers(t *testing.T) {
	srv := redistest.Start(t)
	pki := newUpstreamPKI(t)
	const limit, perCall, brokersN = 1000, 45, 3
	var mu sync.Mutex
	reached := map[string]int{} // by model
	up := pki.serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Model string }
		body, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(body, &req)
		mu.Lock()
		reached[req.Model]++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c1","object":"chat.completion","model":"`+req.Model+`","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":40,"completion_tokens":5,"total_tokens":45}}`)
	}), false, nil)
	count := func(model string) int {
		mu.Lock()
		defer mu.Unlock()
		return reached[model]
	}
	token1, token2 := randHex(16), randHex(16)
	opts := brokerOpts{
		policy: testPolicy,
		files: map[string]string{"budgets.json": `{"budgets": {
		  "seq-tokens": {"agent": "coder-1", "provider": "local", "tokens": 1000, "window": "day"},
		  "par-tokens": {"agent": "coder-2", "provider": "local", "tokens": 1000, "window": "day"}}}`},
		mode: "enforce",
		config: canaryConfig(pki.File, []string{"coder-1", "coder-2"}, `llm:
  openai_compatible:
    - {name: local, hosts: ["127.0.0.1"], path_prefix: /open/v1}
budgets:
  store: {redis: {address: "`+srv.Addr+`", key_prefix: "tok:"}}
  on_store_error: fail_closed
`),
		env: []string{tokenEnv("coder-1") + "=" + token1, tokenEnv("coder-2") + "=" + token2, "CANARY_SECRET=sk-canary-" + randHex(8)},
	}
	brokers := []*brokerProc{startBroker(t, opts), startBroker(t, opts), startBroker(t, opts)}
	target := up.URL + "/open/v1/chat/completions"
	call := func(c *http.Client, model string) int {
		resp, err := c.Post(target, "application/json", strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Error(err)
			return 0
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
		case http.StatusTooManyRequests:
			if !strings.Contains(string(body), "budget_exceeded") {
				t.Errorf("429 without budget_exceeded: %s", body)
			}
		default:
			t.Errorf("status %d: %s", resp.StatusCode, body)
		}
		return resp.StatusCode
	}
	used := func(budget string) string {
		out, err := exec.Command(brokerBin, "usage", "--json", "--admin", "http://"+brokers[1].adminAddr).Output()
		if err != nil {
			t.Fatalf("broker usage: %v\n%s", err, out)
		}
		var u struct {
			Usage []struct {
				Budget string
				Usage  struct{ Used json.Number }
			}
		}
		if err := json.Unmarshal(out, &u); err != nil {
			t.Fatalf("broker usage --json: %v\n%s", err, out)
		}
		for _, l := range u.Usage {
			if l.Budget == budget {
				return l.Usage.Used.String()
			}
		}
		t.Fatalf("broker usage has no %s: %s", budget, out)
		return ""
	}

	// One agent, one call at a time, round robin over the brokers.
	clients := make([]*http.Client, brokersN)
	for i, b := range brokers {
		clients[i] = b.client(t, "coder-1", token1)
	}
	refusedInARow := 0
	for i := 0; refusedInARow < 2*brokersN && i < 100; i++ {
		if call(clients[i%brokersN], "seq") == http.StatusTooManyRequests {
			refusedInARow++
		} else {
			refusedInARow = 0
		}
	}
	seq := count("seq")
	t.Logf("one call at a time over 3 brokers: %d calls, %d tokens reached the upstream for a budget of %d (a single broker: 23 calls, 1035)", seq, seq*perCall, limit)
	if seq*perCall > limit+(1+brokersN)*perCall {
		t.Errorf("%d tokens reached the upstream: over the bound %d + (1 + %d) x %d", seq*perCall, limit, brokersN, perCall)
	}
	if seq < 23 || refusedInARow < 2*brokersN {
		t.Errorf("%d calls let through, then %d refused in a row: the budget should allow 23 and then every broker refuse", seq, refusedInARow)
	}
	if got := used("seq-tokens"); got != strconv.Itoa(seq*perCall) {
		t.Errorf("Redis counts %s tokens, %d reached the upstream", got, seq*perCall)
	}

	// Six loops at once, each round robin over the brokers, until refused.
	const loops = 6
	var wg sync.WaitGroup
	for g := range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs := make([]*http.Client, brokersN)
			for i, b := range brokers {
				cs[i] = b.client(t, "coder-2", token2)
			}
			for i := g; i < g+100; i++ {
				if s := call(cs[i%brokersN], "par"); s != http.StatusOK {
					return
				}
			}
		}()
	}
	wg.Wait()
	par := count("par")
	t.Logf("%d loops at once over 3 brokers: %d calls, %d tokens reached the upstream for a budget of %d", loops, par, par*perCall, limit)
	// In flight: each loop's call, and at most one finishing per loop's connection to a broker.
	if bound := limit + (loops+loops*brokersN)*perCall; par*perCall > bound {
		t.Errorf("%d tokens reached the upstream: over the bound %d", par*perCall, bound)
	}
	if par < 23 {
		t.Errorf("%d calls let through, want at least 23", par)
	}
	if got := used("par-tokens"); got != strconv.Itoa(par*perCall) {
		t.Errorf("Redis counts %s tokens, %d reached the upstream", got, par*perCall)
	}
}
