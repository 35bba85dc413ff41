package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/llm"
	"github.com/capbroker/capbroker/broker/upstream"
	"github.com/capbroker/capbroker/credentials"
)

// Metrics are the broker's Prometheus metrics. Every label has a bounded set of values: fixed
// vocabularies (phase, decision, class), and names from the config (agent ids, credential
// names, the hosts credentials are bound to). Any other host is "other"; tokens, paths and
// values never become labels.
type Metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	reloads  *prometheus.CounterVec

	// egress counts finished exchanges by agent, host, outcome and credential.
	egress         *prometheus.CounterVec
	upstreamErrors *prometheus.CounterVec
	reloadFailures prometheus.Counter
	inflight       prometheus.Gauge
	build          *prometheus.GaugeVec
	opaque         atomic.Int64 // opaque tunnels open

	// lastReloadErr is the error of the last policy reload, nil after a good one: /readyz
	// reports it while the policy on disk does not load.
	lastReloadErr atomic.Pointer[string]

	// Config reloads: counted by result; the last refused one, nil after a good one, for
	// /readyz; its time stays in lastRefusedAt.
	configReloads *prometheus.CounterVec
	lastReloadOK  prometheus.Gauge
	lastRefusedAt prometheus.Gauge
	lastRefused   atomic.Pointer[RefusedReload]

	labels atomic.Pointer[labelSet]
	// children caches the egress counter of each label combination seen, so that the hot
	// path does one map lookup and no allocation.
	mu       sync.RWMutex
	children map[egressKey]prometheus.Counter
	// exchanges caches the request counter and the latency histogram of each phase and
	// decision seen (a few dozen at most), likewise.
	exchanges map[[2]string]exchangeMetrics

	watched sync.Once

	llm *llm.Metrics // metered LLM calls

	// proxyRequests counts exchanges by the upstream proxy they went through and result.
	proxyRequests *prometheus.CounterVec
	// proxyCheck, once a broker is made, reports its upstream proxies that cannot be connected to.
	proxyCheck atomic.Pointer[proxyChecker]
	// ca, once a broker is made, is its CA, whose state /readyz reports (ca.go).
	ca atomic.Pointer[CAState]
	// telemetryProblem, when telemetry is exported, says why the collector refuses it.
	telemetryProblem atomic.Pointer[func() string]
}

type proxyChecker struct {
	check func(ctx context.Context) map[string]string
}

// Label values for what is outside the configured sets.
const (
	labelOther = "other" // a host no credential is bound to; an agent not in the config
	labelNone  = ""      // no agent identified (proxy-auth challenge); no credential granted
	// labelMultiple is the credential label of a request granted more than one credential.
	labelMultiple = "multiple"
)

type egressKey struct{ agent, host, outcome, credential string }

// NewMetrics registers the broker's metrics in reg (a new registry when nil).
func NewMetrics(reg *prometheus.Registry) *Metrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &Metrics{
		reg: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capbroker_requests_total",
			Help: "Decisions made, by phase (connect, request, dns) and decision (allow, deny, error).",
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
		egress: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capbroker_agent_requests_total",
			Help: `Finished exchanges (connect and request phase) by agent (configured ids; "" before identification), ` +
				`host (hosts credentials are bound to, as configured, else "other"), outcome (allow, deny, error, or the error code ` +
				`of an exchange that failed: credential_unavailable, upstream_error, policy_error, ...) ` +
				`and credential (the one granted, "" for none, "multiple").`,
		}, []string{"agent", "host", "outcome", "credential"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capbroker_upstream_errors_total",
			Help: "Requests and tunnels the upstream failed, by class: refused, timeout, dns, tls, reset, forbidden_destination, protocol, unscrubbable, other.",
		}, []string{"class"}),
		proxyRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capbroker_upstream_proxy_requests_total",
			Help: `Requests and tunnels by who made them (client: agent; broker for the broker's own connections to Vault, token endpoints, the webhook, bundles, Redis, counted per connection), ` +
				`the upstream proxy they went through (upstream.proxy; "direct" for none) and result (ok, failed: unreachable, refused or upstream error).`,
		}, []string{"client", "proxy", "result"}),
		reloadFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "capbroker_policy_reload_failures_total",
			Help: "Policy reloads (directory watch or bundle) that failed; the last good policy kept deciding.",
		}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "capbroker_requests_in_flight",
			Help: "Exchanges between arrival and their audit event (an opaque tunnel counts until it closes).",
		}),
		configReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capbroker_config_reloads_total",
			Help: "Config reloads (SIGHUP or the file changed), by result: ok, or refused (the running config stays).",
		}, []string{"result"}),
		lastReloadOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "capbroker_config_last_reload_successful",
			Help: "1 when the config file last loaded (at start or by the last reload), 0 while its last reload was refused.",
		}),
		lastRefusedAt: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "capbroker_config_reload_last_refused_timestamp_seconds",
			Help: "When the last config reload was refused, as a Unix time; 0 if none was.",
		}),
		build: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "capbroker_build_info",
			Help: "Always 1; the labels say which build is running.",
		}, []string{"version", "commit", "goversion"}),
		children:  map[egressKey]prometheus.Counter{},
		exchanges: map[[2]string]exchangeMetrics{},
	}
	m.labels.Store(&labelSet{agents: map[string]bool{}, hosts: map[string]bool{}})
	m.build.WithLabelValues("dev", "unknown", runtime.Version()).Set(1)
	m.configReloads.WithLabelValues("ok")
	m.configReloads.WithLabelValues("refused")
	m.lastReloadOK.Set(1)
	reg.MustRegister(m.proxyRequests)
	reg.MustRegister(m.requests, m.latency, m.reloads, m.egress, m.upstreamErrors, m.reloadFailures, m.inflight, m.build,
		m.configReloads, m.lastReloadOK, m.lastRefusedAt,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.llm = llm.NewMetrics(reg)
	return m
}

// Registry is where the metrics live, for the admin /metrics handler.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// SetBuild sets the labels of capbroker_build_info.
func (m *Metrics) SetBuild(version, commit string) {
	m.build.Reset()
	m.build.WithLabelValues(version, commit, runtime.Version()).Set(1)
}

// PolicyReload counts one reload attempt and remembers its error for /readyz.
func (m *Metrics) PolicyReload(err error) {
	if err != nil {
		m.reloads.WithLabelValues("error").Inc()
		m.reloadFailures.Inc()
		msg := err.Error()
		m.lastReloadErr.Store(&msg)
		return
	}
	m.reloads.WithLabelValues("ok").Inc()
	m.lastReloadErr.Store(nil)
}

// PolicyReloadError is the error of the last policy reload, "" when it succeeded (or none
// was tried).
func (m *Metrics) PolicyReloadError() string {
	if p := m.lastReloadErr.Load(); p != nil {
		return *p
	}
	return ""
}

// RefusedReload is the last config reload that was refused, as /readyz shows it.
type RefusedReload struct {
	At time.Time
	// Error is the reload's problems with every quoted value of the file replaced by "…":
	// /readyz may be read by anyone who reaches the admin port, and a value pasted into the
	// wrong key must not be shown there. The log has the full text.
	Error string
}

// ConfigReload counts one config reload; a refused one (err not nil) is remembered for
// /readyz until a reload succeeds.
func (m *Metrics) ConfigReload(at time.Time, err error) {
	if err == nil {
		m.configReloads.WithLabelValues("ok").Inc()
		m.lastReloadOK.Set(1)
		m.lastRefused.Store(nil)
		return
	}
	m.configReloads.WithLabelValues("refused").Inc()
	m.lastReloadOK.Set(0)
	m.lastRefusedAt.Set(float64(at.UnixNano()) / 1e9)
	m.lastRefused.Store(&RefusedReload{At: at, Error: withoutValues(err.Error())})
}

// LastRefusedReload is the last refused config reload, nil when none was or a later one
// succeeded.
func (m *Metrics) LastRefusedReload() *RefusedReload { return m.lastRefused.Load() }

// quoted matches the values an error quotes: "…" (Go's %q, with escapes) and `…` (YAML's).
var quoted = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|`[^`]*`")

// withoutValues replaces every quoted value in msg with "…", and puts its lines on one.
func withoutValues(msg string) string {
	return strings.ReplaceAll(quoted.ReplaceAllString(msg, `"…"`), "\n", "; ")
}

// labelSet is the configured vocabulary of the agent and host labels.
type labelSet struct {
	agents map[string]bool
	hosts  map[string]bool // exact names and "*.suffix" patterns, as configured
	wild   []string        // the patterns' suffixes (".example.com")
}

// configure sets the agent and host label sets from a config. Counters already created keep
// their labels.
func (m *Metrics) configure(cfg *config.Config) {
	ls := &labelSet{agents: map[string]bool{}, hosts: map[string]bool{}}
	for _, a := range cfg.Agents {
		ls.agents[a.ID] = true
	}
	for _, c := range cfg.Credentials {
		for _, h := range c.Hosts {
			h = strings.ToLower(h)
			ls.hosts[h] = true
			if suffix, ok := strings.CutPrefix(h, "*"); ok {
				ls.wild = append(ls.wild, suffix)
			}
		}
	}
	m.labels.Store(ls)
}

func (ls *labelSet) host(h string) string {
	if h == "" {
		return labelNone
	}
	if ls.hosts[h] {
		return h
	}
	for _, suffix := range ls.wild {
		if len(h) > len(suffix) && strings.HasSuffix(h, suffix) {
			return "*" + suffix
		}
	}
	return labelOther
}

func (ls *labelSet) agent(a string) string {
	if a == "" || ls.agents[a] {
		return a
	}
	return labelOther
}

// outcome is the outcome label of capbroker_agent_requests_total: the decision label of
// capbroker_requests_total, except that an exchange the policy allowed (or that failed
// before a decision) and that then failed is counted by its agent-facing error code
// (credential_unavailable, upstream_error, policy_error, ...): those are what a team alerts on.
func outcome(decision, code string) string {
	if code != "" && (decision == "allow" || decision == "error") {
		return code
	}
	return decision
}

// started counts an exchange in flight.
func (m *Metrics) started() { m.inflight.Inc() }

// finished counts an exchange that ended with outcome (the decision label of
// capbroker_requests_total).
func (m *Metrics) finished(agent, host, outcome string, granted []string) {
	m.inflight.Dec()
	ls := m.labels.Load()
	k := egressKey{agent: ls.agent(agent), host: ls.host(host), outcome: outcome}
	switch len(granted) {
	case 0:
	case 1:
		k.credential = granted[0]
	default:
		k.credential = labelMultiple
	}
	m.mu.RLock()
	c, ok := m.children[k]
	m.mu.RUnlock()
	if !ok {
		c = m.egress.WithLabelValues(k.agent, k.host, k.outcome, k.credential)
		m.mu.Lock()
		m.children[k] = c
		m.mu.Unlock()
	}
	c.Inc()
}

type exchangeMetrics struct {
	requests prometheus.Counter
	latency  prometheus.Observer
}

// exchanged counts an exchange of phase that ended with decision (capbroker_requests_total)
// and observes how long it took.
func (m *Metrics) exchanged(phase, decision string, took time.Duration) {
	k := [2]string{phase, decision}
	m.mu.RLock()
	e, ok := m.exchanges[k]
	m.mu.RUnlock()
	if !ok {
		e = exchangeMetrics{m.requests.WithLabelValues(phase, decision), m.latency.WithLabelValues(phase)}
		m.mu.Lock()
		m.exchanges[k] = e
		m.mu.Unlock()
	}
	e.requests.Inc()
	e.latency.Observe(took.Seconds())
}

// upstreamError counts a failure of the upstream by its class.
func (m *Metrics) upstreamError(err error) {
	m.upstreamErrors.WithLabelValues(upstreamErrorClass(err)).Inc()
}

// upstreamErrorClass names the kind of an upstream failure, from a fixed vocabulary.
func upstreamErrorClass(err error) string {
	var (
		dns *net.DNSError
		ve  *tls.CertificateVerificationError
		rec tls.RecordHeaderError
		alt *tls.AlertError
		ua  x509.UnknownAuthorityError
		hn  x509.HostnameError
		inv x509.CertificateInvalidError
	)
	switch {
	case errors.Is(err, upstream.ErrForbiddenDestination):
		return "forbidden_destination"
	case errors.Is(err, errUnscrubbable):
		return "unscrubbable"
	case errors.As(err, &dns):
		return "dns"
	case errors.Is(err, errUpstreamTimeout), errors.Is(err, context.DeadlineExceeded), isTimeout(err):
		return "timeout"
	case errors.As(err, &ve), errors.As(err, &rec), errors.As(err, &alt), errors.As(err, &ua), errors.As(err, &hn), errors.As(err, &inv):
		return "tls"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return "reset"
	case errors.Is(err, errMalformedResponse):
		return "protocol"
	}
	return "other"
}

// tunnelOpened and tunnelClosed count opaque tunnels (intercepted ones are counted from the
// broker's tunnel set when metrics are gathered).
func (m *Metrics) tunnelOpened() { m.opaque.Add(1) }

// proxyUsed counts an agent's exchange that went through the upstream proxy via (configured
// names and "direct" only: the label set is bounded by the config).
func (m *Metrics) proxyUsed(via string, failed bool) { m.proxyUse("agent", via, failed) }

// ServiceProxyUsed counts one connection of the broker's own clients (upstream.Dialer's
// DialService) through via, a configured proxy or "direct".
func (m *Metrics) ServiceProxyUsed(via string, failed bool) { m.proxyUse("broker", via, failed) }

func (m *Metrics) proxyUse(client, via string, failed bool) {
	result := "ok"
	if failed {
		result = "failed"
	}
	m.proxyRequests.WithLabelValues(client, via, result).Inc()
}
func (m *Metrics) tunnelClosed() { m.opaque.Add(-1) }

// CredentialStatus reports the state of every configured credential (never its value).
type CredentialStatus interface {
	Status() map[string]credentials.CredentialStatus
}

// watch exports what is read from a broker's parts when metrics are gathered: the size of its
// certificate cache, the audit events whose write failed, the intercepted tunnels open, and
// each credential's readiness. Only the first broker given a Metrics is watched.
func (m *Metrics) watch(certs func() int, auditLost func() int64, tunnels func() int, creds func() Secrets) {
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
			&funcCollector{
				desc: prometheus.NewDesc("capbroker_tunnels_open",
					"CONNECT tunnels open, by kind: intercepted (TLS terminated, every request decided) or opaque (intercept: false).",
					[]string{"kind"}, nil),
				collect: func(d *prometheus.Desc, ch chan<- prometheus.Metric) {
					ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(tunnels()), "intercepted")
					ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(m.opaque.Load()), "opaque")
				},
			},
		)
		// Per credential, read from the running config's credentials when gathered.
		perCredential := func(name, help string, value func(credentials.CredentialStatus) (float64, bool)) {
			m.reg.MustRegister(&funcCollector{
				desc: prometheus.NewDesc(name, help, []string{"credential"}, nil),
				collect: func(d *prometheus.Desc, ch chan<- prometheus.Metric) {
					cs, ok := creds().(CredentialStatus)
					if !ok {
						return
					}
					for cred, st := range cs.Status() {
						if v, ok := value(st); ok {
							ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, cred)
						}
					}
				},
			})
		}
		perCredential("capbroker_credential_ready",
			"1 when the credential has a usable value (fresh, or cached within vault.max_stale), else 0: requests granted it get 503 credential_unavailable.",
			func(st credentials.CredentialStatus) (float64, bool) {
				if st.Ready {
					return 1, true
				}
				return 0, true
			})
		perCredential("capbroker_credential_stale_seconds",
			"Age of the value served while it is stale (past vault.refresh_interval, its source failing or hung), 0 while fresh: "+
				"the credential becomes unavailable when it reaches vault.max_stale.",
			func(st credentials.CredentialStatus) (float64, bool) {
				return st.StaleAge.Seconds(), true
			})
		perCredential("capbroker_credential_valid_until_seconds",
			"For a derived credential (minted tokens): when the newest token it holds expires, as a Unix time.",
			func(st credentials.CredentialStatus) (float64, bool) {
				return float64(st.ValidUntil.Unix()), !st.ValidUntil.IsZero()
			})
		perCredential("capbroker_credential_last_refresh_seconds",
			"For a derived credential (minted tokens): when it last minted a token, as a Unix time.",
			func(st credentials.CredentialStatus) (float64, bool) {
				return float64(st.LastRefresh.Unix()), !st.LastRefresh.IsZero()
			})
	})
}

// funcCollector is a collector of one family whose samples are read when gathered.
type funcCollector struct {
	desc    *prometheus.Desc
	collect func(*prometheus.Desc, chan<- prometheus.Metric)
}

func (c *funcCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c *funcCollector) Collect(ch chan<- prometheus.Metric) { c.collect(c.desc, ch) }
