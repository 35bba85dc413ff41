package broker

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace"

	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/policies"
)

// BenchmarkPipelineTraced is BenchmarkPipeline/full with every request traced by the SDK into
// a processor that drops the ended spans: what the spans cost the request itself (their
// export runs on goroutines of its own).
func BenchmarkPipelineTraced(b *testing.B) {
	e, err := policy.New(context.Background(), policies.FS)
	if err != nil {
		b.Fatal(err)
	}
	tp := trace.NewTracerProvider(trace.WithSampler(trace.AlwaysSample()), trace.WithSpanProcessor(dropSpans{}))
	br, tun := testBroker(b, testConfig(b), Deps{Policy: e, Secrets: benchSecrets{}, Tracer: tp.Tracer("bench")}, memoryUpstream{}, "api.openai.com")
	body := []byte(`{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"Say ok."}],"max_tokens":8}`)
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
		r.Host = "api.openai.com"
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
		w := httptest.NewRecorder()
		br.serveTunnel(w, r, tun)
		if w.Code != http.StatusOK {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
}

type dropSpans struct{}

func (dropSpans) OnStart(context.Context, trace.ReadWriteSpan) {}
func (dropSpans) OnEnd(trace.ReadOnlySpan)                     {}
func (dropSpans) Shutdown(context.Context) error               { return nil }
func (dropSpans) ForceFlush(context.Context) error             { return nil }
