package postgres

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the front door's Prometheus metrics, by upstream and Vault role.
type Metrics struct {
	connections *prometheus.CounterVec
	open        *prometheus.GaugeVec
	statements  *prometheus.CounterVec
	cancels     *prometheus.CounterVec
}

// NewMetrics registers the metrics with reg (nil: not registered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		connections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "capbroker_postgres_connections_total",
			Help: "Agent connections to the Postgres front door, by upstream, Vault role and outcome."}, []string{"upstream", "role", "outcome"}),
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "capbroker_postgres_connections_open",
			Help: "Agent connections open through the Postgres front door, by upstream and Vault role."}, []string{"upstream", "role"}),
		statements: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "capbroker_postgres_statements_total",
			Help: "Statements refused or held by the Postgres front door's statement rules, by upstream, role, kind and outcome."},
			[]string{"upstream", "role", "kind", "outcome"}),
		cancels: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "capbroker_postgres_cancels_total",
			Help: "Query cancel requests, by outcome (forwarded, unknown, failed)."}, []string{"outcome"}),
	}
	if reg != nil {
		reg.MustRegister(m.connections, m.open, m.statements, m.cancels)
	}
	return m
}
