package broker

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/broker/telemetry"
	"github.com/capbroker/capbroker/policies"
)

// BenchmarkPipelineTraced is BenchmarkPipeline/full with every request traced into a tracer that
// drops the ended traces: what the spans cost the request itself (their
// export runs on goroutines of its own).
func BenchmarkPipelineTraced(b *testing.B) {
	e, err := policy.New(context.Background(), policies.FS)
	if err != nil {
		b.Fatal(err)
	}
	br, tun := testBroker(b, testConfig(b), Deps{Policy: e, Secrets: benchSecrets{}, Tracer: dropTraces{}}, memoryUpstream{}, "api.openai.com")
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

// dropTraces traces every request and drops the ended traces.
type dropTraces struct{}

func (dropTraces) Start() *telemetry.Trace { return telemetry.NewTrace() }
func (dropTraces) End(*telemetry.Trace)    {}

// recordTraces traces every request and keeps the ended traces.
type recordTraces struct {
	mu    sync.Mutex
	ended []*telemetry.Trace
}

func (r *recordTraces) Start() *telemetry.Trace { return telemetry.NewTrace() }
func (r *recordTraces) End(tr *telemetry.Trace) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended = append(r.ended, tr)
}

func (r *recordTraces) Ended() []*telemetry.Trace {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ended
}
