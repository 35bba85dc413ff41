package credentials

// These tests run against a real Vault dev server (credentials/vaulttest); nothing of the Vault
// API is mocked. Without a Vault binary they skip, or fail under CAPBROKER_REQUIRE_VAULT=1.

import (
	"context"
	"errors"
	"fmt"
	"github.com/capbroker/capbroker/internal/svcdial/svcdialtest"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/credentials/vaulttest"
)

// Values seeded into Vault. No error message may ever contain one of them.
const (
	ghValue   = "ghp_value_from_kv_v2"
	v1Value   = "value_from_kv_v1"
	rotated   = "ghp_rotated_value"
	v2Version = 2
)

var secretValues = []string{ghValue, v1Value, rotated}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond until it returns nil, failing the test with the last error at the deadline.
func waitFor(t *testing.T, within time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, within, err)
		}
		<-tick.C
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte(content+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func kvPut(t *testing.T, c *api.Client, path string, data map[string]any) {
	t.Helper()
	_, err := c.Logical().Write("secret/data/"+path, map[string]any{"data": data})
	must(t, err)
}

// testLog sends the Vault component's log to the test log, so failures show what it did.
func testLog(t *testing.T) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel).With().Timestamp().Logger()
}

// startVault builds and starts a Vault client, closed at the end of the test.
func startVault(t *testing.T, addr string, auth VaultAuth) *Vault {
	t.Helper()
	v, err := NewVault(VaultOptions{Dial: vaultDial.Dial, Address: addr, Auth: auth, Timeout: 5 * time.Second, Log: testLog(t)})
	must(t, err)
	before := vaultDial.Count()
	must(t, v.Start(ctxT(t)))
	if vaultDial.Count() == before {
		t.Fatal("the Vault client did not dial through VaultOptions.Dial")
	}
	t.Cleanup(func() { _ = v.Close(context.Background()) })
	return v
}

func rootAuth(t *testing.T) VaultAuth {
	return VaultAuth{Method: AuthToken, TokenFile: writeFile(t, vaulttest.RootToken)}
}

func (v *Vault) accessor() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.tok.accessor
}

func (s *leaseSource) leaseID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return ""
	}
	return s.cur.id
}

func assertNoValues(t *testing.T, err error) {
	t.Helper()
	for _, v := range secretValues {
		if err != nil && strings.Contains(err.Error(), v) {
			t.Fatalf("error contains a secret value: %v", err)
		}
	}
}

func TestVaultKV(t *testing.T) {
	t.Parallel()
	srv := vaulttest.Start(t)
	root := srv.Client()
	kvPut(t, root, "github", map[string]any{"token": ghValue, "pin": 1234, "obj": map[string]any{"a": "b"}})
	must(t, root.Sys().Mount("kv1", &api.MountInput{Type: "kv", Options: map[string]string{"version": "1"}}))
	_, err := root.Logical().Write("kv1/legacy", map[string]any{"key": v1Value})
	must(t, err)

	v := startVault(t, srv.Addr, rootAuth(t))

	t.Run("reads", func(t *testing.T) {
		t.Parallel()
		cases := map[string]struct {
			ref  VaultRef
			want string
		}{
			"kv v2 by default":    {VaultRef{Mount: "secret", Path: "github", Field: "token"}, ghValue},
			"kv v2 explicit":      {VaultRef{Mount: "secret/", Path: "/github", Field: "token", KVVersion: v2Version}, ghValue},
			"kv v2 number field":  {VaultRef{Mount: "secret", Path: "github", Field: "pin"}, "1234"},
			"kv v1":               {VaultRef{Mount: "kv1", Path: "legacy", Field: "key", KVVersion: 1}, v1Value},
			"kv v1 nested prefix": {VaultRef{Mount: "kv1", Path: "legacy/", Field: "key", KVVersion: 1}, v1Value},
		}
		for name, tc := range cases {
			t.Run(name, func(t *testing.T) {
				got, err := v.Source(name, tc.ref).Fetch(ctxT(t))
				if err != nil || got.Reveal() != tc.want {
					t.Fatalf("Fetch = %q, %v; want %q", got.Reveal(), err, tc.want)
				}
				if err := v.Check(ctxT(t), name, tc.ref); err != nil {
					t.Fatalf("Check: %v", err)
				}
			})
		}
	})

	t.Run("problems", func(t *testing.T) {
		t.Parallel()
		cases := map[string]struct {
			ref  VaultRef
			want string // the whole message from Fetch; Check prefixes `credential "NAME": `
		}{
			"missing field": {VaultRef{Mount: "secret", Path: "github", Field: "nope"},
				`vault secret secret/github has no field "nope"`},
			"missing secret": {VaultRef{Mount: "secret", Path: "missing", Field: "token"},
				`vault secret secret/missing not found (KV v2: read secret/data/missing; deleted versions count as missing; for a KV v1 mount set kv_version: 1)`},
			"field not a string": {VaultRef{Mount: "secret", Path: "github", Field: "obj"},
				`vault secret secret/github field "obj" is not a string`},
			"kv v1 reference to a kv v2 mount": {VaultRef{Mount: "secret", Path: "github", Field: "token", KVVersion: 1},
				`vault secret secret/github not found (secret is a KV v2 mount: remove kv_version: 1)`},
			"kv v2 reference to a kv v1 mount": {VaultRef{Mount: "kv1", Path: "legacy", Field: "key"},
				`vault secret kv1/legacy not found (KV v2: read kv1/data/legacy; deleted versions count as missing; for a KV v1 mount set kv_version: 1)`},
			"invalid reference": {VaultRef{Mount: "secret", Path: "../sys", Field: ""},
				"vault field is required\nvault path secret/../sys: \"..\" segments are not allowed"},
		}
		for name, tc := range cases {
			t.Run(name, func(t *testing.T) {
				_, err := v.Source("github", tc.ref).Fetch(ctxT(t))
				if !errors.Is(err, ErrUnavailable) || err.Error() != tc.want {
					t.Fatalf("Fetch error:\n got %v\nwant %s", err, tc.want)
				}
				assertNoValues(t, err)
				err = v.Check(ctxT(t), "github", tc.ref)
				if want := `credential "github": ` + tc.want; err == nil || err.Error() != want {
					t.Fatalf("Check error:\n got %v\nwant %s", err, want)
				}
				assertNoValues(t, err)
			})
		}
	})

	t.Run("deleted secret", func(t *testing.T) {
		t.Parallel()
		kvPut(t, root, "deleted", map[string]any{"token": ghValue})
		_, err := root.Logical().Delete("secret/data/deleted")
		must(t, err)
		_, err = v.Source("d", VaultRef{Mount: "secret", Path: "deleted", Field: "token"}).Fetch(ctxT(t))
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "vault secret secret/deleted not found") {
			t.Fatalf("Fetch error: %v", err)
		}
	})

	t.Run("permission denied", func(t *testing.T) {
		t.Parallel()
		must(t, root.Sys().PutPolicy("other-only", `path "secret/data/other" { capabilities = ["read"] }`))
		tok, err := root.Auth().Token().Create(&api.TokenCreateRequest{Policies: []string{"other-only"}, TTL: "1h"})
		must(t, err)
		limited := startVault(t, srv.Addr, VaultAuth{Method: AuthToken, TokenFile: writeFile(t, tok.Auth.ClientToken)})
		ref := VaultRef{Mount: "secret", Path: "github", Field: "token"}
		want := "permission denied reading vault secret secret/github: the broker's vault token needs read on secret/data/github"
		_, err = limited.Source("github", ref).Fetch(ctxT(t))
		if !errors.Is(err, ErrUnavailable) || err.Error() != want {
			t.Fatalf("Fetch error:\n got %v\nwant %s", err, want)
		}
		if err := limited.Check(ctxT(t), "github", ref); err == nil || err.Error() != `credential "github": `+want {
			t.Fatalf("Check error: %v", err)
		}
		// A dynamic secret is checked without issuing one: by the token's capabilities.
		err = limited.Check(ctxT(t), "db", VaultRef{Path: "database/creds/app", Field: "password", Lease: true})
		if err == nil || err.Error() != `credential "db": permission denied: the broker's vault token cannot read database/creds/app (its capabilities there: deny)` {
			t.Fatalf("Check lease error: %v", err)
		}
		if err := v.Check(ctxT(t), "db", VaultRef{Path: "database/creds/app", Field: "password", Lease: true}); err != nil {
			t.Fatalf("Check lease with root: %v", err)
		}
	})

	t.Run("store names the credential", func(t *testing.T) {
		t.Parallel()
		store := NewStore(map[string]Source{
			"github": v.Source("github", VaultRef{Mount: "secret", Path: "github", Field: "token"}),
			"broken": v.Source("broken", VaultRef{Mount: "secret", Path: "github", Field: "nope"}),
		}, StoreOptions{})
		errs := store.Warm(ctxT(t))
		if len(errs) != 1 || errs[0].Error() != `credential "broken": vault secret secret/github has no field "nope"` {
			t.Fatalf("Warm errors: %v", errs)
		}
		if got, err := store.Get(ctxT(t), "github"); err != nil || got.Reveal() != ghValue {
			t.Fatalf("Get = %v %v", got, err)
		}
	})

	t.Run("rotation", func(t *testing.T) {
		t.Parallel()
		kvPut(t, root, "rotating", map[string]any{"token": ghValue})
		store := NewStore(map[string]Source{
			"r": v.Source("r", VaultRef{Mount: "secret", Path: "rotating", Field: "token"}),
		}, StoreOptions{Refresh: 200 * time.Millisecond, MaxStale: time.Minute})
		if got, err := store.Get(ctxT(t), "r"); err != nil || got.Reveal() != ghValue {
			t.Fatalf("Get = %v %v", got, err)
		}
		kvPut(t, root, "rotating", map[string]any{"token": rotated})
		rotatedAt := time.Now()
		waitFor(t, 5*time.Second, "the rotated value", func() error {
			got, err := store.Get(ctxT(t), "r")
			if err != nil {
				return err
			}
			if got.Reveal() != rotated {
				return errors.New("still the old value")
			}
			return nil
		})
		t.Logf("rotation picked up after %s (refresh 200ms)", time.Since(rotatedAt).Round(time.Millisecond))
	})
}

// The client takes address, token, namespace and everything else from the options, never from
// VAULT_* variables or the proxy environment. (Not parallel: it sets environment variables.)
func TestVaultIgnoresEnvironment(t *testing.T) {
	srv := vaulttest.Start(t)
	kvPut(t, srv.Client(), "github", map[string]any{"token": ghValue})

	t.Setenv("VAULT_ADDR", "http://127.0.0.1:1")
	t.Setenv("VAULT_AGENT_ADDR", "http://127.0.0.1:1")
	t.Setenv("VAULT_TOKEN", "not-the-token")
	t.Setenv("VAULT_NAMESPACE", "not-a-namespace")
	t.Setenv("VAULT_WRAP_TTL", "5m")
	t.Setenv("VAULT_HEADERS", `{"X-Injected":"1"}`)
	t.Setenv("VAULT_HTTP_PROXY", "http://127.0.0.1:1")
	t.Setenv("VAULT_PROXY_ADDR", "http://127.0.0.1:1")
	t.Setenv("HTTP_PROXY", "http://127.0.0.1:1")
	t.Setenv("http_proxy", "http://127.0.0.1:1")

	v := startVault(t, srv.Addr, rootAuth(t))
	got, err := v.Source("github", VaultRef{Mount: "secret", Path: "github", Field: "token"}).Fetch(ctxT(t))
	if err != nil || got.Reveal() != ghValue {
		t.Fatalf("Fetch = %q, %v", got.Reveal(), err)
	}
	if h := v.client.Headers(); len(h) != 1 || h.Get(api.RequestHeaderName) != "true" {
		t.Fatalf("client headers: %v", h)
	}
}

func TestVaultConfiguration(t *testing.T) {
	t.Parallel()
	unreachable := "http://127.0.0.1:1"
	token := writeFile(t, "some-token")
	empty := writeFile(t, "")
	missing := filepath.Join(t.TempDir(), "missing")
	unset := "CAPBROKER_TEST_UNSET_VAULT_VAR"

	invalid := map[string]struct {
		opts VaultOptions
		want string
	}{
		"no address": {VaultOptions{Dial: vaultDial.Dial, Auth: VaultAuth{Method: AuthToken, TokenFile: token}},
			"vault address is required"},
		"bad scheme": {VaultOptions{Dial: vaultDial.Dial, Address: "unix:///run/vault.sock", Auth: VaultAuth{Method: AuthToken, TokenFile: token}},
			`vault address "unix:///run/vault.sock" must be http(s)://host:port`},
		"credentials in address": {VaultOptions{Dial: vaultDial.Dial, Address: "https://u:p@vault:8200", Auth: VaultAuth{Method: AuthToken, TokenFile: token}},
			"vault address must not contain credentials"},
		"no method": {VaultOptions{Dial: vaultDial.Dial, Address: unreachable},
			"vault auth method is required (token or approle)"},
		"unknown method": {VaultOptions{Dial: vaultDial.Dial, Address: unreachable, Auth: VaultAuth{Method: "kubernetes"}},
			`vault auth method "kubernetes" is not token or approle`},
		"token without source": {VaultOptions{Dial: vaultDial.Dial, Address: unreachable, Auth: VaultAuth{Method: AuthToken}},
			"vault auth token: set an environment variable or a file"},
		"approle without ids": {VaultOptions{Dial: vaultDial.Dial, Address: unreachable, Auth: VaultAuth{Method: AuthAppRole, RoleIDEnv: "A", RoleIDFile: "b"}},
			"vault auth approle role_id: set an environment variable or a file, not both\nvault auth approle secret_id: set an environment variable or a file"},
		"ca file missing": {VaultOptions{Dial: vaultDial.Dial, Address: unreachable, CAFile: missing, Auth: VaultAuth{Method: AuthToken, TokenFile: token}},
			"vault ca_file: open " + missing + ": no such file or directory"},
		"ca file not pem": {VaultOptions{Dial: vaultDial.Dial, Address: unreachable, CAFile: token, Auth: VaultAuth{Method: AuthToken, TokenFile: token}},
			"vault ca_file " + token + ": no PEM certificates"},
	}
	for name, tc := range invalid {
		t.Run(name, func(t *testing.T) {
			_, err := NewVault(tc.opts)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("NewVault error:\n got %v\nwant %s", err, tc.want)
			}
		})
	}

	// Start fails for the broker's own configuration, not for Vault being unreachable.
	start := map[string]struct {
		auth VaultAuth
		want string // "" = Start succeeds
	}{
		"token env unset":      {VaultAuth{Method: AuthToken, TokenEnv: unset}, "vault token: environment variable " + unset + " is not set"},
		"token file empty":     {VaultAuth{Method: AuthToken, TokenFile: empty}, "vault token: " + empty + " is empty"},
		"token file missing":   {VaultAuth{Method: AuthToken, TokenFile: missing}, "vault token: reading " + missing + ": no such file or directory"},
		"secret id missing":    {VaultAuth{Method: AuthAppRole, RoleIDFile: token, SecretIDFile: missing}, "vault approle secret_id: reading " + missing + ": no such file or directory"},
		"token, vault down":    {VaultAuth{Method: AuthToken, TokenFile: token}, ""},
		"approle, vault down":  {VaultAuth{Method: AuthAppRole, RoleIDFile: token, SecretIDFile: token}, ""},
		"approle, custom path": {VaultAuth{Method: AuthAppRole, RoleIDFile: token, SecretIDFile: token, Mount: "/ci-approle/"}, ""},
	}
	for name, tc := range start {
		t.Run(name, func(t *testing.T) {
			v, err := NewVault(VaultOptions{Dial: vaultDial.Dial, Address: unreachable, Auth: tc.auth, Log: testLog(t)})
			must(t, err)
			defer func() { _ = v.Close(context.Background()) }()
			err = v.Start(ctxT(t))
			if got := fmt.Sprint(err); (tc.want == "" && err != nil) || (tc.want != "" && got != tc.want) {
				t.Fatalf("Start error:\n got %v\nwant %q", err, tc.want)
			}
			if err != nil {
				return
			}
			_, err = v.Source("x", VaultRef{Mount: "secret", Path: "x", Field: "f"}).Fetch(ctxT(t))
			if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "connection refused") {
				t.Fatalf("Fetch while Vault is down: %v", err)
			}
		})
	}
}

// appRoleSeed sets up policy, approle and secrets; it is run again after a dev server restart,
// with the same role and secret IDs, as an operator's automation would.
type appRoleSeed struct {
	roleID, secretID string
	tokenTTL, maxTTL string
	kv               map[string]any
}

func (s appRoleSeed) apply(t *testing.T, c *api.Client) {
	t.Helper()
	must(t, c.Sys().PutPolicy("broker", `
path "secret/data/*" { capabilities = ["read"] }
path "sys/leases/revoke" { capabilities = ["update"] }
`))
	must(t, c.Sys().EnableAuthWithOptions("approle", &api.EnableAuthOptions{Type: "approle"}))
	_, err := c.Logical().Write("auth/approle/role/broker", map[string]any{
		"token_policies": "broker", "token_ttl": s.tokenTTL, "token_max_ttl": s.maxTTL,
	})
	must(t, err)
	_, err = c.Logical().Write("auth/approle/role/broker/role-id", map[string]any{"role_id": s.roleID})
	must(t, err)
	_, err = c.Logical().Write("auth/approle/role/broker/custom-secret-id", map[string]any{"secret_id": s.secretID})
	must(t, err)
	kvPut(t, c, "github", s.kv)
}

func (s appRoleSeed) auth(t *testing.T) VaultAuth {
	return VaultAuth{Method: AuthAppRole, RoleIDFile: writeFile(t, s.roleID), SecretIDFile: writeFile(t, s.secretID)}
}

// AppRole with a short token TTL: the token is renewed, and when it reaches its maximum TTL the
// broker logs in again; reads keep working throughout.
func TestVaultAppRoleRenewsThenLogsInAgain(t *testing.T) {
	t.Parallel()
	srv := vaulttest.Start(t)
	root := srv.Client()
	seed := appRoleSeed{roleID: "broker-role", secretID: "broker-secret-id", tokenTTL: "2s", maxTTL: "4s",
		kv: map[string]any{"token": ghValue}}
	seed.apply(t, root)

	v := startVault(t, srv.Addr, seed.auth(t))
	loggedIn := time.Now()
	first := v.accessor()
	if first == "" {
		t.Fatal("no token after Start")
	}
	src := v.Source("github", VaultRef{Mount: "secret", Path: "github", Field: "token"})
	read := func() error {
		got, err := src.Fetch(ctxT(t))
		if err == nil && got.Reveal() != ghValue {
			err = errors.New("wrong value")
		}
		return err
	}

	// Renewed: Vault extends the first token past its 2s TTL.
	waitFor(t, 3*time.Second, "a renewal of the first token", func() error {
		life, err := tokenLifetime(root, first)
		if err != nil {
			return err
		}
		if life <= 2500*time.Millisecond {
			return fmt.Errorf("lifetime %s, not extended past the 2s TTL yet", life)
		}
		return nil
	})
	t.Logf("first token renewed past its TTL %s after login", time.Since(loggedIn).Round(time.Millisecond))

	// Logged in again before the maximum TTL, with reads succeeding on every poll.
	var second string
	waitFor(t, 6*time.Second, "a new login", func() error {
		if err := read(); err != nil {
			t.Fatalf("read failed while the token was being replaced: %v", err)
		}
		if second = v.accessor(); second == first {
			return errors.New("still the first token")
		}
		return nil
	})
	t.Logf("logged in again after %s (token_max_ttl 4s)", time.Since(loggedIn).Round(time.Millisecond))

	// Past the first token's maximum TTL, Vault has dropped it, and reads work with the new one.
	waitFor(t, 4*time.Second, "the first token to expire", func() error {
		if err := read(); err != nil {
			t.Fatalf("read failed: %v", err)
		}
		if _, err := root.Auth().Token().LookupAccessor(first); err == nil {
			return errors.New("first token still valid")
		}
		if time.Since(loggedIn) < 4*time.Second {
			return errors.New("not past token_max_ttl yet")
		}
		return nil
	})
	must(t, read())
	current := v.accessor()
	if _, err := root.Auth().Token().LookupAccessor(current); err != nil {
		t.Fatalf("current token: %v", err)
	}

	// Close revokes the broker's own AppRole token.
	must(t, v.Close(ctxT(t)))
	if _, err := root.Auth().Token().LookupAccessor(current); err == nil {
		t.Fatal("the broker's token is still valid after Close")
	}
}

// tokenLifetime is how long Vault will have let the token live: expire_time - issue_time.
func tokenLifetime(root *api.Client, accessor string) (time.Duration, error) {
	s, err := root.Auth().Token().LookupAccessor(accessor)
	if err != nil {
		return 0, err
	}
	issued, err1 := time.Parse(time.RFC3339Nano, fmt.Sprint(s.Data["issue_time"]))
	expires, err2 := time.Parse(time.RFC3339Nano, fmt.Sprint(s.Data["expire_time"]))
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return expires.Sub(issued), nil
}

// fakeRabbitMQ stands in for RabbitMQ's management API, which Vault's real rabbitmq secrets
// engine calls to create and delete users. Vault itself is real.
type fakeRabbitMQ struct {
	mu      sync.Mutex
	created []string
	deleted []string
}

func (f *fakeRabbitMQ) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	user, ok := strings.CutPrefix(r.URL.Path, "/api/users/")
	f.mu.Lock()
	switch {
	case ok && r.Method == http.MethodPut:
		f.created = append(f.created, user)
	case ok && r.Method == http.MethodDelete:
		f.deleted = append(f.deleted, user)
	}
	f.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (f *fakeRabbitMQ) counts() (created, deleted []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.created...), append([]string(nil), f.deleted...)
}

// A dynamic secret: the lease is renewed while Vault allows, the Store's frequent refreshes do
// not issue new leases, a new secret is issued before the lease reaches its maximum TTL, and
// Close revokes the leases.
//
// Engine choice: the rabbitmq secrets engine issues renewable leases from a plain read
// (rabbitmq/creds/<role>, like database/creds/<role>) and only needs two HTTP endpoints of
// RabbitMQ's management API, served here by fakeRabbitMQ. PKI (generate_lease) issues leases
// that cannot be renewed, and the database engine needs a database server.
func TestVaultLeaseRenewedRefetchedAndRevoked(t *testing.T) {
	t.Parallel()
	mq := &fakeRabbitMQ{}
	mqSrv := httptest.NewServer(mq)
	t.Cleanup(mqSrv.Close)

	srv := vaulttest.Start(t)
	root := srv.Client()
	must(t, root.Sys().Mount("rabbitmq", &api.MountInput{Type: "rabbitmq"}))
	_, err := root.Logical().Write("rabbitmq/config/connection", map[string]any{
		"connection_uri": mqSrv.URL, "username": "admin", "password": "admin", "verify_connection": false,
	})
	must(t, err)
	_, err = root.Logical().Write("rabbitmq/config/lease", map[string]any{"ttl": 2, "max_ttl": 6})
	must(t, err)
	_, err = root.Logical().Write("rabbitmq/roles/agent", map[string]any{"tags": "management"})
	must(t, err)

	v := startVault(t, srv.Addr, rootAuth(t))
	src := v.Source("mq", VaultRef{Path: "rabbitmq/creds/agent", Field: "password", Lease: true}).(*leaseSource)
	store := NewStore(map[string]Source{"mq": src}, StoreOptions{Refresh: 100 * time.Millisecond, MaxStale: time.Minute})
	get := func() string {
		t.Helper()
		s, err := store.Get(ctxT(t), "mq")
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		return s.Reveal()
	}

	issued := time.Now()
	first := get()
	firstLease := src.leaseID()
	if firstLease == "" {
		t.Fatal("no lease")
	}
	// Past the 2s TTL the same secret is served: renewed, not re-issued, despite 100ms refreshes.
	// (Not much longer: near max_ttl Vault's watcher stops renewing, by a random grace, and a
	// new secret is then due; on a loaded machine that can come 3s after the first.)
	waitFor(t, 5*time.Second, "a renewal", func() error {
		if got := get(); got != first {
			t.Fatalf("new secret after %s, before a renewal was seen", time.Since(issued))
		}
		if time.Since(issued) < 2200*time.Millisecond {
			return errors.New("not past the initial TTL yet")
		}
		s, err := root.Sys().Lookup(firstLease)
		if err != nil {
			return err
		}
		if s.Data["last_renewal"] == nil {
			return errors.New("never renewed")
		}
		return nil
	})
	if created, _ := mq.counts(); len(created) != 1 {
		t.Fatalf("%d secrets issued before the first lease's renewal, want 1", len(created))
	}

	// Before the first lease ends (max_ttl 6s), a new secret replaces it. Vault's own expiry
	// time of the first lease is looked up on every poll; the replacement must come before it.
	var second string
	var oldExpiry time.Time
	waitFor(t, 6*time.Second, "a new secret", func() error {
		if second = get(); second != first {
			return nil
		}
		s, err := root.Sys().Lookup(firstLease)
		if err != nil {
			t.Fatalf("the first lease ended before a new secret was issued: %v", err)
		}
		oldExpiry, err = time.Parse(time.RFC3339Nano, fmt.Sprint(s.Data["expire_time"]))
		must(t, err)
		return errors.New("same secret")
	})
	replacedAt := time.Now()
	t.Logf("new secret issued %s after the first, %s before the first lease's expiry (lease ttl 2s, max_ttl 6s)",
		replacedAt.Sub(issued).Round(time.Millisecond), oldExpiry.Sub(replacedAt).Round(time.Millisecond))
	if !replacedAt.Before(oldExpiry) {
		t.Fatalf("replaced at %s, after the first lease expired at %s", replacedAt, oldExpiry)
	}
	secondLease := src.leaseID()
	created, _ := mq.counts()
	if len(created) != 2 {
		t.Fatalf("%d secrets issued, want 2", len(created))
	}

	// Close revokes what is still live: Vault forgets the lease and deletes the RabbitMQ user.
	must(t, v.Close(ctxT(t)))
	if _, err := root.Sys().Lookup(secondLease); err == nil {
		t.Fatal("the current lease is still known to Vault after Close")
	}
	_, deleted := mq.counts()
	if !contains(deleted, created[1]) {
		t.Fatalf("the second secret's user was not deleted: %v", deleted)
	}
	if _, err := src.Fetch(ctxT(t)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Fetch after Close: %v", err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Vault stops mid-test: cached values serve until MaxStale, then ErrUnavailable; Vault comes
// back (empty, as dev servers do, and seeded again): everything recovers without a restart,
// including the AppRole login (the old token is unknown to the new server).
func TestVaultOutageAndRecovery(t *testing.T) {
	t.Parallel()
	srv := vaulttest.Start(t)
	seed := appRoleSeed{roleID: "outage-role", secretID: "outage-secret-id", tokenTTL: "1h", maxTTL: "2h",
		kv: map[string]any{"token": ghValue}}
	seed.apply(t, srv.Client())
	v := startVault(t, srv.Addr, seed.auth(t))

	const refresh, maxStale = 200 * time.Millisecond, 2 * time.Second
	store := NewStore(map[string]Source{
		"github": v.Source("github", VaultRef{Mount: "secret", Path: "github", Field: "token"}),
	}, StoreOptions{Refresh: refresh, MaxStale: maxStale})
	if errs := store.Warm(ctxT(t)); len(errs) != 0 {
		t.Fatal(errs)
	}

	srv.Stop()
	stopped := time.Now()
	var unavailable error
	waitFor(t, maxStale+2*time.Second, "ErrUnavailable after max_stale", func() error {
		got, err := store.Get(ctxT(t), "github")
		if err != nil {
			unavailable = err
			return nil
		}
		if got.Reveal() != ghValue {
			t.Fatalf("wrong cached value")
		}
		return errors.New("still serving the cached value")
	})
	servedFor := time.Since(stopped)
	t.Logf("cached value served for %s after Vault stopped (max_stale %s)", servedFor.Round(time.Millisecond), maxStale)
	if servedFor < maxStale-refresh {
		t.Fatalf("stopped serving the cached value after %s", servedFor)
	}
	if !errors.Is(unavailable, ErrUnavailable) || !strings.Contains(unavailable.Error(), `credential "github": reading vault secret secret/github`) {
		t.Fatalf("error: %v", unavailable)
	}
	if nr := store.NotReady(); !strings.Contains(nr["github"], "connection refused") {
		t.Fatalf("NotReady: %v", nr)
	}

	srv.Restart()
	seed.kv = map[string]any{"token": rotated}
	seed.apply(t, srv.Client())
	restarted := time.Now()
	waitFor(t, 10*time.Second, "recovery", func() error {
		got, err := store.Get(ctxT(t), "github")
		if err != nil {
			return err
		}
		if got.Reveal() != rotated {
			return errors.New("old value")
		}
		return nil
	})
	t.Logf("recovered %s after Vault came back", time.Since(restarted).Round(time.Millisecond))
	if len(store.NotReady()) != 0 {
		t.Fatalf("NotReady after recovery: %v", store.NotReady())
	}
}

// Vault is down when the broker starts: Start succeeds, the credential is not ready, and once
// Vault is up the background login and the Store recover on their own.
func TestVaultUnreachableAtStart(t *testing.T) {
	t.Parallel()
	srv := vaulttest.Start(t)
	srv.Stop()
	seed := appRoleSeed{roleID: "late-role", secretID: "late-secret-id", tokenTTL: "1h", maxTTL: "2h",
		kv: map[string]any{"token": ghValue}}
	v := startVault(t, srv.Addr, seed.auth(t))

	store := NewStore(map[string]Source{
		"github": v.Source("github", VaultRef{Mount: "secret", Path: "github", Field: "token"}),
	}, StoreOptions{Refresh: 200 * time.Millisecond})
	errs := store.Warm(ctxT(t))
	if len(errs) != 1 || !errors.Is(errs[0], ErrUnavailable) ||
		!strings.HasPrefix(errs[0].Error(), `credential "github": not logged in to vault: approle login at auth/approle: `) {
		t.Fatalf("Warm: %v", errs)
	}
	if _, ok := store.NotReady()["github"]; !ok {
		t.Fatal("not listed as not ready")
	}

	srv.Restart()
	seed.apply(t, srv.Client())
	up := time.Now()
	waitFor(t, 15*time.Second, "recovery", func() error {
		_, err := store.Get(ctxT(t), "github")
		return err
	})
	t.Logf("recovered %s after Vault came up", time.Since(up).Round(time.Millisecond))
}

// vaultDial is the Vault tests' injected dial: counted, to show the client used it.
var vaultDial svcdialtest.Recorder
