// Package budget keeps LLM and request budgets: the limits declared in the policy's data
// (data.budgets, with the price table data.prices), the counters they are kept with (in
// memory, or in Redis shared by a fleet of brokers), the check before a request is forwarded,
// and the usage a meter records after (usage.Recorder).
package budget

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Units a budget counts.
const (
	UnitRequests = "requests"
	UnitTokens   = "tokens"
	UnitCost     = "cost"
)

// Windows a budget is kept over: calendar periods in UTC.
const (
	WindowMinute = "minute"
	WindowHour   = "hour"
	WindowDay    = "day"
	WindowMonth  = "month"
)

// What a budget does when its shared store cannot be reached.
const (
	FailClosed = "fail_closed"
	Local      = "local"
)

// microDollars: cost counters are whole millionths of the price table's currency, so that a
// shared store adds integers.
const microDollars = 1e6

// Budget is one entry of data.budgets.
type Budget struct {
	Name string
	// Selectors: a budget applies to a request that matches all it sets.
	Agents   []string          // agent IDs; none: every agent
	Labels   map[string]string // every label must have this value
	Provider string            // "openai", "anthropic", "gemini" or a configured name
	Model    string            // exact, or "prefix*"
	// PerAgent keeps one counter for each agent the budget applies to; else one for all.
	PerAgent bool
	Unit     string
	// Limit in the unit: requests, tokens, or millionths of a currency unit for cost.
	Limit  int64
	Window string
	// OnStoreError overrides budgets.on_store_error for this budget ("" keeps it).
	OnStoreError string
	// Hard: a streamed response is cut once this budget would be over (see Budgets.Within).
	Hard bool
}

// Price is the price of a model's tokens per million, in the unit cost budgets use.
type Price struct {
	Input, Output, Cached float64
	cachedSet             bool
}

// Set is the parsed budget data of one policy revision.
type Set struct {
	Budgets []*Budget // sorted by name
	prices  map[string]Price
	// prefixes are the price table's "prefix*" entries, longest first.
	prefixes []string
}

// Parse reads data.budgets and data.prices from a policy's data document. Both are optional.
func Parse(data map[string]any) (*Set, error) {
	s := &Set{prices: map[string]Price{}}
	var problems []string
	bad := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
	if raw, ok := data["budgets"]; ok && raw != nil {
		m, ok := raw.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("data.budgets: must be an object of budgets by name")
		}
		for name, v := range m {
			b, err := parseBudget(name, v)
			if err != nil {
				bad("data.budgets.%s: %v", name, err)
				continue
			}
			s.Budgets = append(s.Budgets, b)
		}
	}
	sort.Slice(s.Budgets, func(i, j int) bool { return s.Budgets[i].Name < s.Budgets[j].Name })
	if raw, ok := data["prices"]; ok && raw != nil {
		m, ok := raw.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("data.prices: must be an object of prices by model")
		}
		for model, v := range m {
			p, err := parsePrice(v)
			if err != nil {
				bad("data.prices.%s: %v", model, err)
				continue
			}
			s.prices[model] = p
			if strings.HasSuffix(model, "*") {
				s.prefixes = append(s.prefixes, model)
			}
		}
		sort.Slice(s.prefixes, func(i, j int) bool {
			if len(s.prefixes[i]) != len(s.prefixes[j]) {
				return len(s.prefixes[i]) > len(s.prefixes[j])
			}
			return s.prefixes[i] < s.prefixes[j]
		})
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return nil, fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return s, nil
}

var budgetKeys = map[string]bool{"agent": true, "labels": true, "provider": true, "model": true, "per": true,
	"requests": true, "tokens": true, "cost": true, "window": true, "on_store_error": true, "hard": true}

func parseBudget(name string, v any) (*Budget, error) {
	if name == "" || strings.ContainsAny(name, ":{} \t\n") {
		return nil, fmt.Errorf("a budget's name must not be empty or hold ':', '{', '}' or spaces")
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("must be an object")
	}
	for k := range m {
		if !budgetKeys[k] {
			return nil, fmt.Errorf("unknown key %q", k)
		}
	}
	b := &Budget{Name: name}
	switch a := m["agent"].(type) {
	case nil:
	case string:
		b.Agents = []string{a}
	case []any:
		for _, x := range a {
			s, ok := x.(string)
			if !ok {
				return nil, fmt.Errorf("agent: must be an agent ID or a list of them")
			}
			b.Agents = append(b.Agents, s)
		}
	default:
		return nil, fmt.Errorf("agent: must be an agent ID or a list of them")
	}
	if l, ok := m["labels"]; ok {
		lm, ok := l.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("labels: must be an object of label values")
		}
		b.Labels = map[string]string{}
		for k, x := range lm {
			s, ok := x.(string)
			if !ok {
				return nil, fmt.Errorf("labels.%s: must be a string", k)
			}
			b.Labels[k] = s
		}
	}
	var err error
	if b.Provider, err = optString(m, "provider"); err != nil {
		return nil, err
	}
	if b.Model, err = optString(m, "model"); err != nil {
		return nil, err
	}
	per, err := optString(m, "per")
	if err != nil {
		return nil, err
	}
	switch per {
	case "", "all":
	case "agent":
		b.PerAgent = true
	default:
		return nil, fmt.Errorf("per: must be \"agent\" or \"all\", not %q", per)
	}
	for _, u := range []string{UnitRequests, UnitTokens, UnitCost} {
		x, ok := m[u]
		if !ok {
			continue
		}
		if b.Unit != "" {
			return nil, fmt.Errorf("set only one of requests, tokens, cost")
		}
		f, ok := number(x)
		if !ok || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
			return nil, fmt.Errorf("%s: must be a number, 0 or more", u)
		}
		b.Unit = u
		if u == UnitCost {
			b.Limit = int64(math.Round(f * microDollars))
		} else {
			if f != math.Trunc(f) {
				return nil, fmt.Errorf("%s: must be a whole number", u)
			}
			b.Limit = int64(f)
		}
	}
	if b.Unit == "" {
		return nil, fmt.Errorf("set one of requests, tokens, cost: the limit")
	}
	if b.Window, err = optString(m, "window"); err != nil {
		return nil, err
	}
	if _, err := windowLength(b.Window); err != nil {
		return nil, err
	}
	if b.OnStoreError, err = optString(m, "on_store_error"); err != nil {
		return nil, err
	}
	if b.OnStoreError != "" && b.OnStoreError != FailClosed && b.OnStoreError != Local {
		return nil, fmt.Errorf("on_store_error: must be %q or %q, not %q", FailClosed, Local, b.OnStoreError)
	}
	if h, ok := m["hard"]; ok {
		hb, ok := h.(bool)
		if !ok {
			return nil, fmt.Errorf("hard: must be true or false")
		}
		if hb && b.Unit == UnitRequests {
			return nil, fmt.Errorf("hard: only a tokens or cost budget can cut a response")
		}
		b.Hard = hb
	}
	return b, nil
}

var priceKeys = map[string]bool{"input": true, "output": true, "cached": true}

func parsePrice(v any) (Price, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return Price{}, fmt.Errorf("must be an object {input, output, cached} (per million tokens)")
	}
	var p Price
	for k, x := range m {
		if !priceKeys[k] {
			return Price{}, fmt.Errorf("unknown key %q", k)
		}
		f, ok := number(x)
		if !ok || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
			return Price{}, fmt.Errorf("%s: must be a number, 0 or more", k)
		}
		switch k {
		case "input":
			p.Input = f
		case "output":
			p.Output = f
		case "cached":
			p.Cached, p.cachedSet = f, true
		}
	}
	return p, nil
}

func optString(m map[string]any, k string) (string, error) {
	v, ok := m[k]
	if !ok || v == nil {
		return "", nil
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s: must be a string", k)
	}
	return s, nil
}

func number(v any) (float64, bool) {
	switch n := v.(type) {
	case json.Number:
		f, err := n.Float64()
		return f, err == nil
	case float64:
		return n, true
	case int:
		return float64(n), true
	case int64:
		return float64(n), true
	}
	return 0, false
}

// Cost returns what the tokens cost by the price table, in millionths, and whether the model
// has a price. Cached tokens are part of in; they cost the cached price (the input price when
// the table gives none).
func (s *Set) Cost(model string, in, out, cached int64) (int64, bool) {
	p, ok := s.price(model)
	if !ok {
		return 0, false
	}
	if cached > in {
		cached = in
	}
	cp := p.Input
	if p.cachedSet {
		cp = p.Cached
	}
	// Per million tokens, in millionths: the price times the tokens.
	c := float64(in-cached)*p.Input + float64(cached)*cp + float64(out)*p.Output
	return int64(math.Round(c)), true
}

// price finds a model's price: its exact entry, else the longest "prefix*" entry it matches.
func (s *Set) price(model string) (Price, bool) {
	if p, ok := s.prices[model]; ok {
		return p, true
	}
	for _, pre := range s.prefixes {
		if strings.HasPrefix(model, strings.TrimSuffix(pre, "*")) {
			return s.prices[pre], true
		}
	}
	return Price{}, false
}

// windowLength checks a window's name; its length is that of a calendar period.
func windowLength(w string) (time.Duration, error) {
	switch w {
	case WindowMinute:
		return time.Minute, nil
	case WindowHour:
		return time.Hour, nil
	case WindowDay:
		return 24 * time.Hour, nil
	case WindowMonth:
		return 31 * 24 * time.Hour, nil
	}
	return 0, fmt.Errorf("window: must be minute, hour, day or month, not %q", w)
}

// Window returns the calendar period (UTC) of kind w that holds t: [start, end).
func Window(w string, t time.Time) (start, end time.Time) {
	t = t.UTC()
	switch w {
	case WindowMinute:
		start = t.Truncate(time.Minute)
		return start, start.Add(time.Minute)
	case WindowHour:
		start = t.Truncate(time.Hour)
		return start, start.Add(time.Hour)
	case WindowDay:
		start = time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(0, 0, 1)
	default: // month
		start = time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(0, 1, 0)
	}
}

// Request is what budgets match a request on.
type Request struct {
	Agent    string
	Labels   map[string]string
	Provider string // "" when the host is no known LLM API
	// Model returns the request's model, read only when a budget that applies names one.
	Model func() string
}

// appliesToAgent reports whether b's agent and label selectors hold.
func (b *Budget) appliesToAgent(agent string, labels map[string]string) bool {
	if len(b.Agents) > 0 {
		found := false
		for _, a := range b.Agents {
			if a == agent {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	for k, v := range b.Labels {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// needsLLM: the budget counts LLM calls only (it names a provider or a model, or counts
// tokens or cost).
func (b *Budget) needsLLM() bool {
	return b.Provider != "" || b.Model != "" || b.Unit != UnitRequests
}

// appliesToCall reports whether b's provider and model selectors hold for an LLM call.
func (b *Budget) appliesToCall(provider, model string) bool {
	if b.Provider != "" && b.Provider != provider {
		return false
	}
	return b.Model == "" || matchModel(b.Model, model)
}

func matchModel(pattern, model string) bool {
	if p, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(model, p)
	}
	return pattern == model
}

// Match returns the budgets that apply to a request. A budget naming no provider, model,
// tokens or cost counts every request of the agents it selects; any other, requests to an
// LLM API only.
func (s *Set) Match(r Request) []*Budget {
	var out []*Budget
	model, read := "", false
	for _, b := range s.Budgets {
		if !b.appliesToAgent(r.Agent, r.Labels) {
			continue
		}
		if b.needsLLM() {
			if r.Provider == "" {
				continue
			}
			if b.Model != "" && !read {
				if r.Model != nil {
					model = r.Model()
				}
				read = true
			}
			if !b.appliesToCall(r.Provider, model) {
				continue
			}
		}
		out = append(out, b)
	}
	return out
}

// key names a budget's counter for a window: by the window's start, so that every broker
// sharing a store counts the same period in the same key.
func (b *Budget) key(agent string, start time.Time) string {
	scope := ""
	if b.PerAgent {
		scope = agent
	}
	k := make([]byte, 0, len(b.Name)+len(b.Unit)+len(scope)+len(b.Window)+16)
	k = append(append(append(append(k, b.Name...), ':'), b.Unit...), ':')
	k = append(append(append(append(k, scope...), ':'), b.Window...), ':')
	return string(strconv.AppendInt(k, start.Unix(), 10))
}
