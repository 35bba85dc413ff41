package config

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Telemetry is the telemetry section: OpenTelemetry export of the audit events (logs), a
// span tree per request (traces) and the Prometheus families (metrics) over OTLP, to one
// collector (docs/observability.md). Absent: nothing is exported.
type Telemetry struct {
	// Endpoint is the collector: http://host:port (plaintext) or https://host:port (TLS,
	// verified against the system roots and CAFile). For protocol http the signal paths
	// (/v1/logs, /v1/traces, /v1/metrics) are added to it.
	Endpoint string `yaml:"endpoint"`
	// Protocol is "grpc" (default) or "http" (OTLP/HTTP with protobuf bodies).
	Protocol string `yaml:"protocol"`
	// CAFile holds extra PEM roots for an https:// endpoint.
	CAFile string `yaml:"ca_file"`
	// Headers are sent with every export; a header's value may take a secret from any
	// credential source ("{{secret}}" in value). Secrets are never logged or exported.
	Headers []TelemetryHeader `yaml:"headers"`
	// Signals lists what is exported: logs, traces, metrics (default all three).
	Signals []string `yaml:"signals"`
	// ServiceName is the resource's service.name (default "capbroker").
	ServiceName string `yaml:"service_name"`
	// Instance is the resource's service.instance.id: which broker replica (default the
	// host name).
	Instance string `yaml:"instance"`
	// QueueSize bounds the log records, and the traced requests (each with its spans, up to
	// seven), waiting to be exported (default 4096 each); one that finds the queue full is
	// dropped and counted (its spans, for a trace), never waited for.
	QueueSize int `yaml:"queue_size"`
	// BatchSize is the most records, or traced requests, in one export (default 512).
	BatchSize int `yaml:"batch_size"`
	// BatchTimeout is how long a record waits for others to join its batch (default 1s).
	BatchTimeout time.Duration `yaml:"batch_timeout"`
	// ExportTimeout bounds one export, its retries included (default 10s): a batch not
	// delivered by then is dropped and counted.
	ExportTimeout time.Duration `yaml:"export_timeout"`
	// MetricsInterval is how often the metrics are exported (default 30s).
	MetricsInterval time.Duration `yaml:"metrics_interval"`
	// TraceRatio is the fraction of requests traced, chosen by the broker at random (never by
	// the agent's traceparent); default 1, every request. Audit log records are never sampled.
	TraceRatio *float64 `yaml:"trace_ratio"`
}

// TelemetryHeader is one header sent to the collector.
type TelemetryHeader struct {
	Name string `yaml:"name"`
	// Value is the header's value; "{{secret}}" in it is replaced by the secret (default
	// "{{secret}}" when a secret is set).
	Value string `yaml:"value"`
	// Secret is where the secret comes from: vault, env or file.
	Secret *Source `yaml:"secret"`
}

// Telemetry signals.
const (
	SignalLogs    = "logs"
	SignalTraces  = "traces"
	SignalMetrics = "metrics"
)

// Telemetry defaults.
const (
	DefaultTelemetryQueue         = 4096
	DefaultTelemetryBatch         = 512
	DefaultTelemetryBatchTimeout  = time.Second
	DefaultTelemetryExportTimeout = 10 * time.Second
	DefaultTelemetryMetrics       = 30 * time.Second
	DefaultTelemetryService       = "capbroker"
)

// TelemetryCredentialName is the name under which the credential store keeps the secret of
// telemetry.headers[i]: no credential can take it (credential names have no '.').
func TelemetryCredentialName(i int) string { return fmt.Sprintf("telemetry.headers[%d]", i) }

// Enabled reports whether signal is exported.
func (t *Telemetry) Enabled(signal string) bool {
	return t != nil && slices.Contains(t.Signals, signal)
}

// setDefaults fills in what telemetry leaves out.
func (t *Telemetry) setDefaults() {
	if t == nil {
		return
	}
	if t.Protocol == "" {
		t.Protocol = "grpc"
	}
	if t.Signals == nil {
		t.Signals = []string{SignalLogs, SignalTraces, SignalMetrics}
	}
	if t.ServiceName == "" {
		t.ServiceName = DefaultTelemetryService
	}
	if t.QueueSize == 0 {
		t.QueueSize = DefaultTelemetryQueue
	}
	if t.BatchSize == 0 {
		t.BatchSize = DefaultTelemetryBatch
	}
	if t.BatchTimeout == 0 {
		t.BatchTimeout = DefaultTelemetryBatchTimeout
	}
	if t.ExportTimeout == 0 {
		t.ExportTimeout = DefaultTelemetryExportTimeout
	}
	if t.MetricsInterval == 0 {
		t.MetricsInterval = DefaultTelemetryMetrics
	}
	for _, h := range t.Headers {
		if h.Secret != nil && h.Secret.Vault != nil && h.Secret.Vault.KVVersion == 0 && !h.Secret.Vault.Lease {
			h.Secret.Vault.KVVersion = 2
		}
	}
}

// validateTelemetry checks the telemetry section; it reports whether a header's secret is
// read from Vault.
func (c *Config) validateTelemetry(e *errs) (usesVault bool) {
	t := c.Telemetry
	if t == nil {
		return false
	}
	const base = "telemetry"
	if t.Endpoint == "" {
		e.add(base+".endpoint", "required: http://host:port or https://host:port")
	} else if u, err := url.Parse(t.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Port() == "" {
		e.add(base+".endpoint", "must be http://host:port or https://host:port")
	} else if u.User != nil || u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/") {
		e.add(base+".endpoint", "must be scheme://host:port only (no user, path or query)")
	} else if t.CAFile != "" && u.Scheme != "https" {
		e.add(base+".ca_file", "only used with an https:// endpoint")
	}
	if t.Protocol != "grpc" && t.Protocol != "http" {
		e.add(base+".protocol", "must be grpc or http, not %q", t.Protocol)
	}
	for i, s := range t.Signals {
		if s != SignalLogs && s != SignalTraces && s != SignalMetrics {
			e.add(fmt.Sprintf("%s.signals[%d]", base, i), "must be logs, traces or metrics, not %q", s)
		}
	}
	if len(t.Signals) == 0 {
		e.add(base+".signals", "must name at least one of logs, traces, metrics")
	}
	names := map[string]bool{}
	for i, h := range t.Headers {
		p := fmt.Sprintf("%s.headers[%d]", base, i)
		switch lower := strings.ToLower(h.Name); {
		case !headerNameRe.MatchString(h.Name):
			e.add(p+".name", "must be a header name")
		case names[lower]:
			e.add(p+".name", "%q is given twice", h.Name)
		case lower == "content-type" || lower == "content-length" || lower == "host" || lower == "te":
			e.add(p+".name", "%q is set by the exporter", h.Name)
		default:
			names[lower] = true
		}
		if strings.ContainsAny(h.Value, "\r\n") {
			e.add(p+".value", "must not contain a line break")
		}
		if h.Secret == nil {
			if strings.Contains(h.Value, "{{secret}}") {
				e.add(p+".secret", "required: value uses {{secret}}")
			}
			continue
		}
		if h.Value != "" && strings.Count(h.Value, "{{secret}}") != 1 {
			e.add(p+".value", "must contain {{secret}} once when secret is set")
		}
		usesVault = validateSecretSource(e, p+".secret", h.Secret) || usesVault
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"batch_timeout", t.BatchTimeout}, {"export_timeout", t.ExportTimeout}, {"metrics_interval", t.MetricsInterval}} {
		if d.v < 0 {
			e.add(base+"."+d.key, "must be positive")
		}
	}
	if t.QueueSize < 0 {
		e.add(base+".queue_size", "must be positive")
	}
	if r := t.TraceRatio; r != nil && (*r < 0 || *r > 1) {
		e.add(base+".trace_ratio", "must be between 0 and 1")
	}
	if t.BatchSize < 0 {
		e.add(base+".batch_size", "must be positive")
	} else if t.QueueSize > 0 && t.BatchSize > t.QueueSize {
		e.add(base+".batch_size", "must be at most queue_size (%d)", t.QueueSize)
	}
	return usesVault
}

// validateSecretSource checks a source of one secret value: exactly one of vault, env, file.
func validateSecretSource(e *errs, p string, src *Source) (usesVault bool) {
	switch count(src.Vault != nil, src.Env != "", src.File != "") {
	case 1:
	case 0:
		e.add(p, "required: one of vault, env, file")
	default:
		e.add(p, "set only one of vault, env, file")
	}
	if src.EnvFields != nil {
		e.add(p+".env_fields", "not used here: one value")
	}
	if src.Env != "" && !envNameRe.MatchString(src.Env) {
		e.add(p+".env", "must be an environment variable name")
	}
	if v := src.Vault; v != nil {
		usesVault = true
		if v.Path == "" {
			e.add(p+".vault.path", "required")
		}
		if v.Field == "" {
			e.add(p+".vault.field", "required")
		}
		if !v.Lease && v.Mount == "" {
			e.add(p+".vault.mount", "required for a KV secret")
		}
		if !v.Lease && v.KVVersion != 1 && v.KVVersion != 2 {
			e.add(p+".vault.kv_version", "must be 1 or 2")
		}
	}
	return usesVault
}
