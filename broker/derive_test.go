package broker

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/broker/upstream"
	"github.com/capbroker/capbroker/credentials"
)

// fakeMinter mints tok-1, tok-2, ... and records the scopes it was asked for and the tokens
// rejected.
type fakeMinter struct {
	mu       sync.Mutex
	n        int
	cur      string
	scopes   []credentials.Scope
	rejected []string
	err      error
}

func (m *fakeMinter) Token(_ context.Context, scope credentials.Scope) (credentials.Secret, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return credentials.Secret{}, m.err
	}
	m.scopes = append(m.scopes, scope)
	if m.cur == "" {
		m.n++
		m.cur = fmt.Sprintf("minted-canary-tok-%d", m.n)
	}
	return credentials.NewSecret(m.cur), nil
}

func (m *fakeMinter) Reject(tok credentials.Secret) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rejected = append(m.rejected, tok.Reveal())
	if tok.Reveal() == m.cur {
		m.cur = ""
	}
}

func (m *fakeMinter) Status() credentials.DerivedStatus {
	return credentials.DerivedStatus{Ready: true}
}
func (m *fakeMinter) Close(context.Context) error { return nil }

// fakeSigner sets a signature header made from what the request looks like when it signs.
type fakeSigner struct{}

func (fakeSigner) Sign(_ context.Context, r *http.Request) error {
	r.Header.Set("Authorization", "SIGNED accept-encoding="+r.Header.Get("Accept-Encoding"))
	return nil
}

type derivedSecrets struct {
	minter *fakeMinter
}

func (d derivedSecrets) Get(context.Context, string) (credentials.Secret, error) {
	return credentials.NewSecret("static-canary-secret"), nil
}

// Known is what a store holds: no minted token (the broker records those as it sends them).
func (d derivedSecrets) Known(name string) []credentials.Secret {
	if name == "minted" {
		return nil
	}
	return []credentials.Secret{credentials.NewSecret("static-canary-secret")}
}

func (d derivedSecrets) Minter(name string) credentials.Minter {
	if name == "minted" {
		return d.minter
	}
	return nil
}

func (d derivedSecrets) Signer(name string) credentials.Signer {
	if name == "signed" {
		return fakeSigner{}
	}
	return nil
}

// fixedDecision grants what the test says.
type fixedDecision struct{ d policy.Decision }

func (f fixedDecision) Decide(context.Context, *policy.Input) (policy.Decision, error) {
	d := f.d
	d.Allow, d.Revision = true, "test"
	return d, nil
}

// tokenUpstream answers 401 to the tokens in reject, else 200 with the Authorization it
// got echoed in the body (an upstream reflecting a credential).
type tokenUpstream struct {
	mu     sync.Mutex
	auths  []string
	reject map[string]bool
}

func (u *tokenUpstream) RoundTrip(r *http.Request, _ upstream.Pool) (*http.Response, error) {
	body, _ := io.ReadAll(r.Body)
	auth := r.Header.Get("Authorization")
	u.mu.Lock()
	u.auths = append(u.auths, auth+" body="+string(body))
	u.mu.Unlock()
	code := 200
	if u.reject[strings.TrimPrefix(auth, "Bearer ")] {
		code = 401
	}
	text := "you sent: " + auth
	return &http.Response{StatusCode: code, ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{},
		Body: io.NopCloser(strings.NewReader(text)), ContentLength: int64(len(text)), Request: r}, nil
}

func (*tokenUpstream) Prepare(string, bool)  {}
func (*tokenUpstream) CloseIdleConnections() {}

func derivedBroker(t *testing.T, d policy.Decision, m *fakeMinter, up upstreamClient) (*Broker, *tunnel) {
	t.Helper()
	cfg := testConfig(t)
	hosts := []string{"api.example.test"}
	cfg.Credentials = append(cfg.Credentials,
		config.Credential{Name: "minted", Hosts: hosts, Source: config.Source{Env: "X"}, OAuth2: &config.OAuth2{TokenURL: "https://auth.example.test/token", ClientID: "c"}},
		config.Credential{Name: "signed", Hosts: hosts, Source: config.Source{Env: "X"}, AWSSigV4: &config.AWSSigV4{}},
		config.Credential{Name: "static", Hosts: hosts, Source: config.Source{Env: "X"}, Inject: config.Inject{Header: "X-Key", Value: "{{secret}}"}},
	)
	return testBroker(t, cfg, Deps{Policy: fixedDecision{d}, Secrets: derivedSecrets{m}}, up, "api.example.test")
}

func derivedRequest(br *Broker, tun *tunnel, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/v1/things", strings.NewReader(body))
	r.Host = "api.example.test"
	r.Header.Set("Authorization", "Bearer agent-placeholder")
	r.Header.Set("Accept-Encoding", "gzip")
	w := httptest.NewRecorder()
	br.serveTunnel(w, r, tun)
	return w
}

// TestMintedToken: a minted credential is asked for the scope the policy granted, its token is
// injected by the credential's inject rule (Bearer by default), and scrubbed from the response.
func TestMintedToken(t *testing.T) {
	m := &fakeMinter{}
	up := &tokenUpstream{}
	scope := map[string]any{"repositories": []any{"r1"}}
	br, tun := derivedBroker(t, policy.Decision{Credentials: []string{"minted"}, Scopes: map[string]map[string]any{"minted": scope}}, m, up)
	w := derivedRequest(br, tun, `{}`)
	if w.Code != 200 {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if len(up.auths) != 1 || !strings.HasPrefix(up.auths[0], "Bearer minted-canary-tok-1 ") {
		t.Fatalf("upstream saw %q", up.auths)
	}
	if len(m.scopes) != 1 || fmt.Sprint(m.scopes[0]) != fmt.Sprint(credentials.Scope(scope)) {
		t.Fatalf("minter asked for scopes %v", m.scopes)
	}
	if strings.Contains(w.Body.String(), "minted-canary") || !strings.Contains(w.Body.String(), redacted) {
		t.Fatalf("agent got %q", w.Body)
	}
}

// TestMintedTokenRejectedIsRetriedOnce: an upstream's 401 retires the token; the request is
// sent once more, with its body, with a fresh token; a second 401 goes to the agent.
func TestMintedTokenRejectedIsRetriedOnce(t *testing.T) {
	m := &fakeMinter{}
	up := &tokenUpstream{reject: map[string]bool{"minted-canary-tok-1": true}}
	br, tun := derivedBroker(t, policy.Decision{Credentials: []string{"minted"}}, m, up)
	w := derivedRequest(br, tun, `{"a":1}`)
	if w.Code != 200 {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	want := []string{`Bearer minted-canary-tok-1 body={"a":1}`, `Bearer minted-canary-tok-2 body={"a":1}`}
	if fmt.Sprint(up.auths) != fmt.Sprint(want) || fmt.Sprint(m.rejected) != "[minted-canary-tok-1]" {
		t.Fatalf("upstream saw %q; rejected %v", up.auths, m.rejected)
	}
	if strings.Contains(w.Body.String(), "minted-canary") {
		t.Fatalf("agent got %q", w.Body)
	}

	up.reject["minted-canary-tok-3"], up.reject["minted-canary-tok-2"] = true, true
	up.auths = nil
	if w := derivedRequest(br, tun, `{}`); w.Code != 401 || len(up.auths) != 2 {
		t.Fatalf("status %d after %d tries, want the second 401 passed back", w.Code, len(up.auths))
	}
}

// TestSignedLast: a signing credential signs the request as it is sent, after the broker's
// own changes (here: the encoding offer removed for scrubbing).
func TestSignedLast(t *testing.T) {
	up := &tokenUpstream{}
	br, tun := derivedBroker(t, policy.Decision{Credentials: []string{"signed"}}, &fakeMinter{}, up)
	if w := derivedRequest(br, tun, `{}`); w.Code != 200 {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if len(up.auths) != 1 || !strings.HasPrefix(up.auths[0], "SIGNED accept-encoding= ") {
		t.Fatalf("upstream saw %q", up.auths)
	}
}

// TestScopeRefusals: a scope on a credential that cannot be narrowed denies; a minter that
// cannot mint answers 503 and sends nothing.
func TestScopeRefusals(t *testing.T) {
	up := &tokenUpstream{}
	br, tun := derivedBroker(t, policy.Decision{Credentials: []string{"static"}, Scopes: map[string]map[string]any{"static": {"x": 1.0}}}, &fakeMinter{}, up)
	if w := derivedRequest(br, tun, `{}`); w.Code != 403 || !strings.Contains(w.Body.String(), "cannot be narrowed") {
		t.Fatalf("scoped static credential: %d %s", w.Code, w.Body)
	}
	m := &fakeMinter{err: fmt.Errorf("%w: token endpoint answered 500", credentials.ErrUnavailable)}
	br, tun = derivedBroker(t, policy.Decision{Credentials: []string{"minted"}}, m, up)
	if w := derivedRequest(br, tun, `{}`); w.Code != 503 || !strings.Contains(w.Body.String(), "credential_unavailable") {
		t.Fatalf("minter down: %d %s", w.Code, w.Body)
	}
	if len(up.auths) != 0 {
		t.Fatalf("upstream saw %q", up.auths)
	}
}
