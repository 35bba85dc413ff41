package telemetry

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	otellog "go.opentelemetry.io/otel/log"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	oteltrace "go.opentelemetry.io/otel/trace"

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

// TestScrubSpans: a span's name, attributes, events and status are scrubbed on export.
func TestScrubSpans(t *testing.T) {
	r := scrub.New(canary, "[REDACTED]")
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	_, s := tp.Tracer("t").Start(context.Background(), "GET /"+canary)
	s.SetAttributes(attribute.String("url.path", "/x/"+canary), attribute.StringSlice("names", []string{"a", canary}), attribute.Int("n", 1))
	s.AddEvent("saw " + canary)
	s.SetStatus(codes.Error, "failed with "+canary)
	s.End()
	out := scrubSpans(r, rec.Ended())[0]
	if out.Name() != "GET /[REDACTED]" || out.Status().Description != "failed with [REDACTED]" || out.Events()[0].Name != "saw [REDACTED]" {
		t.Fatalf("name %q status %q event %q", out.Name(), out.Status().Description, out.Events()[0].Name)
	}
	for _, kv := range out.Attributes() {
		if v := kv.Value.Emit(); len(v) > 0 && contains(v, canary) {
			t.Fatalf("attribute %s = %s", kv.Key, v)
		}
	}
	if contains(rec.Ended()[0].Attributes()[0].Value.AsString(), "[REDACTED]") {
		t.Fatal("the recorded span itself was changed")
	}
}

// TestScrubSpansOnlyWhatHoldsASecret: a batch's clean spans are exported as they are, those of
// strings without an allocation (a string slice is read as a copy: the SDK has no other way);
// a span whose secret is only in an event's attribute or a link's is scrubbed
// too.
func TestScrubSpansOnlyWhatHoldsASecret(t *testing.T) {
	r := scrub.New(canary, "[REDACTED]")
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr := tp.Tracer("t")
	_, clean := tr.Start(context.Background(), "clean")
	clean.SetAttributes(attribute.String("capbroker.agent", "a"), attribute.Int("server.port", 443))
	clean.End()
	_, event := tr.Start(context.Background(), "event")
	event.AddEvent("e", oteltrace.WithAttributes(attribute.String("k", "v "+canary)))
	event.End()
	_, link := tr.Start(context.Background(), "link", oteltrace.WithLinks(oteltrace.Link{Attributes: []attribute.KeyValue{attribute.String("k", canary)}}))
	link.End()
	spans := rec.Ended()
	out := scrubSpans(r, slices.Clone(spans))
	if out[0] != spans[0] {
		t.Error("a span without a secret was wrapped")
	}
	if got := out[1].Events()[0].Attributes[0].Value.AsString(); got != "v [REDACTED]" {
		t.Errorf("event attribute %q", got)
	}
	if got := out[2].Links()[0].Attributes[0].Value.AsString(); got != "[REDACTED]" {
		t.Errorf("link attribute %q", got)
	}
	batch := spans[:1]
	if n := testing.AllocsPerRun(100, func() { scrubSpans(r, batch) }); n != 0 {
		t.Errorf("scrubbing a clean span made %v allocations", n)
	}
}

// TestScrubRecordsAndMetrics: a log record's body and attributes, and a metric point's
// attributes, are scrubbed.
func TestScrubRecordsAndMetrics(t *testing.T) {
	r := scrub.New(canary, "[REDACTED]")
	var got []sdklog.Record
	lp := sdklog.NewLoggerProvider(sdklog.WithProcessor(recordProcessor{&got}))
	var rec otellog.Record
	rec.SetBody(attribute.StringValue(`{"agent":"` + canary + `"}`))
	rec.AddAttributes(attribute.String("capbroker.agent", canary))
	lp.Logger("t").Emit(context.Background(), rec)
	scrubRecords(r, got)
	if b := got[0].Body().AsString(); b != `{"agent":"[REDACTED]"}` {
		t.Fatalf("body %s", b)
	}
	got[0].WalkAttributes(func(kv attribute.KeyValue) bool {
		if kv.Value.AsString() != "[REDACTED]" {
			t.Fatalf("attribute %v", kv)
		}
		return true
	})

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

type recordProcessor struct{ got *[]sdklog.Record }

func (p recordProcessor) OnEmit(_ context.Context, r *sdklog.Record) error {
	*p.got = append(*p.got, r.Clone())
	return nil
}
func (recordProcessor) Enabled(context.Context, sdklog.EnabledParameters) bool { return true }
func (recordProcessor) Shutdown(context.Context) error                         { return nil }
func (recordProcessor) ForceFlush(context.Context) error                       { return nil }

// TestAuditRecord: an audit event becomes one record: the line as body, the agent, request
// id and decision as attributes, the request's span as the record's.
func TestAuditRecord(t *testing.T) {
	var got []sdklog.Record
	lp := sdklog.NewLoggerProvider(sdklog.WithProcessor(recordProcessor{&got}))
	tel := &Telemetry{logger: lp.Logger("t")}
	ev := &audit.Event{RequestID: "r1", Agent: "a1", Decision: "deny",
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7"}
	tel.Audit(ev, []byte(`{"msg":"decision"}`+"\n"))
	tel.Audit(nil, []byte(`{"msg":"approval"}`+"\n"))
	var nilTel *Telemetry
	nilTel.Audit(ev, []byte("x\n")) // no telemetry: nothing, no panic
	if len(got) != 2 {
		t.Fatalf("%d records", len(got))
	}
	r := got[0]
	if r.Body().AsString() != `{"msg":"decision"}` || r.EventName() != "capbroker.decision" ||
		r.TraceID().String() != ev.TraceID || r.SpanID().String() != ev.SpanID {
		t.Fatalf("record: body %q event %q trace %s span %s", r.Body().AsString(), r.EventName(), r.TraceID(), r.SpanID())
	}
	attrs := map[string]string{}
	r.WalkAttributes(func(kv attribute.KeyValue) bool { attrs[string(kv.Key)] = kv.Value.AsString(); return true })
	if attrs["capbroker.agent"] != "a1" || attrs["capbroker.request_id"] != "r1" || attrs["capbroker.decision"] != "deny" {
		t.Fatalf("attributes %v", attrs)
	}
	if got[1].EventName() != "capbroker.approval" || got[1].TraceID().IsValid() {
		t.Fatalf("approval record: %q %s", got[1].EventName(), got[1].TraceID())
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// TestSampler: the broker, not the agent's traceparent, decides what is traced, before any
// span is made; a step follows its root.
func TestSampler(t *testing.T) {
	zero, tiny, one := 0.0, 1e-9, 1.0
	for name, c := range map[string]struct {
		ratio  *float64
		flags  oteltrace.TraceFlags
		traced bool
	}{
		"default, agent says not sampled":      {nil, 0, true},
		"ratio 1, agent says not sampled":      {&one, 0, true},
		"ratio 0, agent says sampled":          {&zero, oteltrace.FlagsSampled, false},
		"ratio near 0, agent says sampled":     {&tiny, oteltrace.FlagsSampled, false},
		"ratio near 0, agent says not sampled": {&tiny, 0, false},
	} {
		t.Run(name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithSpanProcessor(rec))
			tr := sampled(tp.Tracer("t"), c.ratio)
			tid, _ := oteltrace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
			sid, _ := oteltrace.SpanIDFromHex("00f067aa0ba902b7")
			parent := oteltrace.ContextWithRemoteSpanContext(context.Background(),
				oteltrace.NewSpanContext(oteltrace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: c.flags, Remote: true}))
			ctx, root := tr.Start(parent, "root")
			if root.IsRecording() != c.traced {
				t.Fatalf("root recording %v", root.IsRecording())
			}
			_, step := tr.Start(ctx, "step")
			step.End()
			root.End()
			if n := len(rec.Ended()); (c.traced && n != 2) || (!c.traced && n != 0) {
				t.Fatalf("%d spans recorded", len(rec.Ended()))
			}
		})
	}
	// Not drawn, a request costs no allocation.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler))
	tr := sampled(tp.Tracer("t"), &zero)
	if n := testing.AllocsPerRun(100, func() { tr.Start(context.Background(), "root") }); n != 0 {
		t.Errorf("a request not drawn made %v allocations", n)
	}
}
