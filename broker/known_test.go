package broker

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/inject"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/credentials"
)

// TestMintedTokensStayKnownOrNoneIsSent: an upstream that refuses every token makes the broker
// mint again and again; every token it sent stays scrubbed from the host's responses, and when
// the registry could only take one more by forgetting one, the request is refused with 503
// credential_unavailable instead, and nothing is sent.
func TestMintedTokensStayKnownOrNoneIsSent(t *testing.T) {
	m := &fakeMinter{}
	up := &tokenUpstream{reject: map[string]bool{}}
	for i := 1; i <= 20; i++ {
		up.reject[fmt.Sprintf("minted-canary-tok-%d", i)] = true
	}
	cfg := testConfig(t)
	cfg.Credentials = append(cfg.Credentials, config.Credential{Name: "minted", Hosts: []string{"api.example.test"},
		Source: config.Source{Env: "X"}, OAuth2: &config.OAuth2{TokenURL: "https://auth.example.test/token", ClientID: "c"}})
	br, tun := testBroker(t, cfg, Deps{Policy: fixedDecision{policy.Decision{Credentials: []string{"minted"}}},
		Secrets: derivedSecrets{m}, Known: inject.NewKnown(inject.KnownOptions{Max: 5})}, up, "api.example.test")

	refused := false
	for range 10 {
		w := derivedRequest(br, tun, "")
		if w.Code == 503 {
			if !strings.Contains(w.Body.String(), "credential_unavailable") {
				t.Fatalf("refusal: %s", w.Body)
			}
			refused = true
			break
		}
		if w.Code != 401 {
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
	if !refused {
		t.Fatal("the broker kept minting past the registry's bound")
	}
	tokens := map[string]bool{}
	for _, a := range up.auths {
		tokens[strings.Fields(a)[1]] = true
	}
	sent := len(tokens)
	if sent == 0 || sent > 5 {
		t.Fatalf("%d tokens sent with a bound of 5", sent)
	}
	scrub := br.gen.Load().responseScrubber("api.example.test")
	for i := 1; i <= sent; i++ {
		tok := fmt.Sprintf("minted-canary-tok-%d", i)
		if out := scrub.String("echo " + tok); strings.Contains(out, tok) {
			t.Errorf("token %d, sent, is no longer scrubbed", i)
		}
	}
	before := len(up.auths)
	if w := derivedRequest(br, tun, ""); w.Code != 503 || len(up.auths) != before {
		t.Errorf("again: %d, %d sent (want 503 and nothing sent)", w.Code, len(up.auths)-before)
	}
}

// namedSecrets gives each credential its own value: "value-of-NAME-0123456789".
type namedSecrets struct{}

func (namedSecrets) Get(_ context.Context, name string) (credentials.Secret, error) {
	return credentials.NewSecret("value-of-" + name + "-0123456789"), nil
}

func (s namedSecrets) Known(name string) []credentials.Secret {
	v, _ := s.Get(context.Background(), name)
	return []credentials.Secret{v}
}

// TestApprovalCardFreeOfEveryValue: what a person is shown about a request to one host is
// cleaned of the values of every configured credential, bound to that host or not, sent or
// not.
func TestApprovalCardFreeOfEveryValue(t *testing.T) {
	br, _ := testBroker(t, testConfig(t), Deps{Policy: allowAll{}, Secrets: namedSecrets{}}, memoryUpstream{}, "api.openai.com")
	clean := br.gen.Load().secretFree("api.openai.com")
	for _, name := range []string{"openai", "github", "anthropic"} {
		v := "value-of-" + name + "-0123456789"
		if out := clean("body with " + v + " in it"); strings.Contains(out, v) {
			t.Errorf("the approval card shows %s's value: %s", name, out)
		}
	}
}
