package broker

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/broker/telemetry"
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
			rec := &recordTraces{}
			d, host := policy.Decision{ForwardTraceparent: c.forward}, "api.example.test"
			if c.credentials {
				d.Credentials, host = []string{"openai"}, "api.openai.com"
			}
			deps := Deps{Policy: fixedDecision{d}, Secrets: benchSecrets{}}
			if c.traced {
				deps.Tracer = rec
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
			traces := rec.Ended()
			if len(traces) != 1 {
				t.Fatalf("%d traces", len(traces))
			}
			tr := traces[0]
			if tr.Root.Name != "capbroker.request" || hex.EncodeToString(tr.Parent[:]) != agentSpan || hex.EncodeToString(tr.TraceID[:]) != agentTrace ||
				tr.Root.End.Before(tr.Root.Start) {
				t.Fatalf("root %+v parent %x trace %x", tr.Root, tr.Parent, tr.TraceID)
			}
			byName := map[string]telemetry.Span{}
			for _, s := range tr.Steps[:tr.NSteps] {
				byName[s.Name] = s
			}
			n := 1 + tr.NSteps
			for _, s := range []telemetry.Span{tr.Upstream, tr.Scrub} {
				if !s.Start.IsZero() {
					byName[s.Name] = s
					n++
				}
			}
			// A span for each step the request went through, and none for the others: no
			// approval without a hold, no credentials span without credentials granted.
			steps := []string{"identity", "policy", "upstream"}
			if c.credentials {
				steps = append(steps, "credentials", "scrub")
			}
			for _, step := range steps {
				s, ok := byName[step]
				if !ok || s.ID == ([8]byte{}) || s.End.IsZero() || s.End.Before(s.Start) {
					t.Errorf("step %q: %+v", step, s)
				}
			}
			if n != len(steps)+1 {
				t.Errorf("%d spans, want the root and %v", n, steps)
			}
			if c.forward && tp != "00-"+agentTrace+"-"+hex.EncodeToString(tr.Upstream.ID[:])+"-01" {
				t.Errorf("traceparent upstream %q", tp)
			}
			if tr.Event.TraceID != agentTrace || tr.Event.SpanID != hex.EncodeToString(tr.Root.ID[:]) {
				t.Errorf("event trace %q span %q", tr.Event.TraceID, tr.Event.SpanID)
			}
		})
	}
}

// TestTraceLLM: a metered LLM call's upstream span is named after the model and carries the
// GenAI semantic conventions (the model's name and
// usage, on export: TestTraceExport); the audit event carries the trace id.
func TestTraceLLM(t *testing.T) {
	br, tun := benchBroker(t, false)
	rec := &recordTraces{}
	br.tracer = rec
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
	ended := rec.Ended()
	if len(ended) != 1 || ended[0].Upstream.Name != "chat gpt-4o-mini" {
		t.Fatalf("traces %v", ended)
	}
	tr := ended[0]
	if l := tr.Event.LLM; l == nil || l.Provider != "openai" || l.Model != "gpt-4o-mini" || l.TokensIn != 7 || l.TokensOut != 3 {
		t.Errorf("the trace's LLM call: %+v", l)
	}
	var ev map[string]any
	if err := json.Unmarshal(auditLog.Bytes(), &ev); err != nil || ev["trace_id"] != hex.EncodeToString(tr.TraceID[:]) {
		t.Errorf("audit %s: trace_id, want %x", auditLog.Bytes(), tr.TraceID)
	}
}

// TestParseTraceparent: the broker reads a traceparent as the SDK's W3C propagator does.
func TestParseTraceparent(t *testing.T) {
	const tid, sid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	for _, h := range []string{
		"00-" + tid + "-" + sid + "-01", "00-" + tid + "-" + sid + "-00", "01-" + tid + "-" + sid + "-01-extra",
		"01-" + tid + "-" + sid + "-01", "00-" + tid + "-" + sid + "-01-extra", "ff-" + tid + "-" + sid + "-01",
		"00-" + strings.ToUpper(tid) + "-" + sid + "-01", "00-00000000000000000000000000000000-" + sid + "-01",
		"00-" + tid + "-0000000000000000-01", "00-" + tid + "-" + sid + "-0g", "0-" + tid + "-" + sid + "-01",
		"00-" + tid + "-" + sid, "", "00_" + tid + "-" + sid + "-01", "01-" + tid + "-" + sid + "-01x",
	} {
		sc := oteltrace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": h}))
		gotT, gotS, ok := parseTraceparent(h)
		if ok != sc.IsValid() || (ok && (oteltrace.TraceID(gotT) != sc.TraceID() || oteltrace.SpanID(gotS) != sc.SpanID())) {
			t.Errorf("%q: ok %v %x %x; the SDK: valid %v %s %s", h, ok, gotT, gotS, sc.IsValid(), sc.TraceID(), sc.SpanID())
		}
	}
}
