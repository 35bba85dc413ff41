package approvals

import "github.com/prometheus/client_golang/prometheus"

// Metrics of approvals and the webhook.
type Metrics struct {
	pending  prometheus.Gauge
	total    *prometheus.CounterVec
	webhooks *prometheus.CounterVec
}

// NewMetrics registers the metrics with reg (none when nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "capbroker_approvals_pending",
			Help: "Requests held for a person's approval now.",
		}),
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capbroker_approvals_total",
			Help: "Held requests by how they ended (approved, denied, timeout, withdrawn, interrupted), asks a grant answered (granted), and asks refused over the bounds (queue_full).",
		}, []string{"outcome"}),
		webhooks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capbroker_webhook_deliveries_total",
			Help: "Webhook delivery attempts by outcome: ok, retry (failed, will be tried again), failed (gave up), dropped (queue full).",
		}, []string{"outcome"}),
	}
	for _, o := range []string{StateApproved, StateDenied, StateTimeout, StateWithdrawn, StateInterrupted, "granted", "queue_full"} {
		m.total.WithLabelValues(o)
	}
	for _, o := range []string{"ok", "retry", "failed", "dropped"} {
		m.webhooks.WithLabelValues(o)
	}
	if reg != nil {
		reg.MustRegister(m.pending, m.total, m.webhooks)
	}
	return m
}

// Granted counts an ask a grant answered.
func (m *Metrics) Granted() { m.total.WithLabelValues("granted").Inc() }
