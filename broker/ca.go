package broker

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/capbroker/capbroker/broker/certs"
)

// CAState reports the state of the broker's CA. *certs.CA implements it.
type CAState interface {
	Status() certs.Status
}

var _ CAState = (*certs.CA)(nil)

// codeCAUnavailable is the error of a connection the policy would intercept while the CA
// cannot sign (certs.ErrUnavailable; ca.vault_pki: its intermediate is near expiry and Vault
// could not renew it): 503, before any TLS. Why the CA cannot sign goes to the audit event only.
const codeCAUnavailable = "ca_unavailable"

// checkCA returns certs.ErrUnavailable, wrapped, when a connection to be intercepted now could
// not be given a certificate.
func (b *Broker) checkCA() error { return b.certs.Ready() }

// watchCA exports the CA's state as metrics and has /readyz report it. Only the first CA
// given a Metrics is watched.
func (m *Metrics) watchCA(ca CAState) {
	if !m.ca.CompareAndSwap(nil, &ca) {
		return
	}
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "capbroker_ca_ready",
			Help: "1 while the CA can sign leaf certificates, else 0: connections the policy would intercept are refused (503 ca_unavailable).",
		}, func() float64 {
			if ca.Status().Error == "" {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "capbroker_ca_not_after_timestamp_seconds",
			Help: "When the CA's current signing certificate expires (ca.vault_pki: the current intermediate), Unix time; 0 while there is none.",
		}, func() float64 {
			if t := ca.Status().NotAfter; !t.IsZero() {
				return float64(t.Unix())
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "capbroker_ca_renewals_total",
			Help: "Intermediates Vault's PKI engine signed for this broker since start (ca.vault_pki).",
		}, func() float64 { return float64(ca.Status().Renewals) }),
	)
}

// caReadiness adds the CA's state to a /readyz body: always for ca.vault_pki, and for any CA
// that cannot sign. ready is false when the CA cannot sign: nothing that the policy
// intercepts can be served. degraded is true while the last renewal failed but the current
// intermediate still signs.
func (m *Metrics) caReadiness(body map[string]any) (ready, degraded bool) {
	p := m.ca.Load()
	if p == nil {
		return true, false
	}
	st := (*p).Status()
	if st.Source == "file" && st.Error == "" {
		return true, false
	}
	ca := map[string]any{"source": st.Source, "serial": st.Serial, "not_after": timeOrNil(st.NotAfter)}
	if st.Source == "vault_pki" {
		ca["renew_at"], ca["renewals"] = timeOrNil(st.RenewAt), st.Renewals
		ca["renew_seconds"] = st.RenewTook.Seconds()
		if st.RenewFailed != "" {
			ca["renew_error"] = st.RenewFailed
		}
	}
	if st.Error != "" {
		ca["error"] = st.Error
	}
	body["ca"] = ca
	return st.Error == "", st.RenewFailed != ""
}
