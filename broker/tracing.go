package broker

import (
	"encoding/hex"
	"net/http"
	"strconv"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/inject"
	"github.com/capbroker/capbroker/broker/telemetry"
)

// The trace of a request (telemetry.traces, docs/observability.md): a root span per exchange
// ("capbroker.request" or "capbroker.connect"), a child of the agent's own span when it sent
// a W3C traceparent, with a child per step: identity, policy, approval (while a person is
// asked), credentials (fetch, mint, sign), upstream (a client span, to the end of the
// response; GenAI attributes on a metered LLM call), scrub (the response scrubbed, to its
// end). The request records only ids and timestamps in its telemetry.Trace; when the
// exchange finishes the Trace takes a copy of the audit event (the decision and the
// attributes) and goes to the export queue, where the spans are made. The audit event carries
// trace_id. Without a tracer, or not sampled, nothing is done (no allocation).
//
// Only the agent's traceparent is read, never tracestate: no decision, sampling included,
// depends on what tracestate says (the broker samples, whatever the traceparent's flag).

// Tracer hands out the Trace of each sampled request and takes it back when the request
// ends (telemetry.Tracer: never blocks).
type Tracer interface {
	Start() *telemetry.Trace
	End(*telemetry.Trace)
}

// startTrace starts the exchange's trace, when it is sampled.
func (b *Broker) startTrace(x *exchange, r *http.Request) {
	if b.tracer == nil {
		return
	}
	tr := b.tracer.Start()
	if tr == nil {
		return
	}
	if tp := r.Header.Values("Traceparent"); len(tp) == 1 { // two are no trace context (W3C)
		if tid, sid, ok := parseTraceparent(tp[0]); ok {
			tr.TraceID, tr.Parent = tid, sid
		}
	}
	tr.Root.Name, tr.Root.Start = "capbroker."+x.ev.Phase, x.ev.Start
	if x.ev.Phase == "request" {
		tr.Root.Name = "capbroker.request" // without the concatenation's allocation
	}
	x.tr = tr
}

// parseTraceparent reads a W3C traceparent (version-traceid-parentid-flags, lower-case hex)
// as the SDK's propagator does: version ff is invalid, version 00 has exactly four fields, a
// later version may add fields after a '-'; the ids must not be all zeros. The flags are
// checked for form and otherwise ignored (the broker samples).
func parseTraceparent(h string) (tid [16]byte, sid [8]byte, ok bool) {
	if len(h) < 55 || h[2] != '-' || h[35] != '-' || h[52] != '-' || h[:2] == "ff" ||
		(h[:2] == "00" && len(h) != 55) || (len(h) > 55 && h[55] != '-') {
		return tid, sid, false
	}
	lowerHex := func(s string) bool {
		for i := range len(s) {
			if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
		return true
	}
	if !lowerHex(h[:2]) || !lowerHex(h[3:35]) || !lowerHex(h[36:52]) || !lowerHex(h[53:55]) {
		return tid, sid, false
	}
	hex.Decode(tid[:], []byte(h[3:35]))
	hex.Decode(sid[:], []byte(h[36:52]))
	return tid, sid, tid != [16]byte{} && sid != [8]byte{}
}

// step starts a step's span; its Finish ends it (nil, which Finish takes, when not traced).
func (x *exchange) step(name string) *telemetry.Span {
	if x.tr == nil {
		return nil
	}
	return x.tr.Step(name)
}

// credentialsStep starts the credentials span when the decision granted any: a request
// without credentials has no such step.
func (x *exchange) credentialsStep(granted []*inject.Binding) *telemetry.Span {
	if len(granted) == 0 {
		return nil
	}
	return x.step("credentials")
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
	u := &x.tr.Upstream
	u.ID, u.Name, u.Start = telemetry.NewSpanID(), "upstream", x.tr.Now()
	if forward {
		var b [55]byte
		copy(b[:], "00-")
		hex.Encode(b[3:35], x.tr.TraceID[:])
		b[35] = '-'
		hex.Encode(b[36:52], u.ID[:])
		copy(b[52:], "-01")
		out.Header["Traceparent"] = []string{string(b[:])}
	}
}

// traceScrub starts the scrub span, when the response is scrubbed.
func (x *exchange) traceScrub() {
	if x.tr != nil && !x.scrub.Empty() {
		x.tr.Scrub = telemetry.Span{ID: telemetry.NewSpanID(), Name: "scrub", Start: x.tr.Now()}
	}
}

// endTrace ends the spans still open, records the trace in the audit event, and hands the
// trace, with a copy of the event, to the tracer.
func (x *exchange) endTrace() {
	tr := x.tr
	if tr == nil {
		return
	}
	x.tr = nil
	ev := &x.ev
	now := tr.Now()
	if !tr.Scrub.Start.IsZero() {
		tr.Scrub.End = now
	}
	if u := &tr.Upstream; !u.Start.IsZero() {
		u.End = now
		if l := ev.LLM; l != nil {
			u.Name = "chat " + l.Model
		}
	}
	tr.Root.End = now
	if ev.Decision == audit.Deny || ev.Status >= 500 {
		tr.Status = x.code
		if tr.Status == "" {
			tr.Status = ev.Decision + " " + strconv.Itoa(ev.Status)
		}
	}
	var ids [48]byte // both in one string: one allocation
	hex.Encode(ids[:32], tr.TraceID[:])
	hex.Encode(ids[32:], tr.Root.ID[:])
	both := string(ids[:])
	ev.TraceID, ev.SpanID = both[:32], both[32:]
	tr.Event = *ev
	x.b.tracer.End(tr)
}

// SetTelemetryProblem makes /readyz report the telemetry export degraded while problem
// returns a text (the collector refuses the credentials).
func (m *Metrics) SetTelemetryProblem(problem func() string) { m.telemetryProblem.Store(&problem) }
