package oauth2

import (
	"context"
	"errors"
	"github.com/capbroker/capbroker/internal/svcdial/svcdialtest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/credentials"
	"github.com/capbroker/capbroker/credentials/oauth2/oauth2test"
	"github.com/capbroker/capbroker/credentials/vaulttest"
)

// refreshClient registers a client for the refresh grant and issues it a refresh token.
func (f *fixture) refreshClient() string {
	f.srv.AddClient(oauth2test.Client{ID: "broker", Auth: AuthClientSecretBasic, Secret: canarySecret,
		Grants: []string{GrantRefreshToken}, Scopes: []string{"read", "write"}})
	return f.srv.IssueRefreshToken("broker")
}

func (f *fixture) refreshMinter(store RefreshTokenStore) *Minter {
	f.t.Helper()
	m, err := New("api", Config{TokenURL: f.srv.TokenURL, ClientID: "broker", Grant: GrantRefreshToken,
		Scopes: []string{"read", "write"}, RefreshToken: store}, f.deps(canarySecret))
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = m.Close(context.Background()) })
	return m
}

func startVault(t *testing.T) (*vaulttest.Server, *credentials.Vault) {
	t.Helper()
	srv := vaulttest.Start(t)
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte(srv.RootToken), 0o600); err != nil {
		t.Fatal(err)
	}
	v, err := credentials.NewVault(credentials.VaultOptions{Dial: (&svcdialtest.Recorder{}).Dial, Address: srv.Addr, Timeout: 5 * time.Second, Log: zerolog.Nop(),
		Auth: credentials.VaultAuth{Method: credentials.AuthToken, TokenFile: tokFile}})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = v.Close(context.Background()) })
	return srv, v
}

// A rotated refresh token is written back to Vault (KV v2 and v1) before the access token is
// used; the old one no longer works at the endpoint, and the secret's other fields are kept.
func TestRefreshTokenRotationWrittenToVault(t *testing.T) {
	vsrv, v := startVault(t)
	root := vsrv.Client()
	if err := root.Sys().Mount("kv1", &api.MountInput{Type: "kv", Options: map[string]string{"version": "1"}}); err != nil {
		t.Fatal(err)
	}
	for name, ref := range map[string]credentials.VaultRef{
		"kv2": {Mount: "secret", Path: "oauth/api", Field: "refresh_token"},
		"kv1": {Mount: "kv1", Path: "oauth/api", Field: "refresh_token", KVVersion: 1},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			rt0 := f.refreshClient()
			path := ref.Mount + "/oauth/api"
			data := map[string]any{"refresh_token": rt0, "note": "kept"}
			if ref.KVVersion != 1 {
				path, data = ref.Mount+"/data/oauth/api", map[string]any{"data": data}
			}
			if _, err := root.Logical().Write(path, data); err != nil {
				t.Fatal(err)
			}
			stored := func() string {
				t.Helper()
				s, err := v.Source("api", ref).Fetch(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				return s.Reveal()
			}
			m := f.refreshMinter(VaultRefreshToken{Vault: v, Ref: ref, Name: "api"})
			ctx := context.Background()
			tok, err := m.Token(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			rt1 := stored()
			if rt1 == rt0 || !f.srv.RefreshTokenValid(rt1) || f.srv.RefreshTokenValid(rt0) {
				t.Fatalf("vault holds the old refresh token or one the endpoint does not know (rotated: %v)", rt1 != rt0)
			}
			if status, _ := f.callAPI(tok); status != 200 {
				t.Fatalf("API: %d", status)
			}
			// A narrowed scope is another refresh, with the token just written.
			if _, err := m.Token(ctx, credentials.Scope{"scopes": []any{"read"}}); err != nil {
				t.Fatal(err)
			}
			if got := f.srv.LastScopes(); len(got) != 1 || got[0] != "read" {
				t.Errorf("narrowed refresh got scopes %v", got)
			}
			rt2 := stored()
			if rt2 == rt1 || !f.srv.RefreshTokenValid(rt2) {
				t.Fatal("the second rotation was not written back")
			}
			other := ref
			other.Field = "note"
			if s, err := v.Source("api", other).Fetch(ctx); err != nil || s.Reveal() != "kept" {
				t.Errorf("the secret's other field was lost: %v", err)
			}
			if st := m.Status(); st.LastError != "" || !st.Ready {
				t.Errorf("status = %+v", st)
			}
		})
	}
}

// failingStore is a refresh token store whose writes fail until told otherwise.
type failingStore struct {
	mu      sync.Mutex
	rt      string
	fail    bool
	written []string
}

func (s *failingStore) Read(context.Context) (credentials.Secret, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return credentials.NewSecret(s.rt), nil
}

func (s *failingStore) Write(_ context.Context, rt credentials.Secret) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		return errors.New("vault answered 503: Vault is sealed")
	}
	s.rt = rt.Reveal()
	s.written = append(s.written, s.rt)
	return nil
}

// A write-back that fails never loses the new refresh token: it is used from memory, the
// failure shows in Status, and the write is tried again.
func TestRefreshTokenWriteBackFails(t *testing.T) {
	f := newFixture(t)
	store := &failingStore{rt: f.refreshClient(), fail: true}
	m := f.refreshMinter(store)
	ctx := context.Background()
	first, err := m.Token(ctx, nil)
	if err != nil {
		t.Fatalf("a failed write-back must not fail the token: %v", err)
	}
	st := m.Status()
	if !st.Ready || !strings.Contains(st.LastError, "writing the rotated refresh token back failed: vault answered 503") {
		t.Errorf("status = %+v", st)
	}
	if !strings.Contains(f.log.String(), "writing the rotated refresh token back failed") {
		t.Error("the failure is not logged")
	}
	// The next refresh uses the rotated token held in memory (the stored one is spent).
	m.Reject(first)
	if _, err := m.Token(ctx, nil); err != nil {
		t.Fatalf("refresh with the in-memory token: %v", err)
	}
	store.mu.Lock()
	store.fail = false
	store.mu.Unlock()
	m.Reject(first) // no-op: first is no longer current
	second, _ := m.Token(ctx, nil)
	f.clock.advance(rejectGrace)
	m.Reject(second)
	if _, err := m.Token(ctx, nil); err != nil {
		t.Fatal(err)
	}
	store.mu.Lock()
	last := store.rt
	n := len(store.written)
	store.mu.Unlock()
	if n == 0 || !f.srv.RefreshTokenValid(last) {
		t.Errorf("after Vault recovered, the store holds a spent refresh token (%d writes)", n)
	}
	if st := m.Status(); st.LastError != "" {
		t.Errorf("status after recovery = %+v", st)
	}
}

// A spent refresh token (invalid_grant) makes the minter read the store once more: an operator
// may have put a new one there.
func TestRefreshTokenReplacedByOperator(t *testing.T) {
	f := newFixture(t)
	store := &failingStore{rt: f.refreshClient()}
	f.srv.SetRotation(false)
	m := f.refreshMinter(store)
	ctx := context.Background()
	first, err := m.Token(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.SetRotation(true)
	// The stored token is used up elsewhere; the operator stores a new one.
	if _, err := (&http2Refresh{f}).spend(store.rt); err != nil {
		t.Fatal(err)
	}
	store.mu.Lock()
	store.rt = f.srv.IssueRefreshToken("broker")
	store.mu.Unlock()
	m.Reject(first)
	if _, err := m.Token(ctx, nil); err != nil {
		t.Fatalf("the operator's new refresh token was not picked up: %v", err)
	}
	// With neither working, the error is the endpoint's class.
	store.mu.Lock()
	spent := store.rt
	store.mu.Unlock()
	_, _ = (&http2Refresh{f}).spend(spent)
	f.clock.advance(time.Hour)
	_, err = m.Token(ctx, nil)
	if err == nil || !strings.Contains(err.Error(), "token endpoint answered 400 invalid_grant") {
		t.Fatalf("err = %v", err)
	}
	noSecrets(t, "error", err.Error())
}

// http2Refresh spends a refresh token at the stand-in, as another client holding it would.
type http2Refresh struct{ f *fixture }

func (h *http2Refresh) spend(rt string) (string, error) {
	m, err := New("other", Config{TokenURL: h.f.srv.TokenURL, ClientID: "broker", Grant: GrantRefreshToken,
		RefreshToken: &failingStore{rt: rt}}, h.f.deps(canarySecret))
	if err != nil {
		return "", err
	}
	defer m.Close(context.Background())
	tok, err := m.Token(context.Background(), nil)
	return tok.Reveal(), err
}

func TestRefreshTokenFile(t *testing.T) {
	f := newFixture(t)
	path := filepath.Join(t.TempDir(), "rt")
	if err := os.WriteFile(path, []byte(f.refreshClient()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := f.refreshMinter(FileRefreshToken{Path: path})
	if _, err := m.Token(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if rt := strings.TrimSpace(string(b)); !f.srv.RefreshTokenValid(rt) {
		t.Error("the file does not hold the rotated refresh token")
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", fi.Mode().Perm())
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("temporary files left: %d entries", len(entries))
	}
}

func TestGoogleServiceAccount(t *testing.T) {
	const scopeRO = "https://www.googleapis.com/auth/devstorage.read_only"
	const scopeRW = "https://www.googleapis.com/auth/devstorage.read_write"
	f := newFixture(t)
	key := f.srv.AddServiceAccount(t, "agent@proj.iam.gserviceaccount.com", scopeRO, scopeRW)
	m, err := NewGoogle("gcs", GoogleConfig{Scopes: []string{scopeRO, scopeRW}, Subject: "user@example.com"}, f.deps(string(key)))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	ctx := context.Background()
	tok, err := m.Token(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if status, scopes := f.callAPI(tok); status != 200 || len(scopes) != 2 {
		t.Errorf("API: %d %v", status, scopes)
	}
	narrow, err := m.Token(ctx, credentials.Scope{"scopes": []any{scopeRO}})
	if err != nil {
		t.Fatal(err)
	}
	if _, scopes := f.callAPI(narrow); len(scopes) != 1 || scopes[0] != scopeRO {
		t.Errorf("narrowed token has scopes %v", scopes)
	}
	if tok2, _ := m.Token(ctx, nil); tok2.Reveal() != tok.Reveal() || f.srv.Calls() != 2 {
		t.Error("not cached")
	}
}

func TestGoogleServiceAccountRefused(t *testing.T) {
	const scope = "https://www.googleapis.com/auth/cloud-platform"
	f := newFixture(t)
	good := f.srv.AddServiceAccount(t, "a@proj.iam.gserviceaccount.com", scope)
	// A key whose private half is not the one the server knows for this account.
	other := f.srv.AddServiceAccount(t, "b@proj.iam.gserviceaccount.com", scope)
	forged := strings.Replace(string(other), "b@proj", "a@proj", 1)
	for name, tc := range map[string]struct {
		key, scope, want string
	}{
		"wrong key":           {forged, scope, "token endpoint answered 400 invalid_grant"},
		"scope not given":     {string(good), "https://www.googleapis.com/auth/admin", "token endpoint answered 400 invalid_scope"},
		"not json":            {"-----BEGIN PRIVATE KEY-----" + canaryBody, scope, "not a JSON key"},
		"user credentials":    {`{"type":"authorized_user","client_secret":"` + canarySecret + `"}`, scope, "not a service account key"},
		"no token_uri":        {strings.Replace(string(good), `"token_uri"`, `"x"`, 1), scope, "has no token_uri"},
		"http token_uri":      {strings.Replace(string(good), `"token_uri":"https`, `"token_uri":"http`, 1), scope, "not an https:// URL"},
		"bad private key":     {strings.Replace(string(good), `"private_key":"-----BEGIN`, `"private_key":"`+canaryBody+`-----BEGIN`, 1), scope, "private_key is not PEM"},
		"corrupt private key": {strings.Replace(string(good), `-----\nMII`, `-----\nMIA`, 1), scope, "not an RSA private key"},
	} {
		t.Run(name, func(t *testing.T) {
			f.extras = []string{} // the keys' PEM is caught by "PRIVATE KEY"
			m, err := NewGoogle("gcp", GoogleConfig{Scopes: []string{tc.scope}}, f.deps(tc.key))
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close(context.Background())
			_, err = m.Token(context.Background(), nil)
			if !errors.Is(err, credentials.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			noSecrets(t, "error", err.Error(), "MII")
		})
	}
}

// With Vault down when a refresh token rotates, the access token is still served and the new
// refresh token kept in memory; once Vault is back, it is written there before the next grant.
func TestRefreshTokenVaultDown(t *testing.T) {
	vsrv, v := startVault(t)
	f := newFixture(t)
	rt0 := f.refreshClient()
	ref := credentials.VaultRef{Mount: "secret", Path: "oauth/api", Field: "refresh_token"}
	seed := func(rt string) {
		t.Helper()
		if _, err := vsrv.Client().Logical().Write("secret/data/oauth/api", map[string]any{"data": map[string]any{"refresh_token": rt}}); err != nil {
			t.Fatal(err)
		}
	}
	seed(rt0)
	m := f.refreshMinter(VaultRefreshToken{Vault: v, Ref: ref, Name: "api"})
	ctx := context.Background()
	first, err := m.Token(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	vsrv.Stop()
	m.Reject(first)
	if _, err := m.Token(ctx, nil); err != nil {
		t.Fatalf("Vault down must not fail a refresh: %v", err)
	}
	if st := m.Status(); !strings.Contains(st.LastError, "writing the rotated refresh token back failed") {
		t.Fatalf("status = %+v", st)
	}
	vsrv.Restart() // a dev server comes back empty
	seed("stale-" + rt0)
	f.clock.advance(time.Hour) // every token expired: the next Token refreshes
	if _, err := m.Token(ctx, nil); err != nil {
		t.Fatal(err)
	}
	s, err := v.Source("api", ref).Fetch(ctx)
	if err != nil || !f.srv.RefreshTokenValid(s.Reveal()) {
		t.Fatalf("vault does not hold the current refresh token after it came back (%v)", err)
	}
	if st := m.Status(); st.LastError != "" {
		t.Errorf("status = %+v", st)
	}
}
