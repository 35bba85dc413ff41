package broker

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

type credentialState map[string]string

func (c credentialState) NotReady() map[string]string { return c }

type policyState string

func (p policyState) Revision() string { return string(p) }

// TestReadyz: ready only with a policy loaded and every credential readable; each missing part
// is named.
func TestReadyz(t *testing.T) {
	cases := map[string]struct {
		creds  credentialState
		policy policyState
		status int
		want   map[string]any
	}{
		"ready":         {nil, "r1", 200, map[string]any{"status": "ready", "policy_revision": "r1"}},
		"no policy":     {nil, "", 503, map[string]any{"status": "not ready", "policy": "no policy loaded yet"}},
		"no credential": {credentialState{"openai": "OPENAI_KEY is not set"}, "r1", 503, map[string]any{"status": "not ready", "policy_revision": "r1", "credentials": map[string]any{"openai": "OPENAI_KEY is not set"}}},
		"neither": {credentialState{"openai": "OPENAI_KEY is not set"}, "", 503, map[string]any{"status": "not ready", "policy": "no policy loaded yet",
			"credentials": map[string]any{"openai": "OPENAI_KEY is not set"}}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			w := httptest.NewRecorder()
			AdminHandler(NewMetrics(nil), c.creds, c.policy).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			var got map[string]any
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if w.Code != c.status || !jsonEqual(got, c.want) {
				t.Fatalf("%d %v, want %d %v", w.Code, got, c.status, c.want)
			}
		})
	}
}

func jsonEqual(a, b map[string]any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}
