package broker

import (
	"testing"

	"github.com/capbroker/capbroker/broker/config"
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
