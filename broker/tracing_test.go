package broker

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/policy"
)

// TestTraceHeaders: the agent's traceparent and tracestate go upstream only when the decision
// says forward_traceparent; traced, the forwarded traceparent names the broker's upstream
// span in the agent's trace; the spans form one tree under the agent's span, whatever the
// agent's sampled flag.
func TestTraceHeaders(t *testing.T) {
	const agentTrace, agentSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	for name, c := range map[string]struct {
		forward, traced, credentials bool
	}{
		"not forwarded":                       {},
		"forwarded":                           {forward: true},
		"traced, not forwarded":               {traced: true},
		"traced, forwarded":                   {forward: true, traced: true},
		"traced, forwarded, with credentials": {forward: true, traced: true, credentials: true},
	} {
		t.Run(name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			d, host := policy.Decision{ForwardTraceparent: c.forward}, "api.example.test"
			if c.credentials {
				d.Credentials, host = []string{"openai"}, "api.openai.com"
			}
			deps := Deps{Policy: fixedDecision{d}, Secrets: benchSecrets{}}
			if c.traced {
				deps.Tracer = trace.NewTracerProvider(trace.WithSampler(trace.AlwaysSample()), trace.WithSpanProcessor(rec)).Tracer("t")
			}
			up := &recordingUpstream{}
			br, tun := testBroker(t, testConfig(t), deps, up, host)
			r := httptest.NewRequest(http.MethodGet, "/x", nil)
			r.Host = host
			agentParent := "00-" + agentTrace + "-" + agentSpan + "-00" // not sampled: traced anyway
			r.Header.Set("Traceparent", agentParent)
			r.Header.Set("Tracestate", "vendor=private")
			w := httptest.NewRecorder()
			br.serveTunnel(w, r, tun)
			if w.Code != http.StatusOK || up.got == nil {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			tp, ts := up.got.Header.Get("Traceparent"), up.got.Header.Get("Tracestate")
			if !c.forward {
				if tp != "" || ts != "" {
					t.Fatalf("trace headers went upstream: %q %q", tp, ts)
				}
			} else if ts != "vendor=private" || (!c.traced && tp != agentParent) {
				t.Fatalf("forwarded: traceparent %q tracestate %q", tp, ts)
			}
			if !c.traced {
				return
			}
			spans := rec.Ended()
			byName := map[string]trace.ReadOnlySpan{}
			for _, s := range spans {
				byName[s.Name()] = s
			}
			root := byName["capbroker.request"]
			if root == nil || root.Parent().SpanID().String() != agentSpan || root.SpanContext().TraceID().String() != agentTrace {
				t.Fatalf("root %v of %d spans", root, len(spans))
			}
			// A span for each step the request went through, and none for the others: no
			// approval without a hold, no credentials span without credentials granted.
			steps := []string{"identity", "policy", "upstream"}
			if c.credentials {
				steps = append(steps, "credentials", "scrub")
			}
			for _, step := range steps {
				s := byName[step]
				if s == nil || s.Parent().SpanID() != root.SpanContext().SpanID() {
					t.Errorf("step %q: %v", step, s)
				}
			}
			if len(spans) != len(steps)+1 {
				t.Errorf("%d spans, want the root and %v", len(spans), steps)
			}
			if c.forward && tp != "00-"+agentTrace+"-"+byName["upstream"].SpanContext().SpanID().String()+"-01" {
				t.Errorf("traceparent upstream %q", tp)
			}
		})
	}
}

// TestTraceLLM: a metered LLM call's upstream span is named after the model and carries the
// GenAI semantic conventions; the audit event carries the trace id.
func TestTraceLLM(t *testing.T) {
	br, tun := benchBroker(t, false)
	rec := tracetest.NewSpanRecorder()
	br.tracer = trace.NewTracerProvider(trace.WithSampler(trace.AlwaysSample()), trace.WithSpanProcessor(rec)).Tracer("t")
	var auditLog bytes.Buffer
	lg := audit.New(&auditLog)
	br.audit, br.recorder = lg, &fakeRecorder{}
	br.setTransport(streamUpstream{sent: make(chan []byte, 1)})
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o-mini","stream":true,"messages":[]}`))
	r.Host = "api.openai.com"
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	br.serveTunnel(w, r, tun)
	lg.Close()
	var up trace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() == oteltrace.SpanKindClient {
			up = s
		}
	}
	if up == nil || up.Name() != "chat gpt-4o-mini" {
		t.Fatalf("upstream span %v", up)
	}
	attrs := map[string]string{}
	for _, kv := range up.Attributes() {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	for k, v := range map[string]string{"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4o-mini",
		"gen_ai.usage.input_tokens": "7", "gen_ai.usage.output_tokens": "3"} {
		if attrs[k] != v {
			t.Errorf("%s = %q, want %q", k, attrs[k], v)
		}
	}
	var ev map[string]any
	if err := json.Unmarshal(auditLog.Bytes(), &ev); err != nil || ev["trace_id"] != up.SpanContext().TraceID().String() {
		t.Errorf("audit %s: trace_id, want %s", auditLog.Bytes(), up.SpanContext().TraceID())
	}
}
