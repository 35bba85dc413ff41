package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/budget"
	"github.com/capbroker/capbroker/broker/budget/redistest"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/policy"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func budgetData(t testing.TB, doc string) func() (string, map[string]any) {
	dec := json.NewDecoder(strings.NewReader(doc))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	return func() (string, map[string]any) { return "t", m }
}

func llmRequest(model string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"`+model+`","messages":[]}`))
	r.Host = "api.openai.com"
	r.Header.Set("Content-Type", "application/json")
	return r
}

// TestBudgetExceededIsRefused: a request over a requests budget is refused before it is sent,
// with 429, Retry-After (the seconds left in the window), the provider's error shape naming
// the budget, and the audit event's budget; a request for a model the budget does not name
// goes through.
func TestBudgetExceededIsRefused(t *testing.T) {
	br, tun := benchBroker(t, false)
	var out lockedBuffer
	br.audit = audit.New(&out)
	br.budgets = budget.New(budget.Options{Data: budgetData(t, `{"budgets": {"gpt4-per-minute":
	  {"agent": "dev-agent", "provider": "openai", "model": "gpt-4*", "requests": 2, "window": "minute"}}}`)})
	for i := range 2 {
		w := httptest.NewRecorder()
		br.serveTunnel(w, llmRequest("gpt-4o"), tun)
		if w.Code != http.StatusOK {
			t.Fatalf("request %d: %d %s", i+1, w.Code, w.Body)
		}
	}
	w := httptest.NewRecorder()
	br.serveTunnel(w, llmRequest("gpt-4o"), tun)
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("third request: %d %s", w.Code, w.Body)
	}
	ra, err := strconv.Atoi(w.Header().Get("Retry-After"))
	if err != nil || ra < 1 || ra > 60 {
		t.Errorf("Retry-After %q, want 1..60 seconds (the minute's end)", w.Header().Get("Retry-After"))
	}
	var body struct {
		Error struct{ Type, Message, Code string }
	}
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || body.Error.Code != "budget_exceeded" ||
		body.Error.Type != "rate_limit_error" || !strings.Contains(body.Error.Message, `budget "gpt4-per-minute" exceeded`) {
		t.Errorf("body %s: want OpenAI's shape, code budget_exceeded, naming the budget", w.Body)
	}
	w = httptest.NewRecorder()
	br.serveTunnel(w, llmRequest("gpt-3.5-turbo"), tun)
	if w.Code != http.StatusOK {
		t.Errorf("a model the budget does not name: %d", w.Code)
	}
	br.audit.Close()
	var refused map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out.b.String()), "\n") {
		var ev map[string]any
		_ = json.Unmarshal([]byte(line), &ev)
		if ev["status"] == float64(429) {
			refused = ev
		}
	}
	if refused == nil || refused["budget"] != "gpt4-per-minute" || refused["decision"] != "deny" {
		t.Errorf("audit of the refusal: %v", refused)
	}
}

// TestPolicySeesUsage: a policy reading input.usage allows a cheap model once the budget of
// the expensive one is spent, and the cache never serves it a decision made for other counters.
func TestPolicySeesUsage(t *testing.T) {
	br, tun := benchBroker(t, false)
	e, err := policy.New(context.Background(), fstest.MapFS{"p.rego": {Data: []byte(`package broker

decision := {"allow": true} if input.usage.big.remaining > 0

decision := {"allow": true} if {
	input.usage.big.remaining <= 0
	startswith(input.request.body.model, "small")
}

decision := {"allow": false, "reason": "the big model's budget is spent: use a small one"} if {
	input.usage.big.remaining <= 0
	not startswith(input.request.body.model, "small")
}
`)}})
	if err != nil {
		t.Fatal(err)
	}
	br.policy = e
	br.budgets = budget.New(budget.Options{Data: budgetData(t, `{"budgets": {"big":
	  {"provider": "openai", "model": "big*", "requests": 1, "window": "day"}}}`)})
	codes := ""
	for _, m := range []string{"big-1", "big-1", "small-1"} {
		w := httptest.NewRecorder()
		br.serveTunnel(w, llmRequest(m), tun)
		codes += strconv.Itoa(w.Code) + " "
	}
	if codes != "200 403 200 " {
		t.Errorf("statuses %q, want 200 403 200", codes)
	}
}

// TestUsageWithoutBudgets: with budgets on but none declared, input.usage is an empty object
// (a policy may count it), and a request is not counted against anything.
func TestUsageWithoutBudgets(t *testing.T) {
	br, tun := benchBroker(t, false)
	e, err := policy.New(context.Background(), fstest.MapFS{"p.rego": {Data: []byte(`package broker

decision := {"allow": count(input.usage) == 0}
`)}})
	if err != nil {
		t.Fatal(err)
	}
	br.policy = e
	br.budgets = budget.New(budget.Options{Data: budgetData(t, `{}`)})
	w := httptest.NewRecorder()
	br.serveTunnel(w, llmRequest("big-1"), tun)
	if w.Code != http.StatusOK {
		t.Errorf("status %d: input.usage was not an empty object", w.Code)
	}
}

// BenchmarkPipelineBudgets is BenchmarkPipeline's full pipeline with budgets off, on in
// memory and on in Redis (a real redis-server on loopback), run in that order: compare them
// in pairs. The budgets apply to the request (a requests budget for its model, a tokens
// budget for its provider) and are never spent; "redis-tokens" has the tokens budget only. "serial" is one request at a time (the Redis
// round trip is in each request's latency); "parallel" is throughput with requests in flight
// together (GOMAXPROCS x 8), as a broker serves them.
func BenchmarkPipelineBudgets(b *testing.B) {
	const doc = `{"budgets": {
	  "req": {"agent": "dev-agent", "provider": "openai", "model": "gpt-4*", "requests": 1000000000000, "window": "day"},
	  "tok": {"labels": {"env": "dev"}, "provider": "openai", "tokens": 1000000000000, "window": "month"}
	}}`
	// Only a tokens budget: read in Redis at the check, usage written there at the end.
	const tokensOnly = `{"budgets": {
	  "tok": {"labels": {"env": "dev"}, "provider": "openai", "tokens": 1000000000000, "window": "month"}
	}}`
	srv := redistest.Start(b)
	body := []byte(`{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"Say ok."}],"max_tokens":8}`)
	one := func(b *testing.B, br *Broker, tun *tunnel) {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
		r.Host = "api.openai.com"
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		br.serveTunnel(w, r, tun)
		if w.Code != http.StatusOK {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
	for _, par := range []string{"serial", "parallel"} {
		for _, mode := range []string{"off", "memory", "redis", "redis-tokens"} {
			b.Run(par+"/"+mode, func(b *testing.B) {
				br, tun := benchBroker(b, true)
				switch mode {
				case "memory":
					br.budgets = budget.New(budget.Options{Data: budgetData(b, doc)})
				case "redis", "redis-tokens":
					st := budget.NewRedis(budget.RedisOptions{Address: srv.Addr, KeyPrefix: "bench:"})
					b.Cleanup(func() { st.Close() })
					d := doc
					if mode == "redis-tokens" {
						d = tokensOnly
					}
					br.budgets = budget.New(budget.Options{Data: budgetData(b, d), Store: st})
				}
				b.ReportAllocs()
				if par == "serial" {
					for b.Loop() {
						one(b, br, tun)
					}
					return
				}
				b.SetParallelism(8)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						one(b, br, tun)
					}
				})
			})
		}
	}
}

// downStore is a shared store that cannot be reached.
type downStore struct{}

var errStoreDown = errors.New("dial tcp 127.0.0.1:1: connection refused")

func (downStore) Take(context.Context, []budget.Counter) ([]int64, int, error) {
	return nil, 0, errStoreDown
}
func (downStore) Add(context.Context, string, int64, time.Duration) error { return errStoreDown }
func (downStore) Get(context.Context, []string) ([]int64, error)          { return nil, errStoreDown }

// TestBudgetStoreDown: with the shared store unreachable, a budget that fails closed refuses
// with 503 budget_unavailable and Retry-After 1; one that falls back to local counters lets
// the request through, counted in memory.
func TestBudgetStoreDown(t *testing.T) {
	br, tun := benchBroker(t, false)
	br.budgets = budget.New(budget.Options{Store: downStore{}, Data: budgetData(t, `{"budgets": {"r":
	  {"agent": "dev-agent", "requests": 10, "window": "hour"}}}`)})
	w := httptest.NewRecorder()
	br.serveTunnel(w, llmRequest("gpt-4o"), tun)
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" ||
		!strings.Contains(w.Body.String(), "budget_unavailable") || strings.Contains(w.Body.String(), "127.0.0.1:1") {
		t.Fatalf("fail closed: %d %v %s", w.Code, w.Header(), w.Body)
	}
	br.budgets = budget.New(budget.Options{Store: downStore{}, OnStoreError: budget.Local, Data: budgetData(t, `{"budgets": {"r":
	  {"agent": "dev-agent", "requests": 1, "window": "hour"}}}`)})
	codes := ""
	for range 2 {
		w := httptest.NewRecorder()
		br.serveTunnel(w, llmRequest("gpt-4o"), tun)
		codes += strconv.Itoa(w.Code) + " "
	}
	if codes != "200 429 " {
		t.Fatalf("local fallback: %s, want 200 429", codes)
	}
}

// TestBudgetMonitorMode: in monitor mode a request over a budget is sent, and its audit
// event says would_deny and names the budget.
func TestBudgetMonitorMode(t *testing.T) {
	br, tun := benchBroker(t, false)
	g := *br.gen.Load()
	g.mode = config.ModeMonitor
	br.gen.Store(&g)
	tun.gen = &g
	var out lockedBuffer
	br.audit = audit.New(&out)
	br.budgets = budget.New(budget.Options{Data: budgetData(t, `{"budgets": {"one": {"requests": 1, "window": "day"}}}`)})
	for range 2 {
		w := httptest.NewRecorder()
		br.serveTunnel(w, llmRequest("m"), tun)
		if w.Code != http.StatusOK {
			t.Fatalf("monitor mode: %d", w.Code)
		}
	}
	br.audit.Close()
	if s := out.b.String(); !strings.Contains(s, `"would_deny":true`) || !strings.Contains(s, `"budget":"one"`) {
		t.Fatalf("audit: %s", s)
	}
}
