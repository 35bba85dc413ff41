package telemetry

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"
	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/scrub"
)

// TestQueueNeverBlocks: with the exporter stuck, put returns at once; what does not fit is
// dropped and counted, and every item is either exported or counted as dropped.
func TestQueueNeverBlocks(t *testing.T) {
	release := make(chan struct{})
	var exported atomic.Int64
	var mu sync.Mutex
	dropped := map[string]int{}
	q := newQueue(4, 2, time.Millisecond, time.Minute, func(ctx context.Context, items []int) error {
		<-release
		exported.Add(int64(len(items)))
		return nil
	}, func(reason string, n int) { mu.Lock(); dropped[reason] += n; mu.Unlock() })
	for i := range 100 {
		q.put(i) // would hang the test if it waited for the exporter
	}
	mu.Lock()
	full := dropped[dropQueueFull]
	mu.Unlock()
	if full < 100-4-2 {
		t.Fatalf("dropped %d of 100 with a queue of 4 and a stuck exporter", full)
	}
	close(release)
	if err := q.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := exported.Load() + int64(dropped[dropQueueFull]); got != 100 {
		t.Fatalf("exported %d + dropped %d != 100", exported.Load(), dropped[dropQueueFull])
	}
}

// TestQueueExportsWholeBatches: while items keep coming, each export is a whole batch (the
// rest waits for the tick or a flush), not whatever arrived during the previous export.
func TestQueueExportsWholeBatches(t *testing.T) {
	sizes := make(chan int, 16)
	q := newQueue(64, 4, time.Hour, time.Minute, func(_ context.Context, items []int) error {
		sizes <- len(items)
		return nil
	}, func(string, int) { t.Error("dropped") })
	for i := range 10 {
		q.put(i)
	}
	for range 2 {
		if n := <-sizes; n != 4 {
			t.Fatalf("an export of %d items, want whole batches of 4", n)
		}
	}
	if err := q.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := <-sizes; n != 2 {
		t.Fatalf("the flush exported %d, want the 2 left", n)
	}
	_ = q.Close(context.Background())
}

// TestQueueCountsFailedExports: a batch the exporter fails is counted as dropped.
func TestQueueCountsFailedExports(t *testing.T) {
	var dropped atomic.Int64
	q := newQueue(16, 4, time.Millisecond, time.Second, func(context.Context, []int) error {
		return errors.New("collector down")
	}, func(reason string, n int) {
		if reason == dropExportFailed {
			dropped.Add(int64(n))
		}
	})
	for i := range 10 {
		q.put(i)
	}
	if err := q.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	_ = q.Close(context.Background())
	if dropped.Load() != 10 {
		t.Fatalf("dropped %d, want 10", dropped.Load())
	}
}

const canary = "sk-canary-0123456789abcdef"

// TestTraceExport: a Trace becomes its span tree in OTLP (the root a child of the agent's
// span, each step a child of the root, the decision and GenAI attributes) under the resource
// and scope, and every string exported is scrubbed.
func TestTraceExport(t *testing.T) {
	r := scrub.New(canary, "[REDACTED]")
	trace := func() *Trace {
		tr := NewTrace()
		tr.Parent = NewSpanID()
		now := time.Now()
		tr.Root = Span{ID: tr.Root.ID, Name: "capbroker.request", Start: now, End: now.Add(time.Millisecond)}
		tr.Step("identity").Finish()
		tr.Upstream = Span{ID: NewSpanID(), Name: "chat gpt-4o-mini", Start: now, End: now}
		tr.Scrub = Span{ID: NewSpanID(), Name: "scrub", Start: now, End: now}
		tr.Status = "failed with " + canary
		tr.Event = audit.Event{RequestID: "r-" + canary, DecisionID: "d-" + canary, Agent: "agent-" + canary, Decision: "deny", Path: "/x/" + canary, Credentials: []string{"a", canary}, Status: 502,
			LLM: &audit.LLMCall{Provider: "openai", Model: "gpt-4o-mini", TokensIn: 7, TokensOut: 3}}
		return tr
	}
	sent := joinTraces(t, r, resource.NewSchemaless(attribute.String("service.name", "capbroker")), trace(), trace())
	var req coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(sent, &req); err != nil {
		t.Fatal(err)
	}
	if req.ResourceSpans[0].Resource.Attributes[0].Value.GetStringValue() != "capbroker" || req.ResourceSpans[0].ScopeSpans[0].Scope.Name != "s" {
		t.Fatalf("resource or scope: %v", req.ResourceSpans[0])
	}
	spans := req.ResourceSpans[0].ScopeSpans[0].Spans
	if len(spans) != 8 {
		t.Fatalf("%d spans, want 8", len(spans))
	}
	for _, tr := range [][]*tracepb.Span{spans[:4], spans[4:]} {
		root := tr[0]
		if root.Kind != tracepb.Span_SPAN_KIND_SERVER || len(root.ParentSpanId) != 8 || root.Status.GetMessage() != "failed with [REDACTED]" {
			t.Fatalf("root %v", root)
		}
		for _, s := range tr[1:] {
			if string(s.ParentSpanId) != string(root.SpanId) || string(s.TraceId) != string(root.TraceId) {
				t.Errorf("span %q not under the root", s.Name)
			}
		}
		attrs := map[string]string{}
		for _, kv := range tr[2].Attributes {
			attrs[kv.Key] = kv.Value.String()
		}
		if tr[2].Name != "chat gpt-4o-mini" || tr[2].Kind != tracepb.Span_SPAN_KIND_CLIENT || !contains(attrs["gen_ai.request.model"], "gpt-4o-mini") || !contains(attrs["gen_ai.usage.input_tokens"], "7") {
			t.Errorf("upstream span %v", tr[2])
		}
	}
	if bytes.Contains(sent, []byte(canary)) || !bytes.Contains(sent, []byte("agent-[REDACTED]")) {
		t.Fatalf("the canary, or no redaction, in %q", sent)
	}
}

// joinTraces encodes trs, scrubbed by r, as the Tracer does when each ends, and joins them
// under res and a scope "s" as the export goroutine does: the export request's bytes.
func joinTraces(t *testing.T, r *scrub.Replacer, res *resource.Resource, trs ...*Trace) []byte {
	t.Helper()
	e, err := newExporter(nil, res, "s")
	if err != nil {
		t.Fatal(err)
	}
	var batch []encoded
	for _, tr := range trs {
		b := getBuf()
		*b = encodeTrace(*b, r, tr)
		batch = append(batch, encoded{b: b, items: spanCount(tr)})
	}
	return append([]byte(nil), e.join(batch)...)
}

// joinRecords encodes the audit events' records (e, line, in turn; e nil for an approval)
// scrubbed by r, and joins them in one export request.
func joinRecords(t *testing.T, r *scrub.Replacer, events ...any) []byte {
	t.Helper()
	e, err := newExporter(nil, resource.Empty(), "s")
	if err != nil {
		t.Fatal(err)
	}
	var batch []encoded
	for i := 0; i < len(events); i += 2 {
		ev, _ := events[i].(*audit.Event)
		b := getBuf()
		*b = encodeRecord(*b, r, ev, events[i+1].([]byte))
		batch = append(batch, encoded{b: b, items: 1})
	}
	return append([]byte(nil), e.join(batch)...)
}

// exportTraces exports trs as one batch scrubbed by r, and returns the spans decoded by the
// official OTLP types.
func exportTraces(t *testing.T, r *scrub.Replacer, trs ...*Trace) []*tracepb.Span {
	t.Helper()
	sent := joinTraces(t, r, resource.Empty(), trs...)
	var req coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(sent, &req); err != nil {
		t.Fatal(err)
	}
	return req.ResourceSpans[0].ScopeSpans[0].Spans
}

// TestTraceAttributes: the attributes written directly are what the official OTLP messages
// would hold, value for value and type for type (decoded by the official types and compared
// with messages built from them); those without a value are left out.
func TestTraceAttributes(t *testing.T) {
	now := time.Now()
	tr := NewTrace()
	tr.Root = Span{ID: tr.Root.ID, Name: "capbroker.request", Start: now, End: now}
	tr.Upstream = Span{ID: NewSpanID(), Name: "chat m", Start: now, End: now}
	tr.Event = audit.Event{RequestID: "r1", Agent: "a1", Phase: "request", Decision: "allow", Reason: "rule x",
		Credentials: []string{"openai", "github"}, PolicyRevision: "rev", DecisionID: "d1", Mode: "explicit",
		WouldDeny: true, Method: "POST", Host: "api.example.test", Port: 8443, Path: "/v1/x", Status: 200,
		LLM: &audit.LLMCall{Provider: "openai", Model: "m", TokensIn: 300, TokensOut: 1 << 40, Cost: 0.125, Reported: true}}
	spans := exportTraces(t, scrub.New(), tr)
	str := func(k, v string) *commonpb.KeyValue {
		return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
	}
	num := func(k string, v int64) *commonpb.KeyValue {
		return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v}}}
	}
	boolean := func(k string, v bool) *commonpb.KeyValue {
		return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: v}}}
	}
	root := []*commonpb.KeyValue{str("capbroker.request_id", "r1"), str("capbroker.agent", "a1"), str("capbroker.phase", "request"),
		str("capbroker.decision", "allow"), str("capbroker.reason", "rule x"),
		{Key: "capbroker.credentials", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: &commonpb.ArrayValue{Values: []*commonpb.AnyValue{
			{Value: &commonpb.AnyValue_StringValue{StringValue: "openai"}}, {Value: &commonpb.AnyValue_StringValue{StringValue: "github"}}}}}}},
		str("capbroker.policy_revision", "rev"), str("capbroker.decision_id", "d1"), str("capbroker.mode", "explicit"),
		str("http.request.method", "POST"), str("server.address", "api.example.test"), num("server.port", 8443),
		str("url.path", "/v1/x"), num("http.response.status_code", 200), boolean("capbroker.would_deny", true)}
	up := []*commonpb.KeyValue{str("gen_ai.operation.name", "chat"), str("gen_ai.provider.name", "openai"), str("gen_ai.request.model", "m"),
		num("gen_ai.usage.input_tokens", 300), num("gen_ai.usage.output_tokens", 1<<40),
		{Key: "capbroker.llm.cost", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: 0.125}}},
		boolean("capbroker.llm.usage_reported", true)}
	for i, want := range [][]*commonpb.KeyValue{root, up} {
		got := spans[i].Attributes
		if len(got) != len(want) {
			t.Fatalf("span %q: %d attributes, want %d: %v", spans[i].Name, len(got), len(want), got)
		}
		for j := range want {
			if !proto.Equal(got[j], want[j]) {
				t.Errorf("span %q attribute %d: %v, want %v", spans[i].Name, j, got[j], want[j])
			}
		}
	}

	// A request refused before it had a host, port or status has no such attributes.
	tr = NewTrace()
	tr.Root = Span{ID: tr.Root.ID, Name: "capbroker.request", Start: now, End: now}
	tr.Event = audit.Event{RequestID: "r2", Decision: "deny"}
	if got := exportTraces(t, scrub.New(), tr)[0].Attributes; len(got) != 2 {
		t.Errorf("attributes of a refused request: %v", got)
	}
}

// TestScrubRecordsAndMetrics: a log record's body and attributes, and a metric point's
// attributes, are scrubbed.
func TestScrubRecordsAndMetrics(t *testing.T) {
	r := scrub.New(canary, "[REDACTED]")
	sent := joinRecords(t, r, &audit.Event{Agent: canary, RequestID: "x" + canary, Decision: canary}, []byte(`{"agent":"`+canary+`"}`+"\n"))
	if bytes.Contains(sent, []byte(canary)) {
		t.Fatalf("the canary in %q", sent)
	}
	rec := decodeLogs(t, sent).ResourceLogs[0].ScopeLogs[0].LogRecords[0]
	if b := rec.Body.GetStringValue(); b != `{"agent":"[REDACTED]"}` {
		t.Fatalf("body %s", b)
	}
	if len(rec.Attributes) != 3 {
		t.Fatalf("attributes %v", rec.Attributes)
	}

	rm := &metricdata.ResourceMetrics{ScopeMetrics: []metricdata.ScopeMetrics{{Metrics: []metricdata.Metrics{
		{Name: "c", Data: metricdata.Sum[float64]{DataPoints: []metricdata.DataPoint[float64]{{Attributes: attribute.NewSet(attribute.String("agent", canary))}}}},
		{Name: "h", Data: metricdata.Histogram[float64]{DataPoints: []metricdata.HistogramDataPoint[float64]{{Attributes: attribute.NewSet(attribute.String("host", "x"+canary))}}}},
	}}}}
	scrubMetrics(r, rm)
	for _, m := range rm.ScopeMetrics[0].Metrics {
		var set attribute.Set
		switch d := m.Data.(type) {
		case metricdata.Sum[float64]:
			set = d.DataPoints[0].Attributes
		case metricdata.Histogram[float64]:
			set = d.DataPoints[0].Attributes
		}
		for _, kv := range set.ToSlice() {
			if contains(kv.Value.AsString(), canary) {
				t.Fatalf("%s: %v", m.Name, kv)
			}
		}
	}
}

func decodeLogs(t *testing.T, b []byte) *collogs.ExportLogsServiceRequest {
	t.Helper()
	var req collogs.ExportLogsServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		t.Fatal(err)
	}
	return &req
}

// TestAuditRecord: an audit event becomes one record: the line as body, the agent, request
// id and decision as attributes, the request's span as the record's.
func TestAuditRecord(t *testing.T) {
	ev := &audit.Event{RequestID: "r1", Agent: "a1", Decision: "deny",
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7"}
	var nilTel *Telemetry
	nilTel.Audit(ev, []byte("x\n")) // no telemetry: nothing, no panic
	req := decodeLogs(t, joinRecords(t, scrub.New(), ev, []byte(`{"msg":"decision"}`+"\n"), nil, []byte(`{"msg":"approval"}`+"\n")))
	got := req.ResourceLogs[0].ScopeLogs[0].LogRecords
	if len(got) != 2 {
		t.Fatalf("%d records", len(got))
	}
	r := got[0]
	if r.Body.GetStringValue() != `{"msg":"decision"}` || r.EventName != "capbroker.decision" || r.SeverityText != "INFO" ||
		hex.EncodeToString(r.TraceId) != ev.TraceID || hex.EncodeToString(r.SpanId) != ev.SpanID || r.TimeUnixNano == 0 {
		t.Fatalf("record %v", r)
	}
	attrs := map[string]string{}
	for _, kv := range r.Attributes {
		attrs[kv.Key] = kv.Value.GetStringValue()
	}
	if attrs["capbroker.agent"] != "a1" || attrs["capbroker.request_id"] != "r1" || attrs["capbroker.decision"] != "deny" {
		t.Fatalf("attributes %v", attrs)
	}
	if got[1].EventName != "capbroker.approval" || len(got[1].TraceId) != 0 || len(got[1].Attributes) != 0 {
		t.Fatalf("approval record: %v", got[1])
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// TestSampler: the broker decides what is traced, at the configured ratio.
func TestSampler(t *testing.T) {
	for _, c := range []struct {
		ratio  float64
		traced bool
	}{{1, true}, {0, false}} {
		tr := &Tracer{ratio: c.ratio}
		for range 100 {
			if got := tr.Start() != nil; got != c.traced {
				t.Fatalf("ratio %g: traced %v", c.ratio, got)
			}
		}
	}
	if (*Tracer)(nil).Start() != nil {
		t.Fatal("a nil Tracer traced")
	}
	// Not drawn, a request costs no allocation.
	tr := &Tracer{ratio: 1e-9}
	if n := testing.AllocsPerRun(100, func() { tr.Start() }); n != 0 {
		t.Errorf("a request not drawn made %v allocations", n)
	}
}

// TestRetryable: what OTLP says a client may send again (a busy or unreachable collector) is
// retried until export_timeout; a refusal of the export or of the credentials is not.
func TestRetryable(t *testing.T) {
	for err, want := range map[error]bool{
		httpStatusError(429):                                      true,
		httpStatusError(503):                                      true,
		httpStatusError(400):                                      false,
		httpStatusError(401):                                      false,
		status.Error(codes.Unavailable, "down"):                   true,
		status.Error(codes.ResourceExhausted, "busy"):             true,
		status.Error(codes.InvalidArgument, "bad"):                false,
		status.Error(codes.Unauthenticated, "token"):              false,
		status.Error(codes.PermissionDenied, "token"):             false,
		context.DeadlineExceeded:                                  false,
		context.Canceled:                                          false,
		errors.New("dial tcp 127.0.0.1:4317: connection refused"): true,
	} {
		if got := retryable(err); got != want {
			t.Errorf("retryable(%v) = %v, want %v", err, got, want)
		}
	}
}

// TestSpanNameScrubbed: a span's name that is not one of the broker's constants (the model's,
// from the agent's request) is scrubbed like every other string.
func TestSpanNameScrubbed(t *testing.T) {
	now := time.Now()
	tr := NewTrace()
	tr.Root = Span{ID: tr.Root.ID, Name: "capbroker.request", Start: now, End: now}
	tr.Upstream = Span{ID: NewSpanID(), Name: "chat " + canary, Start: now, End: now}
	if got := exportTraces(t, scrub.New(canary, "[REDACTED]"), tr)[1].Name; got != "chat [REDACTED]" {
		t.Fatalf("upstream span %q", got)
	}
}

// TestTraceClock: a step's times are read on the trace's clock (the root's start advanced by
// the monotonic time since): in order, on the wall clock where the request ran, and read from
// the wall clock when the root has not started.
func TestTraceClock(t *testing.T) {
	tr := NewTrace()
	if s := tr.Step("identity"); s.Start.IsZero() || s.Start.Before(time.Now().Add(-time.Minute)) {
		t.Fatalf("before the root started, a step began at %v", s.Start)
	}
	tr = NewTrace()
	tr.Root.Start = time.Now()
	s := tr.Step("identity")
	s.Finish()
	end := tr.Now()
	wall := time.Now()
	if s.Start.Before(tr.Root.Start) || s.End.Before(s.Start) || end.Before(s.End) {
		t.Fatalf("out of order: root %v, step %v to %v, end %v", tr.Root.Start, s.Start, s.End, end)
	}
	// On the wall clock (without the monotonic reading), within a second of time.Now's.
	if d := wall.Round(0).Sub(end.Round(0)); d < -time.Second || d > time.Second {
		t.Fatalf("the trace's clock is %v from the wall clock", d)
	}
}
