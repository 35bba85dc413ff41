package integration

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capbroker/capbroker/internal/harness"
	"github.com/capbroker/capbroker/internal/testpki"
)

// The OpenTelemetry tests run the broker against a real OpenTelemetry Collector, built from
// its Go modules (integration/testdata/otelcol, a module of its own) with the OTLP receiver,
// a bearer-token authenticator and the file exporter, and read what it wrote.

const (
	otelToken = "otel-collector-token-7c1d"
	// otelCanary is the canary secret, and also the id of an agent: it reaches every signal
	// (the audit line's agent, span attributes, metric labels), so each export must scrub it.
	otelCanary = "canaryOtelSecret0123456789"
)

var otelcolBuild toolBuild

// otelcolBinary builds the test collector (testdata/otelcol) once, cached.
func otelcolBinary(t *testing.T) string {
	t.Helper()
	return otelcolBuild.binary(t, "the test collector", "otelcol", ".", "otelcol", "go.mod", "go.sum", "main.go")
}

// collector is a running test collector: OTLP on grpcAddr, grpcTLSAddr and httpAddr, a file
// per signal.
type collector struct {
	bin, dir, config   string
	caFile             string // the CA of the HTTP receiver's TLS certificate
	grpcAddr, httpAddr string
	grpcTLSAddr        string // OTLP/gRPC over TLS (the same certificate as httpAddr)
	cmd                *exec.Cmd
	logs               *logTail
}

func startCollector(t *testing.T) *collector {
	t.Helper()
	c := &collector{bin: otelcolBinary(t), dir: t.TempDir()}
	var err error
	if c.grpcAddr, err = harness.FreeAddr(); err != nil {
		t.Fatal(err)
	}
	if c.httpAddr, err = harness.FreeAddr(); err != nil {
		t.Fatal(err)
	}
	if c.grpcTLSAddr, err = harness.FreeAddr(); err != nil {
		t.Fatal(err)
	}
	// OTLP/HTTP is served over TLS (a certificate from a CA of the test's), gRPC in plaintext
	// on grpcAddr and over TLS on grpcTLSAddr.
	pki := testpki.New(t, "otel collector CA")
	c.caFile = pki.File
	certFile, keyFile := filepath.Join(c.dir, "otelcol.crt"), filepath.Join(c.dir, "otelcol.key")
	writePEMPair(t, pki.Leaf, certFile, keyFile)
	c.config = filepath.Join(c.dir, "otelcol.yaml")
	cfg := fmt.Sprintf(`extensions:
  bearertokenauth:
    token: %q
receivers:
  otlp:
    protocols:
      grpc: {endpoint: %q, auth: {authenticator: bearertokenauth}}
      http: {endpoint: %q, auth: {authenticator: bearertokenauth}, tls: {cert_file: %q, key_file: %q}}
  otlp/tls:
    protocols:
      grpc: {endpoint: %q, auth: {authenticator: bearertokenauth}, tls: {cert_file: %q, key_file: %q}}
exporters:
  file/logs: {path: %q, flush_interval: 100ms}
  file/traces: {path: %q, flush_interval: 100ms}
  file/metrics: {path: %q, flush_interval: 100ms}
service:
  extensions: [bearertokenauth]
  telemetry: {metrics: {level: none}}
  pipelines:
    logs: {receivers: [otlp, otlp/tls], exporters: [file/logs]}
    traces: {receivers: [otlp, otlp/tls], exporters: [file/traces]}
    metrics: {receivers: [otlp, otlp/tls], exporters: [file/metrics]}
`, otelToken, c.grpcAddr, c.httpAddr, certFile, keyFile, c.grpcTLSAddr, certFile, keyFile, c.file("logs"), c.file("traces"), c.file("metrics"))
	if err := os.WriteFile(c.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	c.start(t)
	t.Cleanup(func() { c.kill() })
	return c
}

// writePEMPair writes a certificate and its key as PEM files.
func writePEMPair(t *testing.T, cert tls.Certificate, certFile, keyFile string) {
	t.Helper()
	key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (c *collector) file(signal string) string { return filepath.Join(c.dir, signal+".json") }

func (c *collector) start(t *testing.T) {
	t.Helper()
	c.logs = newLogTail()
	c.cmd = exec.Command(c.bin, "--config", "file:"+c.config)
	c.cmd.Stdout, c.cmd.Stderr = c.logs, c.logs
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.logs.wait(t, "Everything is ready")
}

// kill ends the collector at once (SIGKILL): nothing is flushed.
func (c *collector) kill() {
	if c.cmd != nil && c.cmd.Process != nil {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
	}
}

// otlpFile reads one signal's file: one OTLP JSON document per line.
func (c *collector) read(t *testing.T, signal string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(c.file(signal))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var docs []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var d map[string]any
		if err := json.Unmarshal(sc.Bytes(), &d); err == nil {
			docs = append(docs, d)
		}
	}
	return docs
}

// raw is a signal's file as text.
func (c *collector) raw(t *testing.T, signal string) string {
	b, _ := os.ReadFile(c.file(signal))
	return string(b)
}

// waitFor polls a signal's file until found returns true (the collector writes it every 100ms).
func (c *collector) waitFor(t *testing.T, signal, what string, found func([]map[string]any) bool) []map[string]any {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		docs := c.read(t, signal)
		if found(docs) {
			return docs
		}
		if time.Now().After(deadline) {
			t.Fatalf("the collector never received %s; %s file:\n%.4000s\ncollector log:\n%.4000s", what, signal, c.raw(t, signal), c.logs.String())
		}
		time.Sleep(50 * time.Millisecond) // polling a file another process writes
	}
}

// otlp record shapes (pdata JSON).
type otlpKV struct {
	Key   string         `json:"key"`
	Value map[string]any `json:"value"`
}

func kvString(kvs []otlpKV, key string) string {
	for _, kv := range kvs {
		if kv.Key == key {
			if s, ok := kv.Value["stringValue"].(string); ok {
				return s
			}
			b, _ := json.Marshal(kv.Value)
			return string(b)
		}
	}
	return ""
}

type otlpSpan struct {
	TraceID      string   `json:"traceId"`
	SpanID       string   `json:"spanId"`
	ParentSpanID string   `json:"parentSpanId"`
	Name         string   `json:"name"`
	Attributes   []otlpKV `json:"attributes"`
}

type otlpLog struct {
	Body       map[string]any `json:"body"`
	Attributes []otlpKV       `json:"attributes"`
	TraceID    string         `json:"traceId"`
	SpanID     string         `json:"spanId"`
	EventName  string         `json:"eventName"`
}

func decodeAs[T any](docs []map[string]any, res, scope, items string) (out []T, resources [][]otlpKV) {
	for _, d := range docs {
		rs, _ := d[res].([]any)
		for _, r := range rs {
			b, _ := json.Marshal(r)
			var one struct {
				Resource struct {
					Attributes []otlpKV `json:"attributes"`
				} `json:"resource"`
				Scopes []map[string]json.RawMessage `json:"-"`
			}
			_ = json.Unmarshal(b, &one)
			resources = append(resources, one.Resource.Attributes)
			var m map[string]json.RawMessage
			_ = json.Unmarshal(b, &m)
			var scopes []map[string]json.RawMessage
			_ = json.Unmarshal(m[scope], &scopes)
			for _, s := range scopes {
				var xs []T
				_ = json.Unmarshal(s[items], &xs)
				out = append(out, xs...)
			}
		}
	}
	return out, resources
}

func otelLogs(docs []map[string]any) ([]otlpLog, [][]otlpKV) {
	return decodeAs[otlpLog](docs, "resourceLogs", "scopeLogs", "logRecords")
}

func otelSpans(docs []map[string]any) []otlpSpan {
	s, _ := decodeAs[otlpSpan](docs, "resourceSpans", "scopeSpans", "spans")
	return s
}

// otelPolicy allows every agent to 127.0.0.1 with the canary credential; a request to
// /trace may forward the agent's traceparent.
const otelPolicy = `package broker
import rego.v1
decision := {"allow": true, "credentials": ["canary"], "forward_traceparent": input.request.path == "/trace"} if input.phase == "request"
decision := {"allow": true} if input.phase == "connect"
`

// otelBrokerConfig is canaryConfig (upstreams trusted through caFile) with a telemetry section
// exporting to col at endpoint (an https:// one trusted through col's CA).
func otelBrokerConfig(caFile string, col *collector, protocol, endpoint, tokenEnvName string, extra string) string {
	if strings.HasPrefix(endpoint, "https://") {
		extra = "  ca_file: " + strconv.Quote(col.caFile) + "\n" + extra
	}
	return canaryConfig(caFile, []string{"otel-agent", otelCanary}, fmt.Sprintf(`telemetry:
  endpoint: %q
  protocol: %s
  instance: otel-test-1
  headers:
    - {name: Authorization, value: "Bearer {{secret}}", secret: {env: %s}}
  batch_timeout: 100ms
  export_timeout: 2s
  metrics_interval: 500ms
%s`, endpoint, protocol, tokenEnvName, extra))
}

func TestOTelCollector(t *testing.T) {
	col := startCollector(t)
	pki := newUpstreamPKI(t)
	var mu sync.Mutex
	seen := map[string]http.Header{} // path -> headers the upstream got
	up := pki.serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.URL.Path] = r.Header.Clone()
		mu.Unlock()
		// The upstream echoes the injected secret: the response is scrubbed.
		fmt.Fprintf(w, "you sent %s", r.Header.Get("Authorization"))
	}), false, nil)
	caFile := pki.File
	b := startBroker(t, brokerOpts{
		policy: otelPolicy, mode: "enforce",
		config: otelBrokerConfig(caFile, col, "grpc", "http://"+col.grpcAddr, "OTEL_TOKEN", "  queue_size: 16\n  batch_size: 8\n"),
		env: []string{"OTEL_TOKEN=" + otelToken, "CANARY_SECRET=" + otelCanary,
			"OTEL_AGENT_TOKEN=agent-token-1", tokenEnv(otelCanary) + "=agent-token-2"},
	})
	b.logs.wait(t, "telemetry: exporting to the collector")
	agent := b.client(t, "otel-agent", "agent-token-1")

	get := func(t *testing.T, c *http.Client, path, traceparent string) string {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, up.URL+path, nil)
		if traceparent != "" {
			req.Header.Set("Traceparent", traceparent)
			req.Header.Set("Tracestate", "vendor=agent-private")
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
		}
		if strings.Contains(string(body), otelCanary) {
			t.Fatalf("the response was not scrubbed: %s", body)
		}
		return resp.Header.Get("X-Broker-Request-Id")
	}

	const agentTrace, agentSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	tracedID := get(t, agent, "/trace", "00-"+agentTrace+"-"+agentSpan+"-00") // sampled flag off: still traced
	plainID := get(t, agent, "/plain", "00-"+agentTrace+"-"+agentSpan+"-01")

	t.Run("records", func(t *testing.T) {
		docs := col.waitFor(t, "logs", "the traced request's audit record", func(d []map[string]any) bool {
			logs, _ := otelLogs(d)
			for _, l := range logs {
				if kvString(l.Attributes, "capbroker.request_id") == tracedID {
					return true
				}
			}
			return false
		})
		logs, resources := otelLogs(docs)
		var rec otlpLog
		for _, l := range logs {
			if kvString(l.Attributes, "capbroker.request_id") == tracedID {
				rec = l
			}
		}
		var line map[string]any
		body, _ := rec.Body["stringValue"].(string)
		if err := json.Unmarshal([]byte(body), &line); err != nil {
			t.Fatalf("the record's body is not the audit line: %q", body)
		}
		if line["request_id"] != tracedID || line["msg"] != "decision" || line["trace_id"] != agentTrace {
			t.Errorf("audit line in the record: %v", line)
		}
		if rec.TraceID != agentTrace || rec.SpanID == "" || rec.EventName != "capbroker.decision" {
			t.Errorf("record trace %q span %q event %q", rec.TraceID, rec.SpanID, rec.EventName)
		}
		if kvString(rec.Attributes, "capbroker.agent") != "otel-agent" || kvString(rec.Attributes, "capbroker.decision") != "allow" {
			t.Errorf("record attributes: %v", rec.Attributes)
		}
		if len(resources) == 0 || kvString(resources[0], "service.name") != "capbroker" || kvString(resources[0], "service.instance.id") != "otel-test-1" {
			t.Errorf("resource: %v", resources)
		}
		// The audit line written to stdout carries the same trace_id.
		ev := b.waitAudit(t, tracedID)
		if ev["trace_id"] != agentTrace {
			t.Errorf("audit event trace_id = %v", ev["trace_id"])
		}
	})

	t.Run("span tree", func(t *testing.T) {
		want := []string{"identity", "policy", "credentials", "upstream", "scrub"}
		docs := col.waitFor(t, "traces", "the traced request's spans", func(d []map[string]any) bool {
			n := 0
			for _, s := range otelSpans(d) {
				if s.TraceID == agentTrace {
					n++
				}
			}
			return n >= 2*(len(want)+1)
		})
		var root otlpSpan
		for _, s := range otelSpans(docs) {
			if s.TraceID == agentTrace && s.Name == "capbroker.request" && kvString(s.Attributes, "capbroker.request_id") == tracedID {
				root = s
			}
		}
		if root.SpanID == "" || root.ParentSpanID != agentSpan {
			t.Fatalf("root span %+v: want a child of the agent's span %s", root, agentSpan)
		}
		if kvString(root.Attributes, "capbroker.decision") != "allow" || kvString(root.Attributes, "capbroker.agent") != "otel-agent" {
			t.Errorf("root attributes: %v", root.Attributes)
		}
		children := map[string]otlpSpan{}
		for _, s := range otelSpans(docs) {
			if s.ParentSpanID == root.SpanID {
				children[s.Name] = s
			}
		}
		for _, name := range want {
			if _, ok := children[name]; !ok {
				t.Errorf("no %q span under the root; children: %v", name, children)
			}
		}
		// Forwarded: the upstream's parent is the broker's upstream span, in the agent's trace.
		mu.Lock()
		traced, plain := seen["/trace"], seen["/plain"]
		mu.Unlock()
		if tp := traced.Get("Traceparent"); tp != "00-"+agentTrace+"-"+children["upstream"].SpanID+"-01" {
			t.Errorf("upstream got traceparent %q; upstream span %s", tp, children["upstream"].SpanID)
		}
		if plain.Get("Traceparent") != "" || plain.Get("Tracestate") != "" {
			t.Errorf("a decision without forward_traceparent let trace headers through: %v", plain)
		}
		_ = plainID
	})

	t.Run("metrics", func(t *testing.T) {
		col.waitFor(t, "metrics", "capbroker_requests_total", func([]map[string]any) bool {
			return strings.Contains(col.raw(t, "metrics"), `"capbroker_requests_total"`)
		})
	})

	t.Run("canary", func(t *testing.T) {
		// The agent whose id is the secret: its id reaches the audit line, the span
		// attributes and the metric labels; every export must have it redacted.
		leaky := b.client(t, otelCanary, "agent-token-2")
		id := get(t, leaky, "/leak", "")
		col.waitFor(t, "logs", "the canary agent's record", func([]map[string]any) bool {
			return strings.Contains(col.raw(t, "logs"), id)
		})
		col.waitFor(t, "traces", "the canary agent's spans", func([]map[string]any) bool {
			return strings.Contains(col.raw(t, "traces"), id)
		})
		col.waitFor(t, "metrics", "the canary agent's metrics", func([]map[string]any) bool {
			raw := col.raw(t, "metrics")
			return strings.Contains(raw, "[REDACTED]") || strings.Contains(raw, otelCanary)
		})
		for _, s := range []string{"logs", "traces", "metrics"} {
			raw := col.raw(t, s)
			if strings.Contains(raw, otelCanary) {
				t.Errorf("the canary secret reached the collector in %s", s)
			}
			if !strings.Contains(raw, "[REDACTED]") {
				t.Errorf("%s: nothing redacted, though the canary agent's id was exported", s)
			}
		}
		if strings.Contains(b.logs.String(), otelToken) {
			t.Error("the collector token is in the broker's log")
		}
	})

	t.Run("hostile trace headers", func(t *testing.T) {
		// Two traceparents, or a malformed one, are no trace context: the request is served
		// in a trace of the broker's own. tracestate is never read, so never exported.
		for name, tps := range map[string][]string{
			"two":       {"00-" + agentTrace + "-" + agentSpan + "-01", "00-11111111111111111111111111111111-2222222222222222-01"},
			"malformed": {"00-" + agentTrace + "-zzzz-01"},
		} {
			req, _ := http.NewRequest(http.MethodGet, up.URL+"/hostile/"+name, nil)
			req.Header["Traceparent"] = tps
			req.Header.Set("Tracestate", "leak=hostile-tracestate-value")
			resp, err := agent.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			ev := b.waitAudit(t, resp.Header.Get("X-Broker-Request-Id"))
			if tid, _ := ev["trace_id"].(string); len(tid) != 32 || tid == agentTrace || strings.HasPrefix(tid, "1111") {
				t.Errorf("%s: trace_id %q: want a trace of the broker's own", name, tid)
			}
		}
		id := get(t, agent, "/hostile/marker", "")
		col.waitFor(t, "traces", "the spans after the hostile requests", func([]map[string]any) bool {
			return strings.Contains(col.raw(t, "traces"), id)
		})
		for _, s := range []string{"traces", "logs"} {
			if strings.Contains(col.raw(t, s), "hostile-tracestate-value") {
				t.Errorf("the agent's tracestate reached the collector in %s", s)
			}
		}
	})

	t.Run("collector killed and restarted", func(t *testing.T) {
		col.kill()
		// Nothing blocks: every request completes while the collector is gone, and what
		// cannot be exported is counted.
		for i := 0; i < 40; i++ {
			get(t, agent, fmt.Sprintf("/outage/%d", i), "")
		}
		waitMetric(t, b, `capbroker_telemetry_dropped_total{reason="queue_full",signal="logs"}`)
		waitMetric(t, b, `capbroker_telemetry_dropped_total{reason="export_failed",signal="logs"}`)
		col.start(t)
		// Export resumes: a request made after the restart reaches the collector (the first
		// ones may find the queue still full of the outage's records, and be dropped).
		deadline := time.Now().Add(waitTimeout)
		for i := 0; ; i++ {
			get(t, agent, fmt.Sprintf("/after/%d", i), "")
			if strings.Contains(col.raw(t, "logs"), `/after/`) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no record reached the restarted collector; broker log:\n%s", b.logs.String())
			}
			time.Sleep(200 * time.Millisecond) // one request per poll of the collector's file
		}
	})

	t.Run("otlp over http and TLS", func(t *testing.T) {
		hb := startBroker(t, brokerOpts{
			policy: otelPolicy, mode: "enforce",
			config: otelBrokerConfig(caFile, col, "http", "https://"+col.httpAddr, "OTEL_TOKEN", ""),
			env:    []string{"OTEL_TOKEN=" + otelToken, "CANARY_SECRET=" + otelCanary, "OTEL_AGENT_TOKEN=agent-token-1", tokenEnv(otelCanary) + "=x"},
		})
		hb.logs.wait(t, "telemetry: exporting to the collector")
		id := get(t, hb.client(t, "otel-agent", "agent-token-1"), "/over-http", "")
		for _, s := range []string{"logs", "traces"} {
			col.waitFor(t, s, "the request exported over OTLP/HTTP", func([]map[string]any) bool {
				return strings.Contains(col.raw(t, s), id)
			})
		}
	})

	t.Run("wrong token", func(t *testing.T) {
		for _, tc := range []struct{ protocol, endpoint string }{
			{"http", "https://" + col.httpAddr},
			{"grpc", "http://" + col.grpcAddr},
			{"grpc", "https://" + col.grpcTLSAddr}, // gRPC over TLS, the collector's CA in ca_file
		} {
			protocol, endpoint := tc.protocol, tc.endpoint
			wb := startBroker(t, brokerOpts{
				policy: otelPolicy, mode: "enforce",
				config: otelBrokerConfig(caFile, col, protocol, endpoint, "OTEL_TOKEN", ""),
				env:    []string{"OTEL_TOKEN=wrong-token", "CANARY_SECRET=" + otelCanary, "OTEL_AGENT_TOKEN=agent-token-1", tokenEnv(otelCanary) + "=x"},
			})
			line := wb.logs.wait(t, "refused the export's credentials")
			if !strings.Contains(line, `"level":"error"`) || strings.Contains(wb.logs.String(), "wrong-token") {
				t.Errorf("%s: start-up log: %s", endpoint, line)
			}
			resp, err := http.Get("http://" + wb.adminAddr + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			var body map[string]any
			_ = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			detail := "(HTTP 401"
			if protocol == "grpc" {
				detail = "(gRPC Unauthenticated)"
			}
			if msg, _ := body["telemetry"].(string); !strings.Contains(msg, "refused the export's credentials "+detail) || body["status"] != "degraded" {
				t.Errorf("%s: /readyz = %v", endpoint, body)
			}
			// The broker serves on.
			get(t, wb.client(t, "otel-agent", "agent-token-1"), "/wrong-token", "")
		}
	})
}

// waitMetric waits until /metrics shows series with a value above zero.
func waitMetric(t *testing.T, b *brokerProc, series string) {
	t.Helper()
	re := regexp.MustCompile(regexp.QuoteMeta(series) + ` ([0-9.e+]+)`)
	deadline := time.Now().Add(waitTimeout)
	for {
		resp, err := http.Get("http://" + b.adminAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if m := re.FindSubmatch(body); m != nil && string(m[1]) != "0" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never above 0:\n%s", series, grepLines(string(body), "capbroker_telemetry"))
		}
		time.Sleep(50 * time.Millisecond) // polling the broker's metrics
	}
}
