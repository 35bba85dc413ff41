package budget

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker/usage"
)

// keyMargin is how long a counter outlives its window: brokers whose clocks differ a little
// still find it.
const keyMargin = time.Hour

// downFor is how long the broker stops asking a shared store that failed: requests in that
// time apply on_store_error at once instead of waiting for a timeout each.
const downFor = time.Second

// Options configure Budgets.
type Options struct {
	// Data returns the current policy's revision and data document (data.budgets, data.prices).
	Data func() (revision string, data map[string]any)
	// Store is the shared store; nil keeps counters in memory.
	Store Store
	// OnStoreError is what a budget without its own on_store_error does when Store fails:
	// FailClosed (the default) or Local.
	OnStoreError string
	// Providers names more LLM API hosts (host -> provider), beside the built-in ones.
	Providers map[string]string
	Metrics   prometheus.Registerer
	Log       zerolog.Logger
	Now       func() time.Time
}

// Budgets checks requests against the budgets of the current policy and records their usage.
// Safe for concurrent use. It is the broker's usage.Recorder.
type Budgets struct {
	o      Options
	shared Store   // nil when counters are in memory only
	local  *Memory // the counters in memory: the store itself, or the last values of the shared one
	cur    atomic.Pointer[parsed]
	down   atomic.Int64 // unix nanoseconds until which the shared store is not asked

	owedMu sync.Mutex
	owed   map[string]owedAdd // adds made locally while the shared store failed, replayed after

	remaining  *prometheus.GaugeVec
	refused    *prometheus.CounterVec
	storeError *prometheus.CounterVec
}

type owedAdd struct {
	n   int64
	ttl time.Duration
}

type parsed struct {
	revision string
	set      *Set
	err      error
}

var _ usage.Recorder = (*Budgets)(nil)

// New returns Budgets.
func New(o Options) *Budgets {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.OnStoreError == "" {
		o.OnStoreError = FailClosed
	}
	b := &Budgets{o: o, shared: o.Store, local: NewMemory(), owed: map[string]owedAdd{}}
	b.local.now = o.Now
	b.remaining = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "capbroker_budget_remaining",
		Help: "What is left of a budget in its current window (requests, tokens, or cost in the price table's unit), by budget and scope (the agent, for a per-agent budget).",
	}, []string{"budget", "scope"})
	b.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "capbroker_budget_refused_total",
		Help: "Requests refused for a budget: over it (429), or its shared store unreachable and the budget failing closed (503).",
	}, []string{"budget", "reason"})
	b.storeError = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "capbroker_budget_store_errors_total",
		Help: "Failed round trips to the shared budget store, by operation (take, add, get).",
	}, []string{"op"})
	if o.Metrics != nil {
		o.Metrics.MustRegister(b.remaining, b.refused, b.storeError)
	}
	return b
}

// set returns the parsed budgets of the current policy (nil and the error when its data is
// malformed: Check then refuses).
func (b *Budgets) set() (*Set, error) {
	if b.o.Data == nil {
		return &Set{}, nil
	}
	rev, data := b.o.Data()
	if p := b.cur.Load(); p != nil && p.revision == rev {
		return p.set, p.err
	}
	s, err := Parse(data)
	b.cur.Store(&parsed{rev, s, err})
	return s, err
}

// Active reports whether the current policy declares any budget.
func (b *Budgets) Active() bool {
	s, err := b.set()
	return err != nil || len(s.Budgets) > 0
}

// builtinProviders are the LLM APIs known by host.
var builtinProviders = map[string]string{
	"api.openai.com":                    "openai",
	"api.anthropic.com":                 "anthropic",
	"generativelanguage.googleapis.com": "gemini",
}

// Provider names the LLM API at host, or "".
func (b *Budgets) Provider(host string) string {
	host = strings.ToLower(host)
	if p, ok := b.o.Providers[host]; ok {
		return p
	}
	return builtinProviders[host]
}

// Exceeded refuses a request over a budget.
type Exceeded struct {
	Budget, Unit, Window string
	Limit, Used          int64
	// RetryAfter is the time left in the budget's window.
	RetryAfter time.Duration
}

func (e *Exceeded) Error() string {
	return fmt.Sprintf("budget %q exceeded: %s of %s %s this %s (UTC); it resets in %s",
		e.Budget, amount(e.Unit, e.Used), amount(e.Unit, e.Limit), e.Unit, e.Window, e.RetryAfter.Round(time.Second))
}

// RetryAfterSeconds is the Retry-After header's value: whole seconds, rounded up.
func (e *Exceeded) RetryAfterSeconds() int {
	return int(math.Ceil(e.RetryAfter.Seconds()))
}

// Unavailable refuses a request whose budget fails closed when its shared store failed.
type Unavailable struct {
	Budget string
	Err    error
}

func (e *Unavailable) Error() string {
	return fmt.Sprintf("budget %q: its shared store could not be reached and the budget fails closed: %v", e.Budget, e.Err)
}

func (e *Unavailable) Unwrap() error { return e.Err }

func amount(unit string, n int64) string {
	if unit == UnitCost {
		return fmt.Sprintf("%.6g", float64(n)/microDollars)
	}
	return fmt.Sprint(n)
}

func (b *Budgets) onStoreError(bu *Budget) string {
	if bu.OnStoreError != "" {
		return bu.OnStoreError
	}
	return b.o.OnStoreError
}

// Check counts a request against the budgets that apply to it, before it is forwarded: a
// requests budget counts it now; tokens and cost budgets only refuse it when they are already
// spent (their usage is recorded when the call ends). It returns *Exceeded when a budget is
// spent, *Unavailable when the shared store failed and a budget fails closed, or the policy
// data's error.
//
// With a shared store every check reads the counters there, in the script that counts the
// requests budgets: never a value this broker held from before the check. Record writes a
// call's usage there before the call is done with. So a tokens or cost budget is overrun by
// at most the calls in flight across the fleet when it was spent (a call is in flight from its
// check to the write of its usage), each counted whole: docs/budgets.md has the proof.
func (b *Budgets) Check(ctx context.Context, r Request) error {
	s, err := b.set()
	if err != nil {
		return fmt.Errorf("budgets: the policy's data is malformed: %w", err)
	}
	if len(s.Budgets) == 0 {
		return nil
	}
	bs := s.Match(r)
	if len(bs) == 0 {
		return nil
	}
	now := b.o.Now()
	cs := make([]Counter, len(bs))
	ends := make([]time.Time, len(bs))
	for i, bu := range bs {
		start, end := Window(bu.Window, now)
		ends[i] = end
		cs[i] = Counter{Key: bu.key(r.Agent, start), Limit: bu.Limit, TTL: end.Sub(now) + keyMargin}
		if bu.Unit == UnitRequests {
			cs[i].Add = 1
		}
	}
	vals, over, err := b.take(ctx, cs, bs)
	if err != nil {
		return err
	}
	for i, bu := range bs {
		b.remaining.WithLabelValues(bu.Name, scope(bu, r.Agent)).Set(remaining(bu, vals[i]))
	}
	if over < 0 {
		return nil
	}
	bu := bs[over]
	b.refused.WithLabelValues(bu.Name, "exceeded").Inc()
	return &Exceeded{Budget: bu.Name, Unit: bu.Unit, Window: bu.Window, Limit: bu.Limit, Used: vals[over],
		RetryAfter: ends[over].Sub(now)}
}

// take runs a check's counters through the shared store, or locally: always without one;
// when the store failed, for budgets that fall back to local counters.
func (b *Budgets) take(ctx context.Context, cs []Counter, bs []*Budget) ([]int64, int, error) {
	if b.shared == nil {
		return b.local.Take(ctx, cs)
	}
	var err error
	if d := b.down.Load(); d == 0 || b.o.Now().UnixNano() >= d {
		var vals []int64
		var over int
		// Adds made locally while the store failed go to it first, so this check sees them.
		if err = b.replay(ctx); err == nil {
			vals, over, err = b.shared.Take(ctx, cs)
		}
		if err == nil {
			b.down.Store(0)
			for i, c := range cs {
				b.local.seed(c.Key, vals[i], c.TTL)
			}
			return vals, over, nil
		}
		b.storeError.WithLabelValues("take").Inc()
		b.down.Store(b.o.Now().Add(downFor).UnixNano())
		b.o.Log.Warn().Err(err).Msg("budget store failed; budgets apply on_store_error")
	} else {
		err = fmt.Errorf("the store failed less than %s ago", downFor)
	}
	for _, bu := range bs {
		if b.onStoreError(bu) == FailClosed {
			b.refused.WithLabelValues(bu.Name, "store_unavailable").Inc()
			return nil, 0, &Unavailable{Budget: bu.Name, Err: err}
		}
	}
	// Local counters, from the last values the store gave: each broker can let through at
	// most what was left of a budget then, so a fleet of N overshoots by at most N-1 times it.
	vals, over, _ := b.local.Take(ctx, cs)
	if over < 0 {
		for _, c := range cs {
			if c.Add != 0 {
				b.owe(c.Key, c.Add, c.TTL)
			}
		}
	}
	return vals, over, nil
}

// owe keeps an add made locally for the shared store, to be replayed when it answers again.
func (b *Budgets) owe(key string, n int64, ttl time.Duration) {
	b.owedMu.Lock()
	defer b.owedMu.Unlock()
	o := b.owed[key]
	o.n += n
	o.ttl = max(o.ttl, ttl)
	b.owed[key] = o
}

// replay writes the owed adds to the shared store; those it could not write stay owed.
func (b *Budgets) replay(ctx context.Context) error {
	b.owedMu.Lock()
	if len(b.owed) == 0 {
		b.owedMu.Unlock()
		return nil
	}
	owed := b.owed
	b.owed = map[string]owedAdd{}
	b.owedMu.Unlock()
	var err error
	for k, o := range owed {
		if err == nil {
			err = b.shared.Add(ctx, k, o.n, o.ttl)
			if err == nil {
				continue
			}
		}
		b.owe(k, o.n, o.ttl)
	}
	return err
}

// write adds a call's usage to a counter of the shared store before the call is done with: a
// check on any broker that starts after it sees it. When the store fails, or failed less than
// downFor ago, the add is owed and replayed before the next take.
func (b *Budgets) write(key string, n int64, ttl time.Duration) {
	if d := b.down.Load(); d != 0 && b.o.Now().UnixNano() < d {
		b.owe(key, n, ttl)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := b.shared.Add(ctx, key, n, ttl); err != nil {
		b.storeError.WithLabelValues("add").Inc()
		b.down.Store(b.o.Now().Add(downFor).UnixNano())
		b.owe(key, n, ttl)
	}
}

func scope(bu *Budget, agent string) string {
	if bu.PerAgent {
		return agent
	}
	return ""
}

func remaining(bu *Budget, used int64) float64 {
	r := float64(bu.Limit - used)
	if r < 0 {
		r = 0
	}
	if bu.Unit == UnitCost {
		r /= microDollars
	}
	return r
}

// Record counts a metered call's tokens and cost against the tokens and cost budgets that
// apply to it, in the window it ends in, and returns its cost by data.prices (0 when the
// model has no price). A call that started within a budget and ended over it is counted
// whole: the next request is refused. With a shared store, the usage is written there
// before Record returns (one round trip; owed and replayed when the store fails).
func (b *Budgets) Record(c usage.Call) float64 {
	s, err := b.set()
	if err != nil {
		return 0
	}
	cost, _ := s.Cost(c.Model, c.In, c.Out, c.Cached)
	now := b.o.Now()
	for _, bu := range s.Budgets {
		if bu.Unit == UnitRequests || !bu.appliesToAgent(c.Agent, c.Labels) || !bu.appliesToCall(c.Provider, c.Model) {
			continue
		}
		n := c.In + c.Out
		if bu.Unit == UnitCost {
			n = cost
		}
		if n == 0 {
			continue
		}
		start, end := Window(bu.Window, now)
		key, ttl := bu.key(c.Agent, start), end.Sub(now)+keyMargin
		_ = b.local.Add(context.Background(), key, n, ttl)
		if b.shared != nil {
			b.write(key, n, ttl)
		}
		v, _ := b.local.Get(context.Background(), []string{key})
		b.remaining.WithLabelValues(bu.Name, scope(bu, c.Agent)).Set(remaining(bu, v[0]))
	}
	return float64(cost) / microDollars
}

// Within reports whether a call still in progress (its tokens so far in c) keeps within the
// hard budgets (hard: true) that apply to it, and names the first it would overrun. It reads
// the counters this broker holds (the shared store's values as of its last answer, plus the
// usage recorded here since): no round trip, so a stream wrapper may ask at every event.
func (b *Budgets) Within(c usage.Call) (ok bool, budget string) {
	s, err := b.set()
	if err != nil {
		return true, ""
	}
	var cost int64
	costDone := false
	now := b.o.Now()
	for _, bu := range s.Budgets {
		if !bu.Hard || !bu.appliesToAgent(c.Agent, c.Labels) || !bu.appliesToCall(c.Provider, c.Model) {
			continue
		}
		n := c.In + c.Out
		if bu.Unit == UnitCost {
			if !costDone {
				cost, _ = s.Cost(c.Model, c.In, c.Out, c.Cached)
				costDone = true
			}
			n = cost
		}
		start, _ := Window(bu.Window, now)
		v, _ := b.local.Get(context.Background(), []string{bu.key(c.Agent, start)})
		if v[0]+n > bu.Limit {
			return false, bu.Name
		}
	}
	return true, ""
}

// HardApplies reports whether a hard budget may apply to a call of agent to provider (of
// whichever model: Within reads it as the call goes).
func (b *Budgets) HardApplies(agent string, labels map[string]string, provider string) bool {
	s, err := b.set()
	if err != nil {
		return false
	}
	for _, bu := range s.Budgets {
		if bu.Hard && bu.appliesToAgent(agent, labels) && (bu.Provider == "" || bu.Provider == provider) {
			return true
		}
	}
	return false
}

// Metering names a tokens or cost budget that may apply to a call of agent to provider (of
// whichever model), or "": a call such a budget applies to must be metered, or refused.
func (b *Budgets) Metering(agent string, labels map[string]string, provider string) string {
	s, err := b.set()
	if err != nil {
		return ""
	}
	for _, bu := range s.Budgets {
		if bu.Unit != UnitRequests && bu.appliesToAgent(agent, labels) && (bu.Provider == "" || bu.Provider == provider) {
			return bu.Name
		}
	}
	return ""
}

// Usage is input.usage: the budgets that apply to the agent (whatever the provider or
// model), each with its counter now. It reads the shared store once; when that fails, the
// counters this broker holds.
func (b *Budgets) Usage(ctx context.Context, agent string, labels map[string]string) map[string]any {
	s, err := b.set()
	if err != nil || len(s.Budgets) == 0 {
		return map[string]any{}
	}
	now := b.o.Now()
	var bs []*Budget
	var keys []string
	for _, bu := range s.Budgets {
		if bu.appliesToAgent(agent, labels) {
			start, _ := Window(bu.Window, now)
			bs = append(bs, bu)
			keys = append(keys, bu.key(agent, start))
		}
	}
	vals := b.read(ctx, keys)
	out := make(map[string]any, len(bs))
	for i, bu := range bs {
		out[bu.Name] = entry(bu, vals[i], now)
	}
	return out
}

// read gets counters from the shared store, or from memory.
func (b *Budgets) read(ctx context.Context, keys []string) []int64 {
	if b.shared != nil {
		if d := b.down.Load(); d == 0 || b.o.Now().UnixNano() >= d {
			vals, err := b.shared.Get(ctx, keys)
			if err == nil {
				for i, k := range keys {
					b.local.seed(k, vals[i], time.Hour) // refreshed with its real TTL by the next check
				}
				return vals
			}
			b.storeError.WithLabelValues("get").Inc()
			b.down.Store(b.o.Now().Add(downFor).UnixNano())
		}
	}
	vals, _ := b.local.Get(ctx, keys)
	return vals
}

// entry is one budget's counter as input.usage and the usage summary show it.
func entry(bu *Budget, used int64, now time.Time) map[string]any {
	_, end := Window(bu.Window, now)
	e := map[string]any{
		"unit":      bu.Unit,
		"window":    bu.Window,
		"resets_at": end.Format(time.RFC3339),
	}
	if bu.Unit == UnitCost {
		e["limit"] = float64(bu.Limit) / microDollars
		e["used"] = float64(used) / microDollars
		e["remaining"] = remaining(bu, used)
	} else {
		e["limit"] = bu.Limit
		e["used"] = used
		e["remaining"] = max(bu.Limit-used, 0)
	}
	if bu.Provider != "" {
		e["provider"] = bu.Provider
	}
	if bu.Model != "" {
		e["model"] = bu.Model
	}
	return e
}

// Line is one counter of the usage summary (GET /api/usage).
type Line struct {
	Budget string         `json:"budget"`
	Agent  string         `json:"agent,omitempty"` // a per-agent budget's agent
	Usage  map[string]any `json:"usage"`
}

// Summary lists every budget's counter now: one for a budget kept for all the agents it
// selects, one per agent it selects in agents (ID -> labels) for a per-agent budget.
func (b *Budgets) Summary(ctx context.Context, agents map[string]map[string]string) ([]Line, error) {
	s, err := b.set()
	if err != nil {
		return nil, err
	}
	now := b.o.Now()
	var lines []Line
	var keys []string
	var bs []*Budget
	for _, bu := range s.Budgets {
		start, _ := Window(bu.Window, now)
		if !bu.PerAgent {
			lines = append(lines, Line{Budget: bu.Name})
			keys = append(keys, bu.key("", start))
			bs = append(bs, bu)
			continue
		}
		for _, a := range slices.Sorted(maps.Keys(agents)) {
			if bu.appliesToAgent(a, agents[a]) {
				lines = append(lines, Line{Budget: bu.Name, Agent: a})
				keys = append(keys, bu.key(a, start))
				bs = append(bs, bu)
			}
		}
	}
	vals := b.read(ctx, keys)
	for i := range lines {
		lines[i].Usage = entry(bs[i], vals[i], now)
	}
	return lines, nil
}
