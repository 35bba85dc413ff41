package broker

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics are the broker's Prometheus metrics. Labels carry only fixed vocabularies (phase,
// decision, result), never hosts, agents' tokens or values.
type Metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	reloads  *prometheus.CounterVec
	watched  sync.Once
}

// NewMetrics registers the broker's metrics in reg (a new registry when nil).
func NewMetrics(reg *prometheus.Registry) *Metrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &Metrics{
		reg: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capbroker_requests_total",
			Help: "Decisions made, by phase (connect, request) and decision (allow, deny, error).",
		}, []string{"phase", "decision"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "capbroker_request_duration_seconds",
			Help:    "Time from receiving a request to the end of its response, by phase.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"phase"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capbroker_policy_reloads_total",
			Help: "Policy reloads, by result (ok, error).",
		}, []string{"result"}),
	}
	reg.MustRegister(m.requests, m.latency, m.reloads,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry is where the metrics live, for the admin /metrics handler.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// PolicyReload counts one reload attempt.
func (m *Metrics) PolicyReload(err error) {
	if err != nil {
		m.reloads.WithLabelValues("error").Inc()
		return
	}
	m.reloads.WithLabelValues("ok").Inc()
}

// watch exports what is read from a broker's parts when metrics are gathered: the size of its
// certificate cache, and the audit events whose write failed. Only the first broker given a
// Metrics is watched.
func (m *Metrics) watch(certs func() int, auditLost func() int64) {
	m.watched.Do(func() {
		m.reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "capbroker_cert_cache_entries",
				Help: "Leaf certificates held in the interception certificate cache.",
			}, func() float64 { return float64(certs()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "capbroker_audit_events_lost_total",
				Help: "Audit events that could not be written (the write to the audit file or stdout failed).",
			}, func() float64 { return float64(auditLost()) }),
		)
	})
}
