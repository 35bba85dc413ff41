package broker

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/broker/policy"
)

// TestMintedTokenRejectedRetriedWithoutBody: a request without a body is sent again after a
// 401 although its Body is not http.NoBody, as HTTP/2 servers hand such requests over (an
// empty body, ContentLength 0).
func TestMintedTokenRejectedRetriedWithoutBody(t *testing.T) {
	m := &fakeMinter{}
	up := &tokenUpstream{reject: map[string]bool{"minted-canary-tok-1": true}}
	br, tun := derivedBroker(t, policy.Decision{Credentials: []string{"minted"}}, m, up)
	r := httptest.NewRequest(http.MethodGet, "/v1/things", nil)
	r.Body, r.ContentLength = io.NopCloser(strings.NewReader("")), 0
	r.Host = "api.example.test"
	w := httptest.NewRecorder()
	br.serveTunnel(w, r, tun)
	if w.Code != 200 || len(up.auths) != 2 || !strings.HasPrefix(up.auths[1], "Bearer minted-canary-tok-2") {
		t.Fatalf("status %d, upstream saw %q: want the 401 retried with a fresh token", w.Code, up.auths)
	}
}
