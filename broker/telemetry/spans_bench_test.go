package telemetry

import (
	"context"
	"strconv"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/scrub"
)

// BenchmarkTraceExport is the export goroutine's work per request traced: a batch of 512
// Traces (seven spans each) encoded as one OTLP request, scrubbed (the send is left out).
func BenchmarkTraceExport(b *testing.B) {
	r := scrub.New(canary, "[REDACTED]")
	e, err := newTraceExporter(func(context.Context, []byte) error { return nil }, resource.Empty(), "s")
	if err != nil {
		b.Fatal(err)
	}
	batch := make([]*Trace, 512)
	now := time.Now()
	for i := range batch {
		tr := NewTrace()
		tr.Parent = NewSpanID()
		tr.Root.Name, tr.Root.Start, tr.Root.End = "capbroker.request", now, now
		for _, s := range []string{"identity", "policy", "credentials"} {
			tr.Step(s).Finish()
		}
		tr.Upstream = Span{ID: NewSpanID(), Name: "chat gpt-4.1-mini", Start: now, End: now}
		tr.Scrub = Span{ID: NewSpanID(), Name: "scrub", Start: now, End: now}
		tr.Event = audit.Event{RequestID: "req-" + strconv.Itoa(i), Agent: "agent", Phase: "request",
			Decision: "allow", Reason: "allowed by rule llm", Credentials: []string{"openai"}, Method: "POST", Host: "api.openai.com", Port: 443,
			Path: "/v1/chat/completions", Status: 200, Mode: "explicit", LLM: &audit.LLMCall{Provider: "openai", Model: "gpt-4.1-mini", TokensIn: 7, TokensOut: 3}}
		batch[i] = tr
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := e.export(context.Background(), r, batch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/trace")
}
