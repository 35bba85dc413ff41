package github

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/credentials"
	"github.com/capbroker/capbroker/credentials/github/githubtest"
	"github.com/capbroker/capbroker/internal/testkit"
)

const appID = "4242"

// keys are generated once: RSA-2048 generation is slow under -race.
var (
	keyOnce  sync.Once
	appKey   *rsa.PrivateKey
	appPEM   string
	otherKey *rsa.PrivateKey
)

func keys(t testing.TB) {
	t.Helper()
	keyOnce.Do(func() {
		var err error
		if appKey, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
		if otherKey, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
		appPEM = string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(appKey)}))
	})
}

// clock is a test clock shared by the App and the stand-in.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Now().Truncate(time.Second)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// syncBuf collects what goroutines write, for the test to read.
type syncBuf = testkit.Buffer

type fixture struct {
	srv  *githubtest.Server
	app  *App
	clk  *clock
	logs *syncBuf
}

// setup starts a stand-in for repositories r1, r2, r3 and an App that reads the key as a PEM.
// Every test ends by checking that no token, key or answer body reached a log.
func setup(t testing.TB, mod func(*githubtest.Options, *Options)) *fixture {
	t.Helper()
	keys(t)
	f := &fixture{clk: newClock(), logs: &syncBuf{}}
	so := githubtest.Options{AppID: appID, InstallationID: 7, PublicKey: &appKey.PublicKey, Repos: []string{"r1", "r2", "r3"}, Now: f.clk.Now}
	ao := Options{
		Name: "gh_app", AppID: appID, InstallationID: 7,
		PrivateKey: func(context.Context) (credentials.Secret, error) { return credentials.NewSecret(appPEM), nil },
		Log:        zerolog.New(f.logs), Now: f.clk.Now,
	}
	if mod != nil {
		mod(&so, &ao)
	}
	f.srv = githubtest.Start(t, so)
	ao.APIURL = f.srv.URL
	ao.HTTPClient = f.srv.Client()
	app, err := New(ao)
	if err != nil {
		t.Fatal(err)
	}
	f.app = app
	t.Cleanup(func() {
		_ = app.Close(context.Background())
		logs := f.logs.String()
		for _, tok := range f.srv.Issued() {
			if strings.Contains(logs, tok) {
				t.Errorf("a minted token is in the log")
			}
		}
		if strings.Contains(logs, githubtest.BodyCanary) || strings.Contains(logs, "PRIVATE KEY") {
			t.Errorf("an answer body or the key is in the log:\n%s", logs)
		}
	})
	return f
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (f *fixture) token(t *testing.T, s credentials.Scope) string {
	t.Helper()
	tok, err := f.app.Token(ctxT(t), s)
	if err != nil {
		t.Fatalf("Token(%v): %v", s, err)
	}
	return tok.Reveal()
}

// assertClean fails if err carries a token the stand-in issued or an answer body.
func (f *fixture) assertClean(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	for _, tok := range f.srv.Issued() {
		if strings.Contains(err.Error(), tok) {
			t.Fatalf("error carries a token: %v", err)
		}
	}
	if strings.Contains(err.Error(), githubtest.BodyCanary) || strings.Contains(err.Error(), "html") {
		t.Fatalf("error carries an answer body: %v", err)
	}
}

var r1write = credentials.Scope{"repositories": []any{"r1"}, "permissions": map[string]any{"contents": "write"}}

func TestTokenScopedAndCachedPerScope(t *testing.T) {
	f := setup(t, nil)
	t1 := f.token(t, r1write)
	repos, perms, ok := f.srv.Scope(t1)
	if !ok || !slices.Equal(repos, []string{"r1"}) || perms["contents"] != "write" || len(perms) != 2 {
		t.Fatalf("token scope at GitHub: repos %v perms %v", repos, perms)
	}
	if got := f.token(t, r1write); got != t1 {
		t.Fatal("same scope minted a second token")
	}
	// The same scope written differently is the same cache entry.
	same := credentials.Scope{"permissions": map[string]string{"contents": "write"}, "repositories": []string{"R1", "r1"}}
	if got := f.token(t, same); got != t1 {
		t.Fatal("an equal scope written differently minted a second token")
	}
	t2 := f.token(t, credentials.Scope{"repositories": []any{"r1", "r2"}, "permissions": map[string]any{"contents": "read"}})
	if t2 == t1 {
		t.Fatal("another scope got the same token")
	}
	repos, perms, _ = f.srv.Scope(t2)
	if !slices.Equal(repos, []string{"r1", "r2"}) || perms["contents"] != "read" {
		t.Fatalf("second token scope: %v %v", repos, perms)
	}
	t3 := f.token(t, nil)
	if repos, perms, _ := f.srv.Scope(t3); repos != nil || perms["issues"] != "write" {
		t.Fatalf("no scope should get the installation's default, got %v %v", repos, perms)
	}
	if n := f.srv.Mints(); n != 3 {
		t.Fatalf("mints = %d, want 3", n)
	}
	if k := f.app.issuedLive(); len(k) != 3 {
		t.Fatalf("Known() has %d tokens, want 3", len(k))
	}
	st := f.app.Status()
	if !st.Ready || st.LastError != "" || st.LastRefresh.IsZero() || !st.ValidUntil.After(f.clk.Now().Add(50*time.Minute)) {
		t.Fatalf("status %+v", st)
	}
}

func TestOneMintInFlightPerScope(t *testing.T) {
	f := setup(t, nil)
	release := f.srv.Hold()
	defer release()
	const n = 32
	got := make(chan string, n)
	errs := make(chan error, n)
	for range n {
		go func() {
			tok, err := f.app.Token(context.Background(), r1write)
			got <- tok.Reveal()
			errs <- err
		}()
	}
	// The first request reaches the (held) endpoint; the others wait on it.
	deadline := time.Now().Add(10 * time.Second)
	for f.srv.Mints() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	release()
	first := ""
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		tok := <-got
		if first == "" {
			first = tok
		}
		if tok != first {
			t.Fatal("concurrent requests for one scope got different tokens")
		}
	}
	if m := f.srv.Mints(); m != 1 {
		t.Fatalf("mints = %d, want 1", m)
	}
}

func TestRefreshAheadOutageAndExpiry(t *testing.T) {
	f := setup(t, nil) // tokens live 1h
	t1 := f.token(t, r1write)

	// Due for replacement, with the endpoint down: the cached token keeps serving while a
	// background mint fails.
	f.srv.SetFault(githubtest.Down)
	f.clk.Advance(56 * time.Minute)
	if got := f.token(t, r1write); got != t1 {
		t.Fatal("a token due for refresh was not served while the endpoint is down")
	}
	waitFor(t, "the background mint to fail", func() bool { return f.app.Status().LastError != "" })
	if st := f.app.Status(); st.LastError != "token endpoint answered 503" || !st.Ready {
		t.Fatalf("status after a failed refresh: %+v", st)
	}

	// Less than expiryGuard left: never served, the error says the credential is unavailable.
	f.clk.Advance(3*time.Minute + 45*time.Second)
	_, err := f.app.Token(ctxT(t), r1write)
	if !errors.Is(err, credentials.ErrUnavailable) || !strings.Contains(err.Error(), "503") {
		t.Fatalf("expired token with the endpoint down: %v", err)
	}
	f.assertClean(t, err)
	if st := f.app.Status(); st.Ready {
		t.Fatalf("status says ready with no usable token and a failing endpoint: %+v", st)
	}
	// Within the backoff, the failure is answered at once without asking the endpoint. (The
	// call above may have joined the background mint as it finished, before the clock moved:
	// one more call makes sure a failure at this time has set the backoff.)
	_, _ = f.app.Token(ctxT(t), r1write)
	before := f.srv.Mints()
	if _, err := f.app.Token(ctxT(t), r1write); !errors.Is(err, credentials.ErrUnavailable) {
		t.Fatalf("during backoff: %v", err)
	}
	if f.srv.Mints() != before {
		t.Fatal("the endpoint was asked again during the backoff")
	}

	// The endpoint is back: a new token, and the old one leaves Known once expired.
	f.srv.SetFault(githubtest.None)
	f.clk.Advance(time.Minute)
	t2 := f.token(t, r1write)
	if t2 == t1 {
		t.Fatal("an expired token was served")
	}
	if k := f.app.issuedLive(); len(k) != 1 || k[0].Reveal() != t2 {
		t.Fatalf("Known() after expiry has %d tokens", len(k))
	}
	if st := f.app.Status(); !st.Ready || st.LastError != "" {
		t.Fatalf("status after recovery: %+v", st)
	}
}

func TestRefreshReplacesTokenAhead(t *testing.T) {
	f := setup(t, nil)
	t1 := f.token(t, r1write)
	f.clk.Advance(56 * time.Minute)
	if got := f.token(t, r1write); got != t1 {
		t.Fatal("the cached token should serve while the refresh runs")
	}
	waitFor(t, "the refresh", func() bool { return f.srv.Mints() == 2 && len(f.app.issuedLive()) == 2 })
	if t2 := f.token(t, r1write); t2 == t1 {
		t.Fatal("the refreshed token is not served")
	}
}

func TestUnusableAnswersAreRefused(t *testing.T) {
	cases := map[string]struct {
		fault  githubtest.Fault
		class  string
		revoke bool // the refused token must be revoked at once
	}{
		"garbage":     {githubtest.Garbage, "unusable answer", false},
		"no token":    {githubtest.NoToken, "unusable answer", false},
		"expired":     {githubtest.Expired, "unusable answer", true},
		"wider scope": {githubtest.Wider, "a token for another scope", true},
		"error body":  {githubtest.BadSecret, "token endpoint answered 500", false},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			f := setup(t, nil)
			f.srv.SetFault(c.fault)
			_, err := f.app.Token(ctxT(t), r1write)
			if !errors.Is(err, credentials.ErrUnavailable) {
				t.Fatalf("want ErrUnavailable, got %v", err)
			}
			f.assertClean(t, err)
			if st := f.app.Status(); st.LastError != c.class || st.Ready {
				t.Fatalf("status %+v, want class %q", st, c.class)
			}
			if len(f.app.issuedLive()) != 0 {
				t.Fatal("a refused token is known as served")
			}
			if c.revoke && !slices.Equal(f.srv.Revoked(), f.srv.Issued()) {
				t.Fatalf("refused token not revoked: issued %d, revoked %d", len(f.srv.Issued()), len(f.srv.Revoked()))
			}
			if c.fault == githubtest.Wider && !strings.Contains(err.Error(), "a token for another scope") {
				t.Fatalf("error: %v", err)
			}
		})
	}
}

func TestScopeTheInstallationRefuses(t *testing.T) {
	f := setup(t, nil)
	_, err := f.app.Token(ctxT(t), credentials.Scope{"repositories": []any{"elsewhere"}})
	if !errors.Is(err, credentials.ErrUnavailable) || !strings.Contains(err.Error(), "422") {
		t.Fatalf("got %v", err)
	}
	f.assertClean(t, err)
}

func TestBadScopesNeverMint(t *testing.T) {
	f := setup(t, nil)
	for name, s := range map[string]credentials.Scope{
		"unknown key":       {"repos": []any{"r1"}},
		"repo not string":   {"repositories": []any{1}},
		"repo with owner":   {"repositories": []any{"o/r1"}},
		"empty repos":       {"repositories": []any{}},
		"empty permissions": {"permissions": map[string]any{}},
		"bad level":         {"permissions": map[string]any{"contents": "all"}},
		"perms not object":  {"permissions": []any{"contents"}},
	} {
		if _, err := f.app.Token(ctxT(t), s); !errors.Is(err, credentials.ErrUnavailable) {
			t.Errorf("%s: got %v", name, err)
		}
	}
	if f.srv.Mints() != 0 {
		t.Fatal("a bad scope reached the token endpoint")
	}
}

func TestRejectDropsToken(t *testing.T) {
	f := setup(t, nil)
	t1 := f.token(t, r1write)
	f.app.Reject(credentials.NewSecret(t1))
	t2 := f.token(t, r1write)
	if t2 == t1 {
		t.Fatal("a rejected token was served again")
	}
	if len(f.app.issuedLive()) != 2 {
		t.Fatal("a rejected token must stay known for scrubbing until it expires")
	}
}

func TestCloseRevokesEveryToken(t *testing.T) {
	f := setup(t, nil)
	f.token(t, r1write)
	f.token(t, nil)
	t1 := f.token(t, credentials.Scope{"repositories": []any{"r3"}})
	f.app.Reject(credentials.NewSecret(t1)) // rejected, still valid at GitHub: revoked too
	if err := f.app.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	issued, revoked := f.srv.Issued(), f.srv.Revoked()
	slices.Sort(issued)
	slices.Sort(revoked)
	if len(issued) != 3 || !slices.Equal(issued, revoked) {
		t.Fatalf("issued %d, revoked %d", len(issued), len(revoked))
	}
	if _, err := f.app.Token(ctxT(t), r1write); !errors.Is(err, credentials.ErrUnavailable) {
		t.Fatalf("Token after Close: %v", err)
	}
}

func TestEndpointUnreachable(t *testing.T) {
	keys(t)
	app, err := New(Options{Name: "gh", AppID: appID, InstallationID: 1, APIURL: "https://127.0.0.1:1",
		PrivateKey: func(context.Context) (credentials.Secret, error) { return credentials.NewSecret(appPEM), nil }})
	if err != nil {
		t.Fatal(err)
	}
	_, err = app.Token(ctxT(t), nil)
	if !errors.Is(err, credentials.ErrUnavailable) || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("got %v", err)
	}
	if app.Status().LastError != "token endpoint unreachable" {
		t.Fatalf("status %+v", app.Status())
	}
}

func TestWrongKeyAndBadPEM(t *testing.T) {
	keys(t)
	f := setup(t, func(so *githubtest.Options, _ *Options) { so.PublicKey = &otherKey.PublicKey })
	_, err := f.app.Token(ctxT(t), nil)
	if !errors.Is(err, credentials.ErrUnavailable) || !strings.Contains(err.Error(), "401") {
		t.Fatalf("JWT signed by another key: %v", err)
	}
	g := setup(t, func(_ *githubtest.Options, ao *Options) {
		ao.PrivateKey = func(context.Context) (credentials.Secret, error) {
			return credentials.NewSecret("-----BEGIN RSA PRIVATE KEY-----\nbm90IGEga2V5\n-----END RSA PRIVATE KEY-----\n"), nil
		}
	})
	_, err = g.app.Token(ctxT(t), nil)
	if !errors.Is(err, credentials.ErrUnavailable) || strings.Contains(err.Error(), "bm90IGEga2V5") {
		t.Fatalf("bad PEM: %v", err)
	}
	if g.app.Status().LastError != "signing the app JWT failed" {
		t.Fatalf("status %+v", g.app.Status())
	}
}

func TestClockSkewIsCorrected(t *testing.T) {
	for name, off := range map[string]time.Duration{"github behind": -5 * time.Minute, "github ahead": 15 * time.Minute} {
		t.Run(name, func(t *testing.T) {
			var f *fixture
			f = setup(t, func(so *githubtest.Options, _ *Options) {
				so.Now = func() time.Time { return f.clk.Now().Add(off) }
			})
			tok := f.token(t, r1write) // the first JWT is refused, the corrected one accepted
			if f.srv.JWTFailures() != 1 {
				t.Fatalf("JWT failures = %d, want 1", f.srv.JWTFailures())
			}
			st := f.app.Status()
			if !strings.Contains(st.LastError, "clock skew") || !st.Ready {
				t.Fatalf("status %+v", st)
			}
			if !strings.Contains(f.logs.String(), "clock skew") {
				t.Fatal("clock skew not logged")
			}
			// Expiry is in our clock: an hour from now, not an hour from GitHub's now.
			if d := st.ValidUntil.Sub(f.clk.Now()); d < 59*time.Minute || d > 61*time.Minute {
				t.Fatalf("valid for %s", d)
			}
			f.app.Reject(credentials.NewSecret(tok))
			f.token(t, r1write) // the next JWT is dated right at once
			if f.srv.JWTFailures() != 1 {
				t.Fatal("the correction was not kept")
			}
		})
	}
}

func TestInject(t *testing.T) {
	keys(t)
	app, err := New(Options{Name: "gh", AppID: appID, InstallationID: 1,
		PrivateKey: func(context.Context) (credentials.Secret, error) { return credentials.NewSecret(appPEM), nil }})
	if err != nil {
		t.Fatal(err)
	}
	tok := credentials.NewSecret("ghs_test")
	cases := map[string]bool{ // URL -> git Basic auth
		"https://github.com/o/r.git/info/refs?service=git-upload-pack":  true,
		"https://github.com/o/r.git/info/refs?service=git-receive-pack": true,
		"https://github.com/o/r.git/git-upload-pack":                    true,
		"https://github.com/o/r/git-receive-pack":                       true,
		"https://github.com/o/r.git/info/refs":                          false,
		"https://api.github.com/repos/o/r":                              false,
		"https://api.github.com/repos/o/r/contents/info/refs":           false,
		"https://github.com/o/r.git/info/lfs/objects/batch":             true,
	}
	for u, git := range cases {
		req, _ := http.NewRequest("GET", u, nil)
		req.Header.Set("Authorization", "Bearer placeholder")
		app.Inject(req, tok)
		if got := req.Header.Values("Authorization"); len(got) != 1 {
			t.Fatalf("%s: %d Authorization headers", u, len(got))
		}
		user, pass, basic := req.BasicAuth()
		switch {
		case git && (!basic || user != "x-access-token" || pass != "ghs_test"):
			t.Errorf("%s: want Basic x-access-token, got %q", u, req.Header.Get("Authorization"))
		case !git && req.Header.Get("Authorization") != "Bearer ghs_test":
			t.Errorf("%s: want Bearer, got %q", u, req.Header.Get("Authorization"))
		}
	}
}

func TestNewValidates(t *testing.T) {
	for name, o := range map[string]Options{
		"no app id":     {InstallationID: 1, SignRS256: func(context.Context, []byte) ([]byte, error) { return nil, nil }},
		"no install":    {AppID: "1", SignRS256: func(context.Context, []byte) ([]byte, error) { return nil, nil }},
		"no key":        {AppID: "1", InstallationID: 1},
		"http api":      {AppID: "1", InstallationID: 1, APIURL: "http://api.github.com", SignRS256: func(context.Context, []byte) ([]byte, error) { return nil, nil }},
		"two key kinds": {AppID: "1", InstallationID: 1, SignRS256: func(context.Context, []byte) ([]byte, error) { return nil, nil }, PrivateKey: func(context.Context) (credentials.Secret, error) { return credentials.Secret{}, nil }},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// waitFor polls a condition that background work makes true.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestExpiredScopesAreForgotten(t *testing.T) {
	f := setup(t, nil)
	f.token(t, r1write)
	f.token(t, nil)
	f.clk.Advance(2 * time.Hour)
	if k := f.app.issuedLive(); len(k) != 0 {
		t.Fatalf("Known() has %d expired tokens", len(k))
	}
	f.app.mu.Lock()
	n := len(f.app.cache)
	f.app.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d expired scopes still cached", n)
	}
	f.token(t, r1write) // and minted again when asked
	if f.srv.Mints() != 3 {
		t.Fatalf("mints = %d", f.srv.Mints())
	}
}

// issuedLive returns the tokens Close would revoke: those minted that have not expired.
func (a *App) issuedLive() []credentials.Secret {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.forget(a.now())
	out := make([]credentials.Secret, len(a.issued))
	for i, k := range a.issued {
		out[i] = k.val
	}
	return out
}
