package broker

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/credentials"
)

// rotatingSecrets is a credential source whose value the test changes.
type rotatingSecrets struct {
	mu  sync.Mutex
	cur string
}

func (s *rotatingSecrets) set(v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur = v
}

func (s *rotatingSecrets) Get(context.Context, string) (credentials.Secret, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return credentials.NewSecret(s.cur), nil
}

// Known is what a store remembers: only the current value (the registry must remember the rest).
func (s *rotatingSecrets) Known(string) []credentials.Secret {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == "" {
		return nil
	}
	return []credentials.Secret{credentials.NewSecret(s.cur)}
}

// TestResponseScrubberFollowsRotation: a host's responses are scrubbed of every value the
// broker has sent it, from the request that first sends it on, the previous ones too after a
// rotation and after a reload that drops the credential; a host nothing was sent for gets no
// patterns, and the Replacer is reused while nothing changes.
func TestResponseScrubberFollowsRotation(t *testing.T) {
	src := &rotatingSecrets{}
	cfg := testConfig(t)
	br, tun := testBroker(t, cfg, Deps{Policy: fixedDecision{policy.Decision{Allow: true, Credentials: []string{"openai"}}}, Secrets: src},
		memoryUpstream{}, "api.openai.com")
	send := func() {
		t.Helper()
		r := httptest.NewRequest(http.MethodGet, "/v1/models", nil)
		r.Host = "api.openai.com"
		w := httptest.NewRecorder()
		br.serveTunnel(w, r, tun)
		if w.Code != http.StatusOK {
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
	redacts := func(host, v string) bool {
		r := br.gen.Load().responseScrubber(host)
		return r.String(v) != v
	}
	if redacts("api.openai.com", "sk-rot-one-0123456789") {
		t.Error("a value never read is scrubbed")
	}
	src.set("sk-rot-one-0123456789")
	send()
	first := br.gen.Load().known.Scrubber("api.openai.com") // what responseScrubber follows
	if !redacts("api.openai.com", "sk-rot-one-0123456789") {
		t.Fatal("the credentialed host's responses are not scrubbed of the value it was sent")
	}
	send()
	if br.gen.Load().known.Scrubber("api.openai.com") != first {
		t.Error("the same values built a second Replacer")
	}
	src.set("sk-rot-two-0123456789")
	send()
	if !redacts("api.openai.com", "sk-rot-two-0123456789") || !redacts("api.openai.com", "sk-rot-one-0123456789") {
		t.Error("after rotation, the new or the previous value is not redacted")
	}
	if !br.gen.Load().responseScrubber("unrelated.example").Empty() {
		t.Error("a host nothing was sent for got patterns")
	}

	// A reload that removes the credential, with a store that never read it: what was sent
	// is still known.
	next := testConfig(t)
	next.Credentials = nil
	next.SetDefaults()
	if err := br.Reload(next, &rotatingSecrets{}); err != nil {
		t.Fatal(err)
	}
	if !redacts("api.openai.com", "sk-rot-two-0123456789") || !redacts("api.openai.com", "sk-rot-one-0123456789") {
		t.Error("a reload that removed the credential forgot its values")
	}
}
