package main

import (
	"testing"

	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	logspb "go.opentelemetry.io/proto/otlp/logs/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// TestSinkCounts: the sink counts the spans and the log records of an export without decoding
// it, across resources and scopes, with the other fields skipped.
func TestSinkCounts(t *testing.T) {
	res := &resourcepb.Resource{Attributes: []*commonpb.KeyValue{{Key: "service.name", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: "capbroker"}}}}}
	scope := &commonpb.InstrumentationScope{Name: "broker"}
	spans := func(n int) []*tracepb.Span {
		out := make([]*tracepb.Span, n)
		for i := range out {
			out[i] = &tracepb.Span{Name: "s", TraceId: make([]byte, 16), SpanId: make([]byte, 8), StartTimeUnixNano: 1}
		}
		return out
	}
	traces := &coltrace.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{
		{Resource: res, ScopeSpans: []*tracepb.ScopeSpans{{Scope: scope, Spans: spans(3)}, {Spans: spans(2)}}, SchemaUrl: "x"},
		{ScopeSpans: []*tracepb.ScopeSpans{{Spans: spans(4)}}},
	}}
	logs := &collogs.ExportLogsServiceRequest{ResourceLogs: []*logspb.ResourceLogs{
		{Resource: res, ScopeLogs: []*logspb.ScopeLogs{{Scope: scope, LogRecords: []*logspb.LogRecord{{EventName: "a"}, {}}}}},
	}}
	s := &otlpSink{}
	c := countingCodec{s}
	for _, m := range []proto.Message{traces, logs, &coltrace.ExportTraceServiceRequest{}} {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Unmarshal(b, proto.Clone(m)); err != nil {
			t.Fatal(err)
		}
	}
	if s.spans != 9 || s.records != 2 {
		t.Fatalf("counted %d spans, %d records", s.spans, s.records)
	}
	if err := c.Unmarshal([]byte{0x0a, 0x05, 0x12}, &coltrace.ExportTraceServiceRequest{}); err == nil {
		t.Fatal("a truncated export was taken")
	}
}
