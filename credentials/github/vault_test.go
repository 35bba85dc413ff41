package github

import (
	"context"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"github.com/capbroker/capbroker/internal/svcdial/svcdialtest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/credentials"
	"github.com/capbroker/capbroker/credentials/github/githubtest"
	"github.com/capbroker/capbroker/credentials/vaulttest"
)

// startVault runs a Vault dev server and the broker's client for it (root token from a file).
func startVault(t *testing.T) (*vaulttest.Server, *credentials.Vault) {
	t.Helper()
	srv := vaulttest.Start(t)
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte(srv.RootToken), 0o600); err != nil {
		t.Fatal(err)
	}
	v, err := credentials.NewVault(credentials.VaultOptions{Dial: (&svcdialtest.Recorder{}).Dial, Address: srv.Addr, Timeout: 5 * time.Second,
		Auth: credentials.VaultAuth{Method: credentials.AuthToken, TokenFile: tokFile}, Log: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = v.Close(context.Background()) })
	return srv, v
}

// transitKey enables the transit engine and creates an rsa-2048 key; it returns the public key.
func transitKey(t *testing.T, root *api.Client, name string) *rsa.PublicKey {
	t.Helper()
	if err := root.Sys().Mount("transit", &api.MountInput{Type: "transit"}); err != nil && !strings.Contains(err.Error(), "already in use") {
		t.Fatal(err)
	}
	if _, err := root.Logical().Write("transit/keys/"+name, map[string]any{"type": "rsa-2048"}); err != nil {
		t.Fatal(err)
	}
	s, err := root.Logical().Read("transit/keys/" + name)
	if err != nil {
		t.Fatal(err)
	}
	k := s.Data["keys"].(map[string]any)["1"].(map[string]any)["public_key"].(string)
	block, _ := pem.Decode([]byte(k))
	pub, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return pub.(*rsa.PublicKey)
}

// The app JWT is signed by Vault's transit engine; the stand-in verifies it with the public
// key Vault publishes, and the broker never holds the private key.
func TestTransitSignedJWT(t *testing.T) {
	srv, v := startVault(t)
	pub := transitKey(t, srv.Client(), "gh-app")
	sign := func(ctx context.Context, in []byte) ([]byte, error) {
		return v.TransitSignRS256(ctx, "transit", "gh-app", in)
	}
	f := setup(t, func(so *githubtest.Options, ao *Options) {
		so.PublicKey = pub
		ao.PrivateKey, ao.SignRS256 = nil, sign
	})
	tok := f.token(t, r1write)
	if repos, _, ok := f.srv.Scope(tok); !ok || len(repos) != 1 {
		t.Fatalf("token not issued for the scope: %v", repos)
	}
	if f.srv.JWTFailures() != 0 {
		t.Fatal("the transit-signed JWT did not verify")
	}

	// A key GitHub does not know: the JWT is refused.
	transitKey(t, srv.Client(), "not-the-app")
	g := setup(t, func(so *githubtest.Options, ao *Options) {
		so.PublicKey = pub
		ao.PrivateKey = nil
		ao.SignRS256 = func(ctx context.Context, in []byte) ([]byte, error) {
			return v.TransitSignRS256(ctx, "transit", "not-the-app", in)
		}
	})
	if _, err := g.app.Token(ctxT(t), nil); !errors.Is(err, credentials.ErrUnavailable) || !strings.Contains(err.Error(), "401") {
		t.Fatalf("JWT from another transit key: %v", err)
	}

	// Vault refuses (no such key): unavailable, classed as a signing failure.
	h := setup(t, func(so *githubtest.Options, ao *Options) {
		ao.PrivateKey = nil
		ao.SignRS256 = func(ctx context.Context, in []byte) ([]byte, error) {
			return v.TransitSignRS256(ctx, "transit", "missing", in)
		}
	})
	_, err := h.app.Token(ctxT(t), nil)
	if !errors.Is(err, credentials.ErrUnavailable) || h.app.Status().LastError != "signing the app JWT failed" {
		t.Fatalf("missing transit key: %v, status %+v", err, h.app.Status())
	}
	if h.srv.Mints() != 0 {
		t.Fatal("the endpoint was asked without a signed JWT")
	}
}

// The private key as a PEM in a Vault KV field, read through the broker's Store.
func TestKVPrivateKeyThroughStore(t *testing.T) {
	srv, v := startVault(t)
	keys(t)
	if _, err := srv.Client().Logical().Write("secret/data/github-app", map[string]any{"data": map[string]any{"private_key": appPEM}}); err != nil {
		t.Fatal(err)
	}
	store := credentials.NewStore(map[string]credentials.Source{
		"gh_app": v.Source("gh_app", credentials.VaultRef{Mount: "secret", Path: "github-app", Field: "private_key", KVVersion: 2}),
	}, credentials.StoreOptions{})
	f := setup(t, func(_ *githubtest.Options, ao *Options) {
		ao.PrivateKey = func(ctx context.Context) (credentials.Secret, error) { return store.Get(ctx, "gh_app") }
	})
	f.token(t, r1write)
	if f.srv.JWTFailures() != 0 {
		t.Fatal("the JWT signed with the KV key did not verify")
	}
}

// Vault down with transit: cached tokens serve until shortly before they expire, then the
// credential is unavailable; no mint reaches GitHub without a signed JWT.
func TestVaultDownServesCachedTokens(t *testing.T) {
	srv, v := startVault(t)
	pub := transitKey(t, srv.Client(), "gh-app")
	f := setup(t, func(so *githubtest.Options, ao *Options) {
		so.PublicKey = pub
		ao.PrivateKey = nil
		ao.SignRS256 = func(ctx context.Context, in []byte) ([]byte, error) {
			return v.TransitSignRS256(ctx, "transit", "gh-app", in)
		}
	})
	t1 := f.token(t, r1write)
	srv.Stop()
	f.clk.Advance(56 * time.Minute)
	if got := f.token(t, r1write); got != t1 {
		t.Fatal("the cached token did not serve while Vault is down")
	}
	waitFor(t, "the background mint to fail", func() bool { return f.app.Status().LastError != "" })
	if st := f.app.Status(); st.LastError != "signing the app JWT failed" || !st.Ready {
		t.Fatalf("status %+v", st)
	}
	f.clk.Advance(4 * time.Minute)
	_, err := f.app.Token(ctxT(t), r1write)
	if !errors.Is(err, credentials.ErrUnavailable) {
		t.Fatalf("expired token with Vault down: %v", err)
	}
	f.assertClean(t, err)
	if f.srv.Mints() != 1 {
		t.Fatalf("mints = %d: the endpoint was asked without a signed JWT", f.srv.Mints())
	}
}
