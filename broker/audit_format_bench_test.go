package broker

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/audit/ocsf"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/policies"
)

// BenchmarkPipelineAuditFormat is BenchmarkPipeline's "full" request with the audit log in
// each format: what audit.format: ocsf costs a request, all of the pipeline around it.
func BenchmarkPipelineAuditFormat(b *testing.B) {
	for _, format := range []string{"json", "ocsf"} {
		b.Run(format, func(b *testing.B) {
			o := audit.Options{Instance: "bench"}
			if format == "ocsf" {
				o.Encoder = ocsf.New(ocsf.Options{ProductVersion: "bench"})
			}
			log := audit.NewWith(io.Discard, o)
			b.Cleanup(log.Close)
			e, err := policy.New(context.Background(), policies.FS)
			if err != nil {
				b.Fatal(err)
			}
			br, tun := testBroker(b, testConfig(b), Deps{Policy: e, Secrets: benchSecrets{}, Audit: log}, memoryUpstream{}, "api.openai.com")
			body := []byte(`{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"Say ok."}],"max_tokens":8}`)
			b.ReportAllocs()
			for b.Loop() {
				r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
				r.Host = "api.openai.com"
				r.Header.Set("Content-Type", "application/json")
				w := httptest.NewRecorder()
				br.serveTunnel(w, r, tun)
				if w.Code != http.StatusOK {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			}
		})
	}
}
