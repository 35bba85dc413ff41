package config

import (
	"strings"
	"testing"
	"time"
)

// TestTelemetry: the telemetry section's defaults, and each problem with its key path.
func TestTelemetry(t *testing.T) {
	const base = "ca: {cert_file: c, key_file: k}\npolicy: {dir: p}\nagents: [{id: a, addresses: [\"10.0.0.2\"]}]\ntelemetry:\n"
	for name, c := range map[string]struct {
		src  string
		want string // "" = valid
	}{
		"grpc with a token":    {"  endpoint: http://127.0.0.1:4317\n  headers: [{name: Authorization, value: \"Bearer {{secret}}\", secret: {env: OTEL_TOKEN}}]\n", ""},
		"http over TLS":        {"  endpoint: https://otel.example:4318\n  protocol: http\n  ca_file: /ca.pem\n  signals: [logs]\n", ""},
		"no endpoint":          {"  protocol: grpc\n", "telemetry.endpoint: required"},
		"endpoint with a path": {"  endpoint: http://127.0.0.1:4318/v1/logs\n", "telemetry.endpoint: must be scheme://host:port only"},
		"endpoint user":        {"  endpoint: http://u:p@127.0.0.1:4318\n", "telemetry.endpoint: must be scheme://host:port only"},
		"endpoint no port":     {"  endpoint: https://otel.example\n", "telemetry.endpoint: must be http://host:port or https://host:port"},
		"ca_file on http":      {"  endpoint: http://127.0.0.1:4317\n  ca_file: /ca.pem\n", "telemetry.ca_file: only used with an https:// endpoint"},
		"protocol":             {"  endpoint: http://127.0.0.1:4317\n  protocol: thrift\n", `telemetry.protocol: must be grpc or http, not "thrift"`},
		"signal":               {"  endpoint: http://127.0.0.1:4317\n  signals: [logs, profiles]\n", `telemetry.signals[1]: must be logs, traces or metrics, not "profiles"`},
		"no signals":           {"  endpoint: http://127.0.0.1:4317\n  signals: []\n", "telemetry.signals: must name at least one"},
		"secret twice":         {"  endpoint: http://127.0.0.1:4317\n  headers: [{name: X-Token, secret: {env: A, file: /f}}]\n", "telemetry.headers[0].secret: set only one of vault, env, file"},
		"secret without value": {"  endpoint: http://127.0.0.1:4317\n  headers: [{name: X-Token, value: \"{{secret}}\"}]\n", "telemetry.headers[0].secret: required: value uses {{secret}}"},
		"value without slot":   {"  endpoint: http://127.0.0.1:4317\n  headers: [{name: X-Token, value: Bearer, secret: {env: A}}]\n", "telemetry.headers[0].value: must contain {{secret}} once"},
		"header twice":         {"  endpoint: http://127.0.0.1:4317\n  headers: [{name: X-A, value: a}, {name: x-a, value: b}]\n", `telemetry.headers[1].name: "x-a" is given twice`},
		"bad header name":      {"  endpoint: http://127.0.0.1:4317\n  headers: [{name: \"X A\", value: a}]\n", "telemetry.headers[0].name: must be a header name"},
		"exporter's header":    {"  endpoint: http://127.0.0.1:4317\n  headers: [{name: Content-Type, value: a}]\n", "telemetry.headers[0].name: \"Content-Type\" is set by the exporter"},
		"vault needs vault":    {"  endpoint: http://127.0.0.1:4317\n  headers: [{name: X-T, secret: {vault: {mount: secret, path: otel, field: token}}}]\n", "vault: required: a telemetry header's secret has a vault source"},
		"batch over queue":     {"  endpoint: http://127.0.0.1:4317\n  queue_size: 10\n  batch_size: 20\n", "telemetry.batch_size: must be at most queue_size (10)"},
		"trace ratio":          {"  endpoint: http://127.0.0.1:4317\n  trace_ratio: 1.5\n", "telemetry.trace_ratio: must be between 0 and 1"},
		"negative timeout":     {"  endpoint: http://127.0.0.1:4317\n  export_timeout: -1s\n", "telemetry.export_timeout: must be positive"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, err := Parse([]byte(base + c.src))
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("got %v, want it to say %q", err, c.want)
			}
			if name == "grpc with a token" {
				tc := cfg.Telemetry
				if tc.Protocol != "grpc" || tc.ServiceName != "capbroker" || tc.QueueSize != DefaultTelemetryQueue ||
					tc.BatchTimeout != time.Second || !tc.Enabled(SignalLogs) || !tc.Enabled(SignalTraces) || !tc.Enabled(SignalMetrics) {
					t.Fatalf("defaults: %+v", tc)
				}
			}
		})
	}
	var none *Telemetry
	if none.Enabled(SignalLogs) {
		t.Error("no telemetry section exports logs")
	}
}
