package telemetry

import (
	"strconv"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/scrub"
)

// BenchmarkTraceExport is the work per request traced of writing its spans (seven), scrubbed,
// as the Tracer does when the request ends, and of joining a batch of 512 of them in one OTLP
// request, as the export goroutine does (the send is left out).
func BenchmarkTraceExport(b *testing.B) {
	r := scrub.New(canary, "[REDACTED]")
	e, err := newExporter(nil, resource.Empty(), "s")
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
	items := make([]encoded, len(batch))
	for b.Loop() {
		for i, tr := range batch {
			buf := getBuf()
			*buf = encodeTrace(*buf, r, tr)
			items[i] = encoded{b: buf, items: spanCount(tr)}
		}
		e.join(items)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/trace")
}
