package broker

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/capbroker/capbroker/broker/upstream"
)

// recordingUpstream is memoryUpstream that keeps the last request it was sent, and its pool.
type recordingUpstream struct {
	memoryUpstream
	got  *http.Request
	pool upstream.Pool
}

func (u *recordingUpstream) RoundTrip(r *http.Request, pool upstream.Pool) (*http.Response, error) {
	u.got, u.pool = r, pool
	return u.memoryUpstream.RoundTrip(r, pool)
}

// TestGrantedRequestHeaders: a request granted a credential goes upstream with the credential
// in place of what the agent sent, and without the headers that would let the upstream encode
// its response in a way the scrubber cannot read; a request without one keeps them.
func TestGrantedRequestHeaders(t *testing.T) {
	for _, full := range []bool{true, false} {
		br, tun := benchBroker(t, full)
		up := &recordingUpstream{}
		br.transport = up
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader([]byte(`{"model":"gpt-4.1-mini"}`)))
		r.Host = "api.openai.com"
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Authorization", "Bearer agent-supplied")
		r.Header.Add("Authorization", "Bearer another")
		r.Header.Set("Accept-Encoding", "gzip, br")
		r.Header.Set("Grpc-Accept-Encoding", "gzip")
		r.Header.Set("Sec-WebSocket-Extensions", "permessage-deflate")
		w := httptest.NewRecorder()
		br.serveTunnel(w, r, tun)
		if w.Code != http.StatusOK || up.got == nil {
			t.Fatalf("full %v: status %d: %s", full, w.Code, w.Body)
		}
		h := up.got.Header
		offers := len(h.Values("Accept-Encoding")) + len(h.Values("Grpc-Accept-Encoding")) + len(h.Values("Sec-WebSocket-Extensions"))
		switch {
		case full && offers != 0:
			t.Errorf("a request carrying a credential went upstream offering encodings: %v", h)
		case full && (len(h.Values("Authorization")) != 1 || h.Get("Authorization") != "Bearer "+benchSecret):
			t.Errorf("Authorization upstream: %q, want the credential alone", h.Values("Authorization"))
		case !full && offers != 3:
			t.Errorf("a request without a credential lost its encoding offers: %v", h)
		}
	}
}
