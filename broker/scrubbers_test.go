package broker

import (
	"context"
	"sync"
	"testing"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/credentials"
)

func TestScrubbersFollowTheSecrets(t *testing.T) {
	s := newScrubbers([]config.Credential{{Name: "a"}, {Name: "b"}})
	check := func(name string, got interface{ String(string) string }, secret string) {
		t.Helper()
		if out := got.String("x " + secret + " y"); out != "x "+redacted+" y" {
			t.Errorf("%s: %q not redacted: %q", name, secret, out)
		}
	}
	first := s.get("a", []string{"sk-one"})
	check("first", first, "sk-one")
	if again := s.get("a", []string{"sk-one"}); again != first {
		t.Error("the same secrets built a second Replacer")
	}
	rotated := s.get("a", []string{"sk-two", "sk-one"})
	check("rotated", rotated, "sk-two")
	check("rotated, the previous secret", rotated, "sk-one")
	if s.get("a", []string{"sk-one"}) == rotated {
		t.Error("a Replacer was reused for other secrets")
	}
	check("another credential", s.get("b", []string{"sk-b"}), "sk-b")
	check("a credential not configured", s.get("c", []string{"sk-c"}), "sk-c")
	if s.get("a", []string{"sk-one"}) == s.get("b", []string{"sk-one"}) {
		t.Error("two credentials share an entry")
	}
}

// rotatingSecrets is a credential source whose known values the test changes.
type rotatingSecrets struct {
	mu    sync.Mutex
	known []string
}

func (s *rotatingSecrets) set(vals ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.known = vals
}

func (s *rotatingSecrets) Get(context.Context, string) (credentials.Secret, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return credentials.NewSecret(s.known[0]), nil
}

func (s *rotatingSecrets) Known(string) []credentials.Secret {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []credentials.Secret
	for _, v := range s.known {
		out = append(out, credentials.NewSecret(v))
	}
	return out
}

// TestResponseScrubberFollowsRotation: the Replacer of a credentialed host is reused while the
// known values stay the same, and redacts a new value, an added one and not a dropped one as
// soon as the source knows of it.
func TestResponseScrubberFollowsRotation(t *testing.T) {
	src := &rotatingSecrets{known: []string{"sk-rot-one-0123456789"}}
	br, _ := testBroker(t, testConfig(t), Deps{Policy: allowAll{}, Secrets: src}, memoryUpstream{}, "api.openai.com")
	g := br.gen.Load()
	redacts := func(r interface{ String(string) string }, v string) bool { return r.String(v) != v }
	first := g.responseScrubber("api.openai.com")
	if first.Empty() || !redacts(first, "sk-rot-one-0123456789") {
		t.Fatal("the credentialed host's responses are not scrubbed of its secret")
	}
	if g.responseScrubber("api.openai.com") != first {
		t.Error("the same secrets built a second Replacer")
	}
	src.set("sk-rot-two-0123456789", "sk-rot-one-0123456789")
	rotated := g.responseScrubber("api.openai.com")
	if !redacts(rotated, "sk-rot-two-0123456789") || !redacts(rotated, "sk-rot-one-0123456789") {
		t.Error("after rotation, the new or the previous value is not redacted")
	}
	src.set("sk-rot-two-0123456789")
	dropped := g.responseScrubber("api.openai.com")
	if !redacts(dropped, "sk-rot-two-0123456789") || redacts(dropped, "sk-rot-one-0123456789") {
		t.Error("the Replacer does not follow a value dropped from the known ones")
	}
	if !g.responseScrubber("unrelated.example").Empty() {
		t.Error("a host with no credential got patterns")
	}
}
