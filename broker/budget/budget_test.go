package budget

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/capbroker/capbroker/broker/usage"
)

// data parses a JSON data document as the policy loader does (numbers as json.Number).
func data(t testing.TB, text string) map[string]any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

func fixed(t time.Time) func() time.Time { return func() time.Time { return t } }

func TestWindows(t *testing.T) {
	at := time.Date(2026, 2, 28, 23, 59, 30, 500, time.FixedZone("X", 3600)) // 22:59:30 UTC
	for _, c := range []struct {
		w          string
		start, end string
	}{
		{WindowMinute, "2026-02-28T22:59:00Z", "2026-02-28T23:00:00Z"},
		{WindowHour, "2026-02-28T22:00:00Z", "2026-02-28T23:00:00Z"},
		{WindowDay, "2026-02-28T00:00:00Z", "2026-03-01T00:00:00Z"},
		{WindowMonth, "2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z"},
	} {
		s, e := Window(c.w, at)
		if s.Format(time.RFC3339) != c.start || e.Format(time.RFC3339) != c.end {
			t.Errorf("%s: [%s, %s), want [%s, %s)", c.w, s.Format(time.RFC3339), e.Format(time.RFC3339), c.start, c.end)
		}
	}
	// December's month window ends at the next year.
	if _, e := Window(WindowMonth, time.Date(2026, 12, 31, 23, 0, 0, 0, time.UTC)); e != time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC) {
		t.Errorf("December ends %s", e)
	}
}

func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{`{"budgets": {"a": {"requests": 1}}}`, "window"},
		{`{"budgets": {"a": {"window": "day"}}}`, "set one of requests, tokens, cost"},
		{`{"budgets": {"a": {"window": "day", "requests": 1, "tokens": 2}}}`, "only one"},
		{`{"budgets": {"a": {"window": "week", "requests": 1}}}`, "window"},
		{`{"budgets": {"a": {"window": "day", "requests": 1.5}}}`, "whole number"},
		{`{"budgets": {"a": {"window": "day", "requests": 1, "colour": "red"}}}`, "unknown key"},
		{`{"budgets": {"a": {"window": "day", "requests": 1, "on_store_error": "maybe"}}}`, "on_store_error"},
		{`{"budgets": {"a": {"window": "day", "requests": 1, "hard": true}}}`, "hard"},
		{`{"budgets": {"a:b": {"window": "day", "requests": 1}}}`, "name"},
		{`{"prices": {"m": {"input": -1}}}`, "input"},
		{`{"prices": {"m": {"inputs": 1}}}`, "unknown key"},
	} {
		_, err := Parse(data(t, c.doc))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one saying %q", c.doc, err, c.want)
		}
	}
}

const matchDoc = `{"budgets": {
  "all-requests": {"agent": "a", "requests": 100, "window": "minute"},
  "team-tokens": {"labels": {"team": "ml"}, "tokens": 1000, "window": "day"},
  "gpt4-cost": {"agent": ["a", "b"], "provider": "openai", "model": "gpt-4*", "cost": 5, "window": "month", "per": "agent"},
  "claude": {"provider": "anthropic", "requests": 10, "window": "hour"}
}}`

func names(bs []*Budget) string {
	var n []string
	for _, b := range bs {
		n = append(n, b.Name)
	}
	return strings.Join(n, ",")
}

func TestMatch(t *testing.T) {
	s, err := Parse(data(t, matchDoc))
	if err != nil {
		t.Fatal(err)
	}
	reads := 0
	model := func(m string) func() string { return func() string { reads++; return m } }
	for _, c := range []struct {
		r    Request
		want string
	}{
		{Request{Agent: "a"}, "all-requests"}, // not an LLM call: only the plain requests budget
		{Request{Agent: "a", Provider: "openai", Model: model("gpt-4o")}, "all-requests,gpt4-cost"},
		{Request{Agent: "a", Provider: "openai", Model: model("gpt-3.5")}, "all-requests"},
		{Request{Agent: "b", Labels: map[string]string{"team": "ml"}, Provider: "openai", Model: model("gpt-4")}, "gpt4-cost,team-tokens"},
		{Request{Agent: "c", Labels: map[string]string{"team": "web"}, Provider: "anthropic", Model: model("claude")}, "claude"},
	} {
		if got := names(s.Match(c.r)); got != c.want {
			t.Errorf("%+v: %s, want %s", c.r, got, c.want)
		}
	}
	if reads != 3 {
		t.Errorf("the model was read %d times, want 3 (only where a budget naming a model applied)", reads)
	}
}

func TestCost(t *testing.T) {
	s, err := Parse(data(t, `{"prices": {
	  "gpt-4o": {"input": 2.5, "output": 10, "cached": 1.25},
	  "gpt-4*": {"input": 30, "output": 60},
	  "gpt-4o-mini*": {"input": 0.15, "output": 0.6}
	}}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		model           string
		in, out, cached int64
		want            int64 // millionths
		known           bool
	}{
		{"gpt-4o", 1_000_000, 1_000_000, 0, 12_500_000, true},
		{"gpt-4o", 1_000_000, 0, 400_000, 600_000*2.5 + 400_000*1.25, true},
		{"gpt-4-turbo", 1000, 1000, 500, 1000*30 + 1000*60, true},    // no cached price: the input price
		{"gpt-4o-mini-2024", 1_000_000, 1_000_000, 0, 750_000, true}, // the longest prefix wins
		{"llama", 1000, 1000, 0, 0, false},
	} {
		got, known := s.Cost(c.model, c.in, c.out, c.cached)
		if got != c.want || known != c.known {
			t.Errorf("%s: %d %v, want %d %v", c.model, got, known, c.want, c.known)
		}
	}
}

func newBudgets(t testing.TB, doc string, o Options) *Budgets {
	d := data(t, doc)
	o.Data = func() (string, map[string]any) { return "r1", d }
	return New(o)
}

func TestRequestsBudgetAndRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 4, 10, 15, 20, 0, time.UTC)
	reg := prometheus.NewRegistry()
	b := newBudgets(t, `{"budgets": {"r": {"agent": "a", "requests": 3, "window": "hour"}}}`, Options{Now: fixed(now), Metrics: reg})
	ctx := context.Background()
	for i := range 3 {
		if err := b.Check(ctx, Request{Agent: "a"}); err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
	}
	err := b.Check(ctx, Request{Agent: "a"})
	var ex *Exceeded
	if !errors.As(err, &ex) {
		t.Fatalf("fourth request: %v, want Exceeded", err)
	}
	if ex.Budget != "r" || ex.Used != 3 || ex.Limit != 3 || ex.RetryAfterSeconds() != 44*60+40 {
		t.Errorf("%+v (retry after %d s), want budget r, 3 of 3, 2680 s to the hour's end", ex, ex.RetryAfterSeconds())
	}
	if !strings.Contains(ex.Error(), `budget "r" exceeded`) {
		t.Errorf("message %q", ex.Error())
	}
	if err := b.Check(ctx, Request{Agent: "other"}); err != nil {
		t.Errorf("another agent: %v", err)
	}
	if v := testutil.ToFloat64(b.refused.WithLabelValues("r", "exceeded")); v != 1 {
		t.Errorf("refused metric %v, want 1", v)
	}
	if v := testutil.ToFloat64(b.remaining.WithLabelValues("r", "")); v != 0 {
		t.Errorf("remaining metric %v, want 0", v)
	}
	// The next window starts afresh.
	b.o.Now = fixed(now.Add(time.Hour))
	b.local.now = b.o.Now
	if err := b.Check(ctx, Request{Agent: "a"}); err != nil {
		t.Errorf("next hour: %v", err)
	}
}

func TestRecordTokensAndCost(t *testing.T) {
	now := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	b := newBudgets(t, `{
	  "budgets": {
	    "tok": {"agent": "a", "provider": "openai", "tokens": 1000, "window": "day", "per": "agent"},
	    "usd": {"agent": "a", "cost": 0.01, "window": "month", "hard": true}
	  },
	  "prices": {"gpt-4o": {"input": 2.5, "output": 10}}
	}`, Options{Now: fixed(now)})
	ctx := context.Background()
	req := Request{Agent: "a", Provider: "openai", Model: func() string { return "gpt-4o" }}
	if err := b.Check(ctx, req); err != nil {
		t.Fatal(err)
	}
	// A call that starts within the budget and ends over it is counted whole.
	cost := b.Record(usage.Call{Agent: "a", Provider: "openai", Model: "gpt-4o", In: 900, Out: 300, Reported: true})
	if want := (900*2.5 + 300*10) / 1e6; cost != want {
		t.Errorf("cost %v, want %v", cost, want)
	}
	err := b.Check(ctx, req)
	var ex *Exceeded
	if !errors.As(err, &ex) || ex.Budget != "tok" || ex.Used != 1200 {
		t.Fatalf("after the call: %v, want tok exceeded at 1200", err)
	}
	u := b.Usage(ctx, "a", nil)
	if got := u["tok"].(map[string]any)["used"]; got != int64(1200) {
		t.Errorf("input.usage.tok.used = %v", got)
	}
	if got := u["usd"].(map[string]any)["used"]; got != 0.00525 {
		t.Errorf("input.usage.usd.used = %v", got)
	}
	// The hard cap: 0.00525 spent of 0.01; 0.00475 more is allowed, 0.0048 not.
	if ok, _ := b.Within(usage.Call{Agent: "a", Provider: "openai", Model: "gpt-4o", Out: 475}); !ok {
		t.Error("Within refused a call that fits")
	}
	if ok, name := b.Within(usage.Call{Agent: "a", Provider: "openai", Model: "gpt-4o", Out: 476}); ok || name != "usd" {
		t.Errorf("Within = %v %q, want false usd", ok, name)
	}
}

// fakeStore fails while down is set, and counts its round trips.
type fakeStore struct {
	*Memory
	down  atomic.Bool
	trips atomic.Int64
}

var errDown = errors.New("connection refused")

func (f *fakeStore) Take(ctx context.Context, cs []Counter) ([]int64, int, error) {
	f.trips.Add(1)
	if f.down.Load() {
		return nil, 0, errDown
	}
	return f.Memory.Take(ctx, cs)
}

func (f *fakeStore) Add(ctx context.Context, key string, n int64, ttl time.Duration) error {
	if f.down.Load() {
		return errDown
	}
	return f.Memory.Add(ctx, key, n, ttl)
}

func TestStoreErrorFailClosed(t *testing.T) {
	st := &fakeStore{Memory: NewMemory()}
	b := newBudgets(t, `{"budgets": {"r": {"agent": "a", "requests": 10, "window": "day"}}}`, Options{Store: st})
	ctx := context.Background()
	if err := b.Check(ctx, Request{Agent: "a"}); err != nil {
		t.Fatal(err)
	}
	st.down.Store(true)
	err := b.Check(ctx, Request{Agent: "a"})
	var un *Unavailable
	if !errors.As(err, &un) || un.Budget != "r" || !errors.Is(err, errDown) {
		t.Fatalf("store down: %v, want Unavailable for r", err)
	}
	// Within downFor the store is not asked again.
	trips := st.trips.Load()
	_ = b.Check(ctx, Request{Agent: "a"})
	if st.trips.Load() != trips {
		t.Error("the failed store was asked again at once")
	}
	if v := testutil.ToFloat64(b.storeError.WithLabelValues("take")); v != 1 {
		t.Errorf("store errors %v, want 1", v)
	}
}

// TestStoreErrorLocalOvershoot measures the overshoot of local fallback: three brokers share
// a store with a budget of 100 requests, 40 are used, the store goes down, and each broker
// goes on with its own counter from the last value it saw. Together they let through at most
// 3 times what was left; after the store answers again, the local adds are replayed to it.
func TestStoreErrorLocalOvershoot(t *testing.T) {
	st := &fakeStore{Memory: NewMemory()}
	now := time.Now()
	clock := &atomic.Int64{}
	clock.Store(now.UnixNano())
	nowf := func() time.Time { return time.Unix(0, clock.Load()) }
	const doc = `{"budgets": {"r": {"agent": "a", "requests": 100, "window": "day", "on_store_error": "local"}}}`
	brokers := []*Budgets{}
	for range 3 {
		brokers = append(brokers, newBudgets(t, doc, Options{Store: st, Now: nowf}))
	}
	ctx := context.Background()
	for i := range 40 {
		if err := brokers[i%3].Check(ctx, Request{Agent: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	st.down.Store(true)
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for _, b := range brokers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				if b.Check(ctx, Request{Agent: "a"}) == nil {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	total := 40 + allowed.Load()
	overshoot := total - 100
	t.Logf("store down at 40 of 100: %d let through in all, overshoot %d (bound: the sum of what each broker last saw left, at most 3 x 62 - 60)", total, overshoot)
	// Each broker's last view was at least 38 (the 38th..40th requests went one to each).
	if overshoot <= 0 || overshoot > 2*62 {
		t.Errorf("overshoot %d, want above 0 (local counters are not shared) and at most 124", overshoot)
	}
	// The store answers again: the adds made locally are replayed to it.
	st.down.Store(false)
	clock.Add(int64(2 * downFor))
	for _, b := range brokers {
		err := b.Check(ctx, Request{Agent: "a"})
		var ex *Exceeded
		if !errors.As(err, &ex) {
			t.Fatalf("after recovery: %v, want Exceeded", err)
		}
	}
	start, _ := Window(WindowDay, nowf())
	v, _ := st.Memory.Get(ctx, []string{brokers[0].cur.Load().set.Budgets[0].key("a", start)})
	if v[0] != total {
		t.Errorf("the store counts %d after the replay, want %d", v[0], total)
	}
}

func TestMalformedDataRefuses(t *testing.T) {
	b := newBudgets(t, `{"budgets": {"r": {"requests": 1}}}`, Options{})
	if err := b.Check(context.Background(), Request{Agent: "a"}); err == nil {
		t.Fatal("malformed budgets: the request was let through")
	}
}

func TestNoBudgetsNoCost(t *testing.T) {
	empty := map[string]any{}
	b := New(Options{Data: func() (string, map[string]any) { return "r", empty }})
	allocs := testing.AllocsPerRun(100, func() {
		if err := b.Check(context.Background(), Request{Agent: "a"}); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("a check without budgets allocates %v times", allocs)
	}
}

// TestTokensChecksReadTheStore: with a shared store, a check against a tokens budget reads
// the counter there, however recently this broker read it: usage another broker recorded
// just before is seen at once (no refresh interval, no clock moving). A check is one round
// trip, and a call's usage is in the store when Record returns.
func TestTokensChecksReadTheStore(t *testing.T) {
	st := &fakeStore{Memory: NewMemory()}
	clock := &atomic.Int64{}
	clock.Store(time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC).UnixNano())
	nowf := func() time.Time { return time.Unix(0, clock.Load()) } // never moves
	const doc = `{"budgets": {"tok": {"agent": "a", "provider": "openai", "tokens": 100, "window": "day"}}}`
	a := newBudgets(t, doc, Options{Store: st, Now: nowf})
	b := newBudgets(t, doc, Options{Store: st, Now: nowf})
	ctx := context.Background()
	req := Request{Agent: "a", Provider: "openai"}
	for range 3 {
		if err := b.Check(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if st.trips.Load() != 3 {
		t.Fatalf("%d round trips for 3 checks, want 3", st.trips.Load())
	}
	a.Record(usage.Call{Agent: "a", Provider: "openai", In: 150, Reported: true})
	var ex *Exceeded
	if err := b.Check(ctx, req); !errors.As(err, &ex) || ex.Used != 150 {
		t.Fatalf("right after another broker spent the budget: %v, want tok exceeded at 150", err)
	}
}

func TestHardApplies(t *testing.T) {
	b := newBudgets(t, `{"budgets": {
	    "soft": {"agent": "a", "tokens": 10, "window": "day"},
	    "hard": {"labels": {"team": "x"}, "provider": "anthropic", "tokens": 10, "window": "day", "hard": true}
	}}`, Options{})
	cases := []struct {
		agent    string
		labels   map[string]string
		provider string
		want     bool
	}{
		{"a", nil, "anthropic", false},
		{"a", map[string]string{"team": "x"}, "anthropic", true},
		{"a", map[string]string{"team": "x"}, "openai", false},
		{"b", map[string]string{"team": "y"}, "anthropic", false},
	}
	for _, c := range cases {
		if got := b.HardApplies(c.agent, c.labels, c.provider); got != c.want {
			t.Errorf("HardApplies(%q, %v, %q) = %v", c.agent, c.labels, c.provider, got)
		}
	}
}
