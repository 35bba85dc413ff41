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
// in place of what the agent sent. A request to a host a credential is bound to, granted or
// not, goes without the headers that would let the upstream encode its response in a way the
// scrubber cannot read (the response is scrubbed either way); one to another host keeps them.
func TestGrantedRequestHeaders(t *testing.T) {
	cases := map[string]struct {
		full       bool   // the shipped policies, which grant the openai credential
		host       string // where the tunnel goes
		wantOffers bool
	}{
		"granted":             {full: true, host: "api.openai.com"},
		"bound, not granted":  {full: false, host: "api.openai.com"},
		"no credential bound": {full: false, host: "unbound.test", wantOffers: true},
	}
	for name, c := range cases {
		br, tun := benchBroker(t, c.full)
		tun.target = newTarget("https", c.host, 443)
		up := &recordingUpstream{}
		br.setTransport(up)
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader([]byte(`{"model":"gpt-4.1-mini"}`)))
		r.Host = c.host
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Authorization", "Bearer agent-supplied")
		r.Header.Add("Authorization", "Bearer another")
		r.Header.Set("Accept-Encoding", "gzip, br")
		r.Header.Set("Grpc-Accept-Encoding", "gzip")
		r.Header.Set("Sec-WebSocket-Extensions", "permessage-deflate")
		w := httptest.NewRecorder()
		br.serveTunnel(w, r, tun)
		if w.Code != http.StatusOK || up.got == nil {
			t.Fatalf("%s: status %d: %s", name, w.Code, w.Body)
		}
		h := up.got.Header
		offers := len(h.Values("Accept-Encoding")) + len(h.Values("Grpc-Accept-Encoding")) + len(h.Values("Sec-WebSocket-Extensions"))
		switch {
		case !c.wantOffers && offers != 0:
			t.Errorf("%s: went upstream offering encodings: %v", name, h)
		case c.wantOffers && offers != 3:
			t.Errorf("%s: lost its encoding offers: %v", name, h)
		case c.full && (len(h.Values("Authorization")) != 1 || h.Get("Authorization") != "Bearer "+benchSecret):
			t.Errorf("%s: Authorization upstream: %q, want the credential alone", name, h.Values("Authorization"))
		}
	}
}
