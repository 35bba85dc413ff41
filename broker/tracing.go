package broker

import (
	"context"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/inject"
)

// The trace of a request (telemetry.traces, docs/observability.md): a root span per exchange
// ("capbroker.request" or "capbroker.connect"), a child of the agent's own span when it sent
// a W3C traceparent, with a child per step: identity, policy, approval (while a person is
// asked), credentials (fetch, mint, sign), upstream (a client span, to the end of the
// response; GenAI attributes on a metered LLM call), scrub (the response scrubbed, to its
// end). The decision is set on the root when the exchange finishes, and the audit event
// carries trace_id. Without a tracer nothing is done (no span, no allocation).
//
// Only the agent's traceparent is read, never tracestate: no decision, sampling included,
// depends on what tracestate says (every request is sampled, whatever the traceparent's flag).
type exchangeTrace struct {
	ctx      context.Context // carries the root span
	root     trace.Span
	upstream trace.Span // open until the exchange finishes
	scrub    trace.Span // open until the exchange finishes
	attrs    [16]attribute.KeyValue
}

// traceContext reads only traceparent: the broker never looks at tracestate.
var traceContext = propagation.TraceContext{}

// The span options every trace takes, made once (each call of trace.WithSpanKind allocates).
var (
	serverKind = trace.WithSpanKind(trace.SpanKindServer)
	clientKind = trace.WithSpanKind(trace.SpanKindClient)
)

// traceparent is a carrier of the agent's traceparent alone: tracestate is never read.
type traceparent struct{ v string }

func (c *traceparent) Get(key string) string {
	if key == "traceparent" {
		return c.v
	}
	return ""
}
func (*traceparent) Set(string, string) {}
func (*traceparent) Keys() []string     { return []string{"traceparent"} }

// startTrace starts the exchange's root span.
func (b *Broker) startTrace(x *exchange, r *http.Request) {
	if b.tracer == nil {
		return
	}
	parent := context.Background()
	if tp := r.Header.Values("Traceparent"); len(tp) == 1 { // two are no trace context (W3C)
		parent = traceContext.Extract(parent, &traceparent{tp[0]})
	}
	ctx, root := b.tracer.Start(parent, "capbroker."+x.ev.Phase, serverKind, trace.WithTimestamp(x.ev.Start))
	if root.IsRecording() { // not sampled (telemetry.trace_ratio): no trace, as without a tracer
		x.tr = &exchangeTrace{ctx: ctx, root: root}
	}
}

// step starts a step's span (nil when the exchange is not traced); endStep ends it.
func (x *exchange) step(name string) trace.Span {
	if x.tr == nil {
		return nil
	}
	_, s := x.b.tracer.Start(x.tr.ctx, name)
	return s
}

// credentialsStep starts the credentials span when the decision granted any: a request
// without credentials has no such step.
func (x *exchange) credentialsStep(granted []*inject.Binding) trace.Span {
	if len(granted) == 0 {
		return nil
	}
	return x.step("credentials")
}

// endStep ends a step's span, if there is one.
func endStep(s trace.Span) {
	if s != nil {
		s.End()
	}
}

// traceOutbound removes the agent's trace headers from the outbound request unless the
// decision forwards them ("forward_traceparent": true); then, when the request is traced, the
// upstream gets the broker's upstream span as its parent instead (the agent's tracestate, if
// any, goes with it unread).
func (x *exchange) traceOutbound(out *http.Request, forward bool) {
	if !forward {
		delete(out.Header, "Traceparent")
		delete(out.Header, "Tracestate")
	}
	if x.tr == nil {
		return
	}
	var ctx context.Context
	ctx, x.tr.upstream = x.b.tracer.Start(x.tr.ctx, "upstream", clientKind)
	if forward {
		delete(out.Header, "Traceparent")
		traceContext.Inject(ctx, propagation.HeaderCarrier(out.Header))
	}
}

// traceScrub starts the scrub span, when the response is scrubbed.
func (x *exchange) traceScrub() {
	if x.tr != nil && !x.scrub.Empty() {
		_, x.tr.scrub = x.b.tracer.Start(x.tr.ctx, "scrub")
	}
}

// endTrace sets the decision on the root span, ends the spans still open, and records the
// trace in the audit event. The request's attributes are on the root alone, set once, those
// without a value left out; the upstream span adds only what is its own (GenAI).
func (x *exchange) endTrace() {
	if x.tr == nil {
		return
	}
	ev := &x.ev
	if s := x.tr.scrub; s != nil {
		s.End()
	}
	if s := x.tr.upstream; s != nil {
		if l := ev.LLM; l != nil {
			// OpenTelemetry's GenAI semantic conventions, for the call to the model.
			s.SetName("chat " + l.Model)
			s.SetAttributes(
				attribute.String("gen_ai.operation.name", "chat"),
				attribute.String("gen_ai.provider.name", l.Provider),
				attribute.String("gen_ai.request.model", l.Model),
				attribute.Int64("gen_ai.usage.input_tokens", l.TokensIn),
				attribute.Int64("gen_ai.usage.output_tokens", l.TokensOut),
				attribute.Float64("capbroker.llm.cost", l.Cost),
				attribute.Bool("capbroker.llm.usage_reported", l.Reported),
			)
		}
		s.End()
	}
	r := x.tr.root
	a := x.tr.attrs[:0]
	str := func(k attribute.Key, v string) {
		if v != "" {
			a = append(a, k.String(v))
		}
	}
	str("capbroker.request_id", ev.RequestID)
	str("capbroker.agent", ev.Agent)
	str("capbroker.phase", ev.Phase)
	str("capbroker.decision", ev.Decision)
	str("capbroker.reason", ev.Reason)
	if len(ev.Credentials) > 0 {
		a = append(a, attribute.StringSlice("capbroker.credentials", ev.Credentials))
	}
	str("capbroker.policy_revision", ev.PolicyRevision)
	str("capbroker.decision_id", ev.DecisionID)
	str("capbroker.mode", ev.Mode)
	if ev.WouldDeny {
		a = append(a, attribute.Bool("capbroker.would_deny", true))
	}
	str("http.request.method", ev.Method)
	str("server.address", ev.Host)
	if ev.Port != 0 {
		a = append(a, attribute.Int("server.port", ev.Port))
	}
	str("url.path", ev.Path)
	if ev.Status != 0 {
		a = append(a, attribute.Int("http.response.status_code", ev.Status))
	}
	r.SetAttributes(a...)
	if ev.Decision == audit.Deny || ev.Status >= 500 {
		desc := x.code
		if desc == "" {
			desc = ev.Decision + " " + strconv.Itoa(ev.Status)
		}
		r.SetStatus(codes.Error, desc)
	}
	sc := r.SpanContext()
	ev.TraceID, ev.SpanID = sc.TraceID().String(), sc.SpanID().String()
	r.End()
}

// SetTelemetryProblem makes /readyz report the telemetry export degraded while problem
// returns a text (the collector refuses the credentials).
func (m *Metrics) SetTelemetryProblem(problem func() string) { m.telemetryProblem.Store(&problem) }
