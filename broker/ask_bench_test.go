package broker

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/capbroker/capbroker/broker/approvals"
)

// BenchmarkPipelineSlowSubscriber is BenchmarkPipeline/full with an event stream subscribed
// that never reads (a console in a browser tab that stalled): its buffer fills, its events are
// dropped, and the request path does not wait for it.
func BenchmarkPipelineSlowSubscriber(b *testing.B) {
	br, tun := benchBroker(b, true)
	hub := approvals.NewHub()
	sub := hub.Subscribe(approvals.SubscriberBuffer)
	br.audit.SetTap(hub.AuditTap)
	body := []byte(`{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"Say ok."}],"max_tokens":8}`)
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
		r.Host = "api.openai.com"
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("User-Agent", "bench/1")
		w := httptest.NewRecorder()
		br.serveTunnel(w, r, tun)
		if w.Code != http.StatusOK {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
	b.StopTimer()
	if len(sub.C) == 0 {
		b.Fatal("the subscriber was sent nothing")
	}
}
