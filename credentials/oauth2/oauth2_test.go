package oauth2

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/credentials"
	"github.com/capbroker/capbroker/credentials/oauth2/oauth2test"
	"github.com/capbroker/capbroker/internal/testkit"
)

// Canaries: the client secret and the private keys' PEM. None may appear in an error or a
// log line, nor may any token the stand-in issues (its prefixes).
const (
	canarySecret = "CANARY-client-secret-5f1e9a"
	canaryBody   = "CANARY-response-body-77d2c0"
)

// syncBuffer collects what goroutines write, for the test to read.
type syncBuffer = testkit.Buffer

// clock is a test clock that only moves when told.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// fixture is a stand-in, a clock and a log that the test checks for secrets at the end.
type fixture struct {
	t      *testing.T
	srv    *oauth2test.Server
	clock  *clock
	log    *syncBuffer
	extras []string // more secrets to look for (private keys, refresh tokens)
}

func newFixture(t *testing.T) *fixture {
	f := &fixture{t: t, srv: oauth2test.Start(t), clock: newClock(), log: &syncBuffer{}}
	t.Cleanup(func() { f.checkLog() })
	return f
}

func (f *fixture) deps(root string) Deps {
	return Deps{
		Root:       func(context.Context) (credentials.Secret, error) { return credentials.NewSecret(root), nil },
		HTTPClient: f.srv.HTTPClient(),
		Log:        zerolog.New(f.log),
		Now:        f.clock.now,
	}
}

// checkLog fails the test if the log holds a secret or a token.
func (f *fixture) checkLog() {
	f.t.Helper()
	noSecrets(f.t, "log", f.log.String(), f.extras...)
}

func noSecrets(t *testing.T, what, s string, extras ...string) {
	t.Helper()
	for _, c := range append([]string{canarySecret, canaryBody, oauth2test.AccessTokenPrefix, oauth2test.RefreshTokenPrefix, "PRIVATE KEY"}, extras...) {
		if c != "" && strings.Contains(s, c) {
			t.Errorf("%s holds a secret (%q): %s", what, c, s)
		}
	}
}

// callAPI uses tok on the stand-in's API and returns the status and the scopes it carries.
func (f *fixture) callAPI(tok credentials.Secret) (int, []string) {
	f.t.Helper()
	req, _ := http.NewRequest("GET", f.srv.APIURL+"data", nil)
	req.Header.Set("Authorization", "Bearer "+tok.Reveal())
	resp, err := f.srv.HTTPClient().Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct{ Scopes []string }
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body.Scopes
}

func (f *fixture) clientCredentials(auth string, scopes ...string) *Minter {
	f.t.Helper()
	f.srv.AddClient(oauth2test.Client{ID: "broker", Auth: auth, Secret: canarySecret,
		Grants: []string{GrantClientCredentials}, Scopes: []string{"read", "write", "admin"}})
	m, err := New("api", Config{TokenURL: f.srv.TokenURL, ClientID: "broker", ClientAuth: auth, Scopes: scopes}, f.deps(canarySecret))
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = m.Close(context.Background()) })
	return m
}

func pemKey(t *testing.T, key crypto.Signer) string {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

func TestClientAuthentication(t *testing.T) {
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	for name, tc := range map[string]struct {
		auth, alg, kid string
		key            crypto.Signer // private_key_jwt
		check          func(t *testing.T, f *fixture)
	}{
		"client_secret_basic": {auth: AuthClientSecretBasic, check: func(t *testing.T, f *fixture) {
			if f.srv.LastForm().Has("client_secret") {
				t.Error("basic authentication sent the secret in the form too")
			}
		}},
		"client_secret_post": {auth: AuthClientSecretPost, check: func(t *testing.T, f *fixture) {
			if f.srv.LastForm().Get("client_secret") != canarySecret {
				t.Error("the secret is not in the form")
			}
		}},
		"private_key_jwt RS256": {auth: AuthPrivateKeyJWT, key: rsaKey, check: func(t *testing.T, f *fixture) {
			if form := f.srv.LastForm(); form.Has("client_secret") || form.Get("client_id") != "broker" {
				t.Errorf("private_key_jwt sent a client secret, or no client_id")
			}
		}},
		"private_key_jwt PS256":          {auth: AuthPrivateKeyJWT, alg: "PS256", key: rsaKey},
		"private_key_jwt ES256 with kid": {auth: AuthPrivateKeyJWT, alg: "ES256", kid: "key-7", key: ecKey},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			root := canarySecret
			c := oauth2test.Client{ID: "broker", Auth: tc.auth, Secret: canarySecret,
				Grants: []string{GrantClientCredentials}, Scopes: []string{"read", "write"}}
			if tc.key != nil {
				root = pemKey(t, tc.key)
				c.Secret, c.PublicKey, c.Alg = "", tc.key.Public(), cmp(tc.alg, "RS256")
			}
			f.srv.AddClient(c)
			m, err := New("api", Config{TokenURL: f.srv.TokenURL, ClientID: "broker", ClientAuth: tc.auth,
				AssertionAlg: tc.alg, AssertionKeyID: tc.kid, Scopes: []string{"read"}}, f.deps(root))
			if err != nil {
				t.Fatal(err)
			}
			tok, err := m.Token(context.Background(), nil)
			if err != nil {
				t.Fatalf("Token: %v", err)
			}
			if status, scopes := f.callAPI(tok); status != 200 || !slices.Equal(scopes, []string{"read"}) {
				t.Errorf("API answered %d with scopes %v, want 200 [read]", status, scopes)
			}
			if tc.check != nil {
				tc.check(t, f)
			}
			if tc.kid != "" && !strings.Contains(decodeHeader(t, f.srv.LastForm().Get("client_assertion")), `"kid":"key-7"`) {
				t.Error("the assertion has no kid")
			}
		})
	}
}

func cmp(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func decodeHeader(t *testing.T, jws string) string {
	t.Helper()
	h, _, _ := strings.Cut(jws, ".")
	b, err := base64.RawURLEncoding.DecodeString(h)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A client that authenticates wrongly is refused with a class, and neither the secret nor the
// endpoint's description reaches the error.
func TestClientAuthenticationRefused(t *testing.T) {
	otherKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	rightKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	for name, tc := range map[string]struct {
		registered, used string
		secret           string
	}{
		"wrong secret":          {registered: AuthClientSecretBasic, used: AuthClientSecretBasic, secret: "not-the-" + canarySecret},
		"post for a basic one":  {registered: AuthClientSecretBasic, used: AuthClientSecretPost, secret: canarySecret},
		"jwt signed by another": {registered: AuthPrivateKeyJWT, used: AuthPrivateKeyJWT, secret: pemKey(t, otherKey)},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			f.extras = append(f.extras, tc.secret)
			f.srv.AddClient(oauth2test.Client{ID: "broker", Auth: tc.registered, Secret: canarySecret, PublicKey: rightKey.Public(),
				Grants: []string{GrantClientCredentials}, Scopes: []string{"read"}})
			m, err := New("api", Config{TokenURL: f.srv.TokenURL, ClientID: "broker", ClientAuth: tc.used}, f.deps(tc.secret))
			if err != nil {
				t.Fatal(err)
			}
			_, err = m.Token(context.Background(), nil)
			if !errors.Is(err, credentials.ErrUnavailable) || !strings.Contains(err.Error(), "token endpoint answered 401 invalid_client") {
				t.Fatalf("err = %v, want a 401 invalid_client wrapping ErrUnavailable", err)
			}
			noSecrets(t, "error", err.Error(), tc.secret, "client authentication failed")
			if st := m.Status(); st.Ready || st.LastError != "token endpoint answered 401 invalid_client" {
				t.Errorf("status = %+v", st)
			}
		})
	}
}

func TestScopes(t *testing.T) {
	f := newFixture(t)
	m := f.clientCredentials(AuthClientSecretBasic, "read", "write")
	ctx := context.Background()

	all, err := m.Token(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, scopes := f.callAPI(all); !slices.Equal(scopes, []string{"read", "write"}) {
		t.Errorf("default token has scopes %v, want the configured [read write]", scopes)
	}
	read, err := m.Token(ctx, credentials.Scope{"scopes": []any{"read"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, scopes := f.callAPI(read); !slices.Equal(scopes, []string{"read"}) || read.Reveal() == all.Reveal() {
		t.Errorf("narrowed token has scopes %v (same token: %v), want its own with [read]", scopes, read.Reveal() == all.Reveal())
	}
	// The same narrowing in another order and form is the same cache entry.
	again, err := m.Token(ctx, credentials.Scope{"scopes": []string{"read", "read"}})
	if err != nil || again.Reveal() != read.Reveal() {
		t.Errorf("the same scope minted again (err %v)", err)
	}
	calls := f.srv.Calls()
	for name, sc := range map[string]credentials.Scope{
		"not configured":   {"scopes": []any{"admin"}},
		"partly":           {"scopes": []any{"read", "admin"}},
		"empty":            {"scopes": []any{}},
		"not strings":      {"scopes": []any{1}},
		"not a list":       {"scopes": "read"},
		"other member":     {"repositories": []any{"x"}},
		"scopes and other": {"scopes": []any{"read"}, "permissions": map[string]any{}},
	} {
		if _, err := m.Token(ctx, sc); !errors.Is(err, ErrScope) || !errors.Is(err, credentials.ErrUnavailable) {
			t.Errorf("%s: err = %v, want ErrScope and ErrUnavailable", name, err)
		}
	}
	if f.srv.Calls() != calls {
		t.Error("a refused scope reached the endpoint")
	}
}

// A token endpoint granting more than was asked is refused.
func TestScopeBeyondAsked(t *testing.T) {
	f := newFixture(t)
	m := f.clientCredentials(AuthClientSecretBasic, "read")
	f.srv.Override(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"access_token":"`+oauth2test.AccessTokenPrefix+`x","token_type":"Bearer","expires_in":3600,"scope":"read admin"}`)
	})
	_, err := m.Token(context.Background(), nil)
	if err == nil || !strings.Contains(err.Error(), "granted scopes that were not asked for") {
		t.Fatalf("err = %v", err)
	}
	noSecrets(t, "error", err.Error())
}

func TestCacheAndSingleFlight(t *testing.T) {
	f := newFixture(t)
	m := f.clientCredentials(AuthClientSecretPost, "read")
	arrived, release := f.srv.Hold()
	const n = 50
	toks := make([]credentials.Secret, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			toks[i], errs[i] = m.Token(context.Background(), nil)
		}()
	}
	<-arrived // the one request is at the endpoint; callers arriving from now on wait for it
	release()
	wg.Wait()
	for i := range n {
		if errs[i] != nil || toks[i].Reveal() != toks[0].Reveal() {
			t.Fatalf("caller %d: %v (same token: %v)", i, errs[i], toks[i].Reveal() == toks[0].Reveal())
		}
	}
	if c := f.srv.Calls(); c != 1 {
		t.Errorf("%d callers made %d token requests, want 1", n, c)
	}
	// Cached while good.
	f.clock.advance(50 * time.Minute)
	if tok, _ := m.Token(context.Background(), nil); tok.Reveal() != toks[0].Reveal() || f.srv.Calls() != 1 {
		t.Errorf("a token good for 10 more minutes was not served from the cache")
	}
}

// A caller that gives up does not cancel the mint the others wait for.
func TestCallerCancelled(t *testing.T) {
	f := newFixture(t)
	m := f.clientCredentials(AuthClientSecretBasic)
	arrived, release := f.srv.Hold()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { _, err := m.Token(ctx, nil); done <- err }()
	<-arrived
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) || !errors.Is(err, credentials.ErrUnavailable) {
		t.Errorf("cancelled caller: %v", err)
	}
	release()
	if _, err := m.Token(context.Background(), nil); err != nil || f.srv.Calls() != 1 {
		t.Errorf("after the cancelled caller: %v, %d calls (want the first mint's token)", err, f.srv.Calls())
	}
}

// A token is refreshed ahead of its expiry, in the background, while it keeps serving.
func TestRefreshAhead(t *testing.T) {
	f := newFixture(t)
	m := f.clientCredentials(AuthClientSecretBasic, "read")
	ctx := context.Background()
	first, err := m.Token(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	st := m.Status()
	if !st.Ready || !st.ValidUntil.Equal(f.clock.now().Add(time.Hour)) || !st.LastRefresh.Equal(f.clock.now()) || st.LastError != "" {
		t.Errorf("status = %+v", st)
	}
	// A one-hour token is refreshed in its last six minutes.
	f.clock.advance(53 * time.Minute)
	if tok, _ := m.Token(ctx, nil); tok.Reveal() != first.Reveal() || f.srv.Calls() != 1 {
		t.Fatal("refreshed too early")
	}
	f.clock.advance(2 * time.Minute)
	tok, err := m.Token(ctx, nil)
	if err != nil || tok.Reveal() != first.Reveal() {
		t.Fatalf("in the refresh window the current token must still be served at once: %v", err)
	}
	m.wg.Wait() // the background refresh
	if f.srv.Calls() != 2 {
		t.Fatalf("%d token requests, want a refresh ahead of expiry", f.srv.Calls())
	}
	second, err := m.Token(ctx, nil)
	if err != nil || second.Reveal() == first.Reveal() {
		t.Fatalf("the refreshed token is not served: %v", err)
	}
	// Each token says when it expires: the broker scrubs it until then.
	if !first.Expires().Equal(st.ValidUntil) || !second.Expires().After(first.Expires()) {
		t.Errorf("token expiries: first %v (want %v), second %v", first.Expires(), st.ValidUntil, second.Expires())
	}
}

// With the endpoint down, cached tokens serve until they expire, then Token fails; failed
// mints back off rather than hammer the endpoint.
func TestEndpointDown(t *testing.T) {
	f := newFixture(t)
	m := f.clientCredentials(AuthClientSecretBasic, "read")
	ctx := context.Background()
	first, err := m.Token(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Close()
	f.clock.advance(55 * time.Minute)
	if tok, err := m.Token(ctx, nil); err != nil || tok.Reveal() != first.Reveal() {
		t.Fatalf("cached token not served while the endpoint is down: %v", err)
	}
	m.wg.Wait()
	st := m.Status()
	if !st.Ready || !strings.Contains(st.LastError, "token endpoint unreachable") {
		t.Errorf("status = %+v, want ready with an unreachable endpoint", st)
	}
	f.clock.advance(4*time.Minute + 51*time.Second) // 9s before expiry
	_, err = m.Token(ctx, nil)
	if !errors.Is(err, credentials.ErrUnavailable) || !strings.Contains(err.Error(), "token endpoint unreachable") {
		t.Fatalf("err = %v, want unavailable", err)
	}
	if st := m.Status(); st.Ready {
		t.Errorf("status = %+v, want not ready", st)
	}
}

// Answers that are not a usable bearer token are refused, and the error and the log name the
// problem without the body.
func TestGarbageAnswers(t *testing.T) {
	for name, tc := range map[string]struct {
		status int
		ctype  string
		body   string
		want   string
	}{
		"no access_token":    {200, "application/json", `{"token_type":"Bearer","expires_in":60,"x":"` + canaryBody + `"}`, "answer is not a token response"},
		"bad json":           {200, "application/json", `{"access_token":"` + canaryBody, "answer is not a token response"},
		"html":               {200, "text/html", `<html>` + canaryBody + `</html>`, "answer is not a token response"},
		"form without token": {200, "text/plain", `hello ` + canaryBody, "answer is not a token response"},
		"token type mac":     {200, "application/json", `{"access_token":"` + canaryBody + `","token_type":"mac","expires_in":60}`, `token_type "mac", not Bearer`},
		"no token type":      {200, "application/json", `{"access_token":"` + canaryBody + `","expires_in":60}`, "no token_type"},
		"odd token type":     {200, "application/json", `{"access_token":"a","token_type":"` + canaryBody + `","expires_in":60}`, "token_type (unexpected value)"},
		"expires_in 0":       {200, "application/json", `{"access_token":"` + canaryBody + `","token_type":"Bearer","expires_in":0}`, "expires_in 0"},
		"expires_in -5":      {200, "application/json", `{"access_token":"` + canaryBody + `","token_type":"Bearer","expires_in":-5}`, "expires_in -5"},
		"no expires_in":      {200, "application/json", `{"access_token":"` + canaryBody + `","token_type":"Bearer"}`, "no usable expires_in"},
		"500 html":           {500, "text/html", `<h1>` + canaryBody + `</h1>`, "token endpoint answered 500"},
		"400 json":           {400, "application/json", `{"error":"invalid_grant","error_description":"` + canaryBody + `"}`, "token endpoint answered 400 invalid_grant"},
		"error code echoes":  {400, "application/json", `{"error":"` + canaryBody + `"}`, "token endpoint answered 400 with an unknown error code"},
		"200 with error":     {200, "application/json", `{"error":"invalid_scope"}`, "token endpoint answered 200 invalid_scope"},
		"redirect":           {302, "text/html", canaryBody, "token endpoint answered 302"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			m := f.clientCredentials(AuthClientSecretBasic)
			f.srv.Override(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.ctype)
				if tc.status == 302 {
					w.Header().Set("Location", f.srv.TokenURL)
				}
				w.WriteHeader(tc.status)
				fmt.Fprint(w, tc.body)
			})
			_, err := m.Token(context.Background(), nil)
			if err == nil || !errors.Is(err, credentials.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			noSecrets(t, "error", err.Error())
			if f.srv.Calls() != 1 {
				t.Errorf("%d token requests (a redirect must not be followed)", f.srv.Calls())
			}
			if esc, _ := json.Marshal(tc.want); !strings.Contains(f.log.String(), strings.Trim(string(esc), `"`)) {
				t.Errorf("the failure is not logged: %s", f.log.String())
			}
		})
	}
}

func TestRootUnavailable(t *testing.T) {
	f := newFixture(t)
	deps := f.deps("")
	deps.Root = func(context.Context) (credentials.Secret, error) {
		return credentials.Secret{}, fmt.Errorf("%w: vault secret secret/api not found", credentials.ErrUnavailable)
	}
	m, err := New("api", Config{TokenURL: f.srv.TokenURL, ClientID: "broker"}, deps)
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Token(context.Background(), nil)
	if !errors.Is(err, credentials.ErrUnavailable) || !strings.Contains(err.Error(), "reading the client's secret: credential unavailable: vault secret secret/api not found") {
		t.Fatalf("err = %v", err)
	}
	if f.srv.Calls() != 0 {
		t.Error("the endpoint was asked without a secret")
	}
}

// Reject drops the token the upstream refused; the next Token mints a new one.
func TestReject(t *testing.T) {
	f := newFixture(t)
	m := f.clientCredentials(AuthClientSecretBasic, "read")
	ctx := context.Background()
	first, _ := m.Token(ctx, nil)
	m.Reject(credentials.NewSecret("some other token")) // not ours: nothing happens
	if tok, _ := m.Token(ctx, nil); tok.Reveal() != first.Reveal() {
		t.Fatal("rejecting another token dropped ours")
	}
	f.srv.Revoke(first.Reveal())
	if status, _ := f.callAPI(first); status != 401 {
		t.Fatalf("the API accepted a revoked token: %d", status)
	}
	m.Reject(first)
	second, err := m.Token(ctx, nil)
	if err != nil || second.Reveal() == first.Reveal() || f.srv.Calls() != 2 {
		t.Fatalf("after Reject: %v, %d calls", err, f.srv.Calls())
	}
	if status, _ := f.callAPI(second); status != 200 {
		t.Errorf("the new token is refused: %d", status)
	}
}

// A token minted to replace a rejected one is kept when refused again at once: an upstream
// that refuses a request (not the token) must not make the broker mint a token per request.
func TestRejectGrace(t *testing.T) {
	f := newFixture(t)
	m := f.clientCredentials(AuthClientSecretBasic, "read")
	ctx := context.Background()
	first, _ := m.Token(ctx, nil)
	m.Reject(first)
	second, _ := m.Token(ctx, nil)
	for range 5 {
		m.Reject(second)
		if tok, _ := m.Token(ctx, nil); tok.Reveal() != second.Reveal() {
			t.Fatal("a token that replaced a rejected one moments ago was dropped")
		}
	}
	if f.srv.Calls() != 2 {
		t.Errorf("%d token requests, want 2", f.srv.Calls())
	}
	f.clock.advance(rejectGrace)
	m.Reject(second)
	if tok, _ := m.Token(ctx, nil); tok.Reveal() == second.Reveal() || f.srv.Calls() != 3 {
		t.Error("after the grace a refusal must drop the token")
	}
}

func TestConfigValidate(t *testing.T) {
	store := FileRefreshToken{Path: "/x"}
	for name, tc := range map[string]struct {
		cfg  Config
		want string
	}{
		"http url":          {Config{TokenURL: "http://a/token", ClientID: "c"}, "https://"},
		"no client":         {Config{TokenURL: "https://a/token"}, "client_id"},
		"bad grant":         {Config{TokenURL: "https://a/token", ClientID: "c", Grant: "password"}, `grant "password"`},
		"refresh without":   {Config{TokenURL: "https://a/token", ClientID: "c", Grant: GrantRefreshToken}, "needs refresh_token"},
		"cc with rt":        {Config{TokenURL: "https://a/token", ClientID: "c", RefreshToken: store}, "only used with grant refresh_token"},
		"bad auth":          {Config{TokenURL: "https://a/token", ClientID: "c", ClientAuth: "tls"}, `client_auth "tls"`},
		"alg without jwt":   {Config{TokenURL: "https://a/token", ClientID: "c", AssertionAlg: "RS256"}, "only used with private_key_jwt"},
		"bad alg":           {Config{TokenURL: "https://a/token", ClientID: "c", ClientAuth: AuthPrivateKeyJWT, AssertionAlg: "HS256"}, `"HS256"`},
		"bad scope":         {Config{TokenURL: "https://a/token", ClientID: "c", Scopes: []string{"a b"}}, "single scope"},
		"reserved param":    {Config{TokenURL: "https://a/token", ClientID: "c", Params: map[string]string{"scope": "x"}}, `"scope"`},
		"ok refresh (file)": {Config{TokenURL: "https://a/token", ClientID: "c", Grant: GrantRefreshToken, RefreshToken: store}, ""},
	} {
		err := tc.cfg.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: err = %v, want %q", name, err, tc.want)
		}
	}
	if err := (GoogleConfig{}).Validate(); err == nil || !strings.Contains(err.Error(), "scopes are required") {
		t.Errorf("google without scopes: %v", err)
	}
}

// Extra parameters reach the endpoint; a grant the client may not use is refused by class.
func TestParamsAndGrantRefused(t *testing.T) {
	f := newFixture(t)
	f.srv.AddClient(oauth2test.Client{ID: "broker", Auth: AuthClientSecretPost, Secret: canarySecret,
		Grants: []string{GrantClientCredentials}, Scopes: []string{"read"}})
	m, err := New("api", Config{TokenURL: f.srv.TokenURL, ClientID: "broker", ClientAuth: AuthClientSecretPost,
		Params: map[string]string{"audience": "https://api.example.test"}}, f.deps(canarySecret))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Token(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if got := f.srv.LastForm().Get("audience"); got != "https://api.example.test" {
		t.Errorf("audience %q", got)
	}
	rt, err := New("rt", Config{TokenURL: f.srv.TokenURL, ClientID: "broker", ClientAuth: AuthClientSecretPost,
		Grant: GrantRefreshToken, RefreshToken: &failingStore{rt: "some-refresh-token"}}, f.deps(canarySecret))
	if err != nil {
		t.Fatal(err)
	}
	_, err = rt.Token(context.Background(), nil)
	if err == nil || !strings.Contains(err.Error(), "token endpoint answered 400 unauthorized_client") {
		t.Fatalf("err = %v", err)
	}
	noSecrets(t, "error", err.Error(), "some-refresh-token")
}
