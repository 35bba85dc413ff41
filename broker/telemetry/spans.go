package telemetry

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/sdk/resource"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/scrub"
)

// The request spans are not the SDK's: the broker records each request's tree as one compact
// Trace (ids and timestamps, and the audit event when it ends), with no span object, context
// or attribute made on the request's goroutine; the export goroutine turns a batch of them
// into OTLP spans, scrubbed, and hands them to the OTLP client (gRPC or HTTP) as protobuf
// messages. The SDK's span path cost the broker 1.85x its CPU per request (docs/benchmarks.md).

// Span is one span of a Trace: zero Start means it did not happen.
type Span struct {
	ID         [8]byte
	Name       string
	Start, End time.Time
}

// Trace is one request's span tree: a root per exchange, a child of the agent's own span when
// it sent a traceparent (Parent), with a child per step, and the upstream and scrub spans
// open until the exchange ends. Event is the request's audit event as it was written, the
// decision and attributes read from it on export.
type Trace struct {
	TraceID  [16]byte
	Parent   [8]byte // the agent's span; zero: none
	Root     Span
	Steps    [4]Span // identity, policy, approval, credentials, in the order started
	NSteps   int
	Upstream Span
	Scrub    Span
	// Status is the root's error description ("" when the exchange did not fail).
	Status string
	Event  audit.Event
}

// NewSpanID is a random span id.
func NewSpanID() (id [8]byte) {
	for id == [8]byte{} {
		putUint64(id[:], rand.Uint64())
	}
	return id
}

func putUint64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (56 - 8*i))
	}
}

// Step starts a step's span and returns it, for its End to be set; nil when there is no
// room (a step past the four known is not recorded).
func (t *Trace) Step(name string) *Span {
	if t.NSteps == len(t.Steps) {
		return nil
	}
	s := &t.Steps[t.NSteps]
	t.NSteps++
	*s = Span{ID: NewSpanID(), Name: name, Start: time.Now()}
	return s
}

// Tracer hands out the Traces of the requests it samples and queues the ended ones for
// export. It never blocks: a Trace that finds the queue full is dropped and counted (its
// spans, under signal traces).
type Tracer struct {
	ratio float64 // < 1: sample at random
	q     *queue[*Trace]
	pool  sync.Pool
}

// Start is a new Trace with a random trace id and root span id, or nil when the request is
// not sampled. The sampling is the broker's: nothing the agent sends takes part in it.
func (t *Tracer) Start() *Trace {
	if t == nil || (t.ratio < 1 && rand.Float64() >= t.ratio) {
		return nil
	}
	tr, _ := t.pool.Get().(*Trace)
	if tr == nil {
		tr = new(Trace)
	}
	tr.init()
	return tr
}

// NewTrace is a Trace with a random trace id and root span id (for a Tracer of one's own).
func NewTrace() *Trace {
	tr := new(Trace)
	tr.init()
	return tr
}

func (tr *Trace) init() {
	putUint64(tr.TraceID[:8], rand.Uint64())
	putUint64(tr.TraceID[8:], rand.Uint64()|1)
	tr.Root.ID = NewSpanID()
}

// End queues tr for export; tr belongs to the Tracer from then on.
func (t *Tracer) End(tr *Trace) { t.q.put(tr) }

func (t *Tracer) release(tr *Trace) {
	*tr = Trace{}
	t.pool.Put(tr)
}

// spanCount is how many spans tr exports.
func spanCount(tr *Trace) int {
	n := 1 + tr.NSteps
	if !tr.Upstream.Start.IsZero() {
		n++
	}
	if !tr.Scrub.Start.IsZero() {
		n++
	}
	return n
}

// traceExporter turns batches of Traces into OTLP and uploads them.
type traceExporter struct {
	client   otlptrace.Client
	resource *resourcepb.Resource
	scope    *commonpb.InstrumentationScope
	cache    scrubCache
}

// export is the queue's export of a batch.
func (e *traceExporter) export(ctx context.Context, r *scrub.Replacer, batch []*Trace) error {
	e.cache.use(r)
	n := 0
	for _, tr := range batch {
		n += spanCount(tr)
	}
	spans := make([]tracepb.Span, n) // one allocation for the batch's spans
	ptrs := make([]*tracepb.Span, n)
	for i := range spans {
		ptrs[i] = &spans[i]
	}
	next := ptrs
	for _, tr := range batch {
		next = e.fillSpans(next, tr)
	}
	return e.client.UploadTraces(ctx, []*tracepb.ResourceSpans{{
		Resource:   e.resource,
		ScopeSpans: []*tracepb.ScopeSpans{{Scope: e.scope, Spans: ptrs}},
	}})
}

// fillSpans fills the first spans of dst with tr's in OTLP form, every string scrubbed, and
// returns the rest of dst.
func (e *traceExporter) fillSpans(dst []*tracepb.Span, tr *Trace) []*tracepb.Span {
	ev := &tr.Event
	tid := tr.TraceID[:]
	span := func(s *Span, parent []byte, kind tracepb.Span_SpanKind, attrs []*commonpb.KeyValue) *tracepb.Span {
		flags := uint32(1) | uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK) // sampled
		if s == &tr.Root && parent != nil {
			flags |= uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK)
		}
		p := dst[0]
		dst = dst[1:]
		p.TraceId, p.SpanId, p.ParentSpanId = tid, s.ID[:], parent
		p.Name, p.Kind, p.Flags, p.Attributes = e.cache.scrub(s.Name), kind, flags, attrs
		p.StartTimeUnixNano, p.EndTimeUnixNano = uint64(s.Start.UnixNano()), uint64(s.End.UnixNano())
		return p
	}
	var parent []byte
	if tr.Parent != [8]byte{} {
		parent = tr.Parent[:]
	}
	c := &e.cache
	attrs := []*commonpb.KeyValue{
		c.str("capbroker.request_id", ev.RequestID),
		c.str("capbroker.agent", ev.Agent),
		c.str("capbroker.phase", ev.Phase),
		c.str("capbroker.decision", ev.Decision),
		c.str("capbroker.reason", ev.Reason),
		c.strs("capbroker.credentials", ev.Credentials),
		c.str("capbroker.policy_revision", ev.PolicyRevision),
		c.str("capbroker.decision_id", ev.DecisionID),
		c.str("capbroker.mode", ev.Mode),
		c.str("http.request.method", ev.Method),
		c.str("server.address", ev.Host),
		intKV("server.port", int64(ev.Port)),
		c.str("url.path", ev.Path),
		intKV("http.response.status_code", int64(ev.Status)),
	}
	if ev.WouldDeny {
		attrs = append(attrs, &commonpb.KeyValue{Key: "capbroker.would_deny", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: true}}})
	}
	root := span(&tr.Root, parent, tracepb.Span_SPAN_KIND_SERVER, attrs)
	if tr.Status != "" {
		root.Status = &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: c.scrub(tr.Status)}
	}
	rid := tr.Root.ID[:]
	for i := range tr.NSteps {
		span(&tr.Steps[i], rid, tracepb.Span_SPAN_KIND_INTERNAL, nil)
	}
	if s := &tr.Upstream; !s.Start.IsZero() {
		attrs := []*commonpb.KeyValue{
			c.str("server.address", ev.Host), intKV("server.port", int64(ev.Port)),
			intKV("http.response.status_code", int64(ev.Status)),
		}
		if l := ev.LLM; l != nil {
			// OpenTelemetry's GenAI semantic conventions, for the call to the model.
			attrs = append(attrs,
				c.str("gen_ai.operation.name", "chat"),
				c.str("gen_ai.provider.name", l.Provider),
				c.str("gen_ai.request.model", l.Model),
				intKV("gen_ai.usage.input_tokens", l.TokensIn),
				intKV("gen_ai.usage.output_tokens", l.TokensOut),
				&commonpb.KeyValue{Key: "capbroker.llm.cost", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: l.Cost}}},
				&commonpb.KeyValue{Key: "capbroker.llm.usage_reported", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: l.Reported}}},
			)
		}
		span(s, rid, tracepb.Span_SPAN_KIND_CLIENT, attrs)
	}
	if s := &tr.Scrub; !s.Start.IsZero() {
		span(s, rid, tracepb.Span_SPAN_KIND_INTERNAL, nil)
	}
	return dst
}

func intKV(k string, v int64) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v}}}
}

// scrubCache scrubs each distinct string once while the secrets stay the same: most of a
// span's strings (agent, host, decision, names) repeat from request to request. It is the
// export goroutine's own, bounded, and emptied when the Replacer changes.
type scrubCache struct {
	r    *scrub.Replacer
	seen map[string]*commonpb.AnyValue
}

const scrubCacheMax = 4096

func (c *scrubCache) use(r *scrub.Replacer) {
	if c.r != r || len(c.seen) > scrubCacheMax {
		c.r, c.seen = r, make(map[string]*commonpb.AnyValue, 256)
	}
}

// value is s scrubbed, as an OTLP string value (shared between the spans that carry it:
// the messages are only read when encoded).
func (c *scrubCache) value(s string) *commonpb.AnyValue {
	if v, ok := c.seen[s]; ok {
		return v
	}
	v := &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: c.r.String(s)}}
	c.seen[s] = v
	return v
}

func (c *scrubCache) scrub(s string) string {
	return c.value(s).Value.(*commonpb.AnyValue_StringValue).StringValue
}

func (c *scrubCache) str(k, v string) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: c.value(v)}
}

func (c *scrubCache) strs(k string, vs []string) *commonpb.KeyValue {
	arr := make([]*commonpb.AnyValue, len(vs))
	for i, v := range vs {
		arr[i] = c.value(v)
	}
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: &commonpb.ArrayValue{Values: arr}}}}
}

// resourceProto is the OTLP form of the resource (string attributes only).
func resourceProto(res *resource.Resource) *resourcepb.Resource {
	r := &resourcepb.Resource{}
	for _, kv := range res.Attributes() {
		r.Attributes = append(r.Attributes, &commonpb.KeyValue{Key: string(kv.Key), Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: kv.Value.Emit()}}})
	}
	return r
}

// Finish ends s (nothing when s is nil: the step is not traced).
func (s *Span) Finish() {
	if s != nil {
		s.End = time.Now()
	}
}
