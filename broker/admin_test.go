package broker

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/credentials"
)

// credentialState maps a name to its error: "" for ready, "stale: ..." for ready from the
// cache while the source fails, else unavailable.
type credentialState map[string]string

func (c credentialState) Status() map[string]credentials.CredentialStatus {
	out := map[string]credentials.CredentialStatus{}
	for name, e := range c {
		msg, stale := strings.CutPrefix(e, "stale: ")
		out[name] = credentials.CredentialStatus{Ready: e == "" || stale, Error: msg}
	}
	return out
}

type policyState string

func (p policyState) Revision() string { return string(p) }

// TestReadyz: not ready (503) only without a policy; an unavailable credential or a failed
// policy reload is reported as "degraded" with 200, and with 503 under ?strict.
func TestReadyz(t *testing.T) {
	some := credentialState{"openai": "OPENAI_KEY is not set", "github": ""}
	cases := map[string]struct {
		creds     credentialState
		policy    policyState
		reloadErr error
		query     string
		status    int
		want      map[string]any
	}{
		"ready":          {credentialState{"github": ""}, "r1", nil, "", 200, map[string]any{"status": "ready", "policy_revision": "r1", "credentials_ready": []string{"github"}}},
		"no credentials": {nil, "r1", nil, "?strict", 200, map[string]any{"status": "ready", "policy_revision": "r1", "credentials_ready": []string{}}},
		"no policy":      {nil, "", nil, "", 503, map[string]any{"status": "not ready", "policy": "no policy loaded yet", "credentials_ready": []string{}}},
		"one credential unavailable": {some, "r1", nil, "", 200, map[string]any{"status": "degraded", "policy_revision": "r1",
			"credentials_ready": []string{"github"}, "credentials": map[string]any{"openai": "OPENAI_KEY is not set"}}},
		"every credential unavailable": {credentialState{"openai": "down"}, "r1", nil, "", 200, map[string]any{"status": "degraded", "policy_revision": "r1",
			"credentials_ready": []string{}, "credentials": map[string]any{"openai": "down"}}},
		"strict": {some, "r1", nil, "?strict", 503, map[string]any{"status": "not ready", "policy_revision": "r1",
			"credentials_ready": []string{"github"}, "credentials": map[string]any{"openai": "OPENAI_KEY is not set"}}},
		"reload failed": {nil, "r1", errors.New("broker.rego:3: rego_parse_error"), "", 200, map[string]any{"status": "degraded", "policy_revision": "r1",
			"policy_reload_error": "broker.rego:3: rego_parse_error", "credentials_ready": []string{}}},
		"stale": {credentialState{"github": "stale: connection refused"}, "r1", nil, "?strict", 200, map[string]any{"status": "ready", "policy_revision": "r1",
			"credentials_ready": []string{"github"}, "credentials_stale": map[string]any{"github": "connection refused"}}},
		"neither": {some, "", nil, "", 503, map[string]any{"status": "not ready", "policy": "no policy loaded yet",
			"credentials_ready": []string{"github"}, "credentials": map[string]any{"openai": "OPENAI_KEY is not set"}}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			m := NewMetrics(nil)
			if c.reloadErr != nil {
				m.PolicyReload(c.reloadErr)
			}
			w := httptest.NewRecorder()
			AdminHandler(m, c.creds, c.policy).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz"+c.query, nil))
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

// TestReadyzAfterGoodReload: a reload that works again clears the reported failure.
func TestReadyzAfterGoodReload(t *testing.T) {
	m := NewMetrics(nil)
	m.PolicyReload(errors.New("bad"))
	m.PolicyReload(nil)
	w := httptest.NewRecorder()
	AdminHandler(m, credentialState{}, policyState("r2")).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz?strict", nil))
	if w.Code != 200 || strings.Contains(w.Body.String(), "reload") {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
}

func jsonEqual(a, b map[string]any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}
