package llm

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/capbroker/capbroker/broker/usage"
)

// maxModels is how many model names get their own metric label; calls to any other model are
// labelled "other". The model comes from the agent's request: it must not grow the label set.
const maxModels = 64

// Metrics count metered calls by agent, provider and model.
type Metrics struct {
	tokens   *prometheus.CounterVec
	requests *prometheus.CounterVec
	cost     *prometheus.CounterVec

	mu     sync.Mutex
	models map[string]bool
}

// NewMetrics registers the metering metrics in reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capbroker_llm_tokens_total",
			Help: "Tokens of metered LLM calls as the provider reported them, by agent, provider, model and kind (in, out, cached: the part of in served from a cache).",
		}, []string{"agent", "provider", "model", "kind"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capbroker_llm_requests_total",
			Help: "Metered LLM calls, by agent, provider, model and usage (reported, unreported: no usage or usage that did not parse).",
		}, []string{"agent", "provider", "model", "usage"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capbroker_llm_cost_total",
			Help: "Cost of metered LLM calls, as the price table gives it, by agent, provider and model.",
		}, []string{"agent", "provider", "model"}),
		models: map[string]bool{},
	}
	reg.MustRegister(m.tokens, m.requests, m.cost)
	return m
}

// Observe counts one call and its cost.
func (m *Metrics) Observe(c usage.Call, cost float64) {
	if m == nil {
		return
	}
	model := m.label(c.Model)
	if !c.Reported {
		m.requests.WithLabelValues(c.Agent, c.Provider, model, "unreported").Inc()
		return
	}
	m.requests.WithLabelValues(c.Agent, c.Provider, model, "reported").Inc()
	m.tokens.WithLabelValues(c.Agent, c.Provider, model, "in").Add(float64(c.In))
	m.tokens.WithLabelValues(c.Agent, c.Provider, model, "out").Add(float64(c.Out))
	m.tokens.WithLabelValues(c.Agent, c.Provider, model, "cached").Add(float64(c.Cached))
	if cost > 0 {
		m.cost.WithLabelValues(c.Agent, c.Provider, model).Add(cost)
	}
}

// label is model's label value: itself while fewer than maxModels are known, "other" after.
func (m *Metrics) label(model string) string {
	if model == "" {
		return "unknown"
	}
	if !strconv.CanBackquote(model) {
		return "other" // control characters and the like: not a name
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.models[model] {
		return model
	}
	if len(m.models) >= maxModels {
		return "other"
	}
	m.models[model] = true
	return model
}
