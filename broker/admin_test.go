package broker

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

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

type mintedState map[string]credentials.CredentialStatus

func (m mintedState) Status() map[string]credentials.CredentialStatus { return m }

// TestReadyzMinted: a derived credential's token expiry and last refresh are in /readyz and
// the metrics.
func TestReadyzMinted(t *testing.T) {
	until, at := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC), time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	ready := mintedState{"gh_app": {Ready: true, ValidUntil: until, LastRefresh: at}, "openai": {Ready: true}}
	m := NewMetrics(nil)
	m.watch(func() int { return 0 }, func() int64 { return 0 }, func() int { return 0 }, func() Secrets { return readySecrets{ready} })
	h := AdminHandler(m, ready, policyState("r1"))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	var body struct {
		Minted map[string]map[string]string `json:"credentials_minted"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if got := body.Minted["gh_app"]; len(body.Minted) != 1 || got["valid_until"] != "2026-12-04T10:00:00Z" || got["last_refresh"] != "2026-12-04T09:00:00Z" {
		t.Fatalf("credentials_minted: %v", body.Minted)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{
		`capbroker_credential_valid_until_seconds{credential="gh_app"} ` + strconv.FormatFloat(float64(until.Unix()), 'g', -1, 64),
		`capbroker_credential_last_refresh_seconds{credential="gh_app"} ` + strconv.FormatFloat(float64(at.Unix()), 'g', -1, 64),
		`capbroker_credential_ready{credential="openai"} 1`,
	} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(rec.Body.String(), `valid_until_seconds{credential="openai"}`) {
		t.Error("a static credential has a token expiry")
	}
}

// readySecrets is a Secrets whose Status is the test's.
type readySecrets struct{ mintedState }

func (readySecrets) Get(context.Context, string) (credentials.Secret, error) {
	return credentials.Secret{}, nil
}
func (readySecrets) Known(string) []credentials.Secret { return nil }
