package credentials

import (
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/vault/api"

	"github.com/capbroker/capbroker/credentials/vaulttest"
)

func TestVaultWriteKV(t *testing.T) {
	t.Parallel()
	srv := vaulttest.Start(t)
	root := srv.Client()
	must(t, root.Sys().Mount("kv1", &api.MountInput{Type: "kv", Options: map[string]string{"version": "1"}}))
	kvPut(t, root, "oauth", map[string]any{"refresh_token": "rt-old", "client_id": "keep-me"})
	_, err := root.Logical().Write("kv1/oauth", map[string]any{"refresh_token": "rt-old", "client_id": "keep-me"})
	must(t, err)
	v := startVault(t, srv.Addr, rootAuth(t))
	ctx := ctxT(t)

	for name, ref := range map[string]VaultRef{
		"kv2":     {Mount: "secret", Path: "oauth", Field: "refresh_token"},
		"kv1":     {Mount: "kv1", Path: "oauth", Field: "refresh_token", KVVersion: 1},
		"kv2 new": {Mount: "secret", Path: "fresh", Field: "refresh_token"},
	} {
		must(t, v.WriteKV(ctx, ref, NewSecret("rt-new-"+name)))
		got, err := v.Source("c", ref).Fetch(ctx)
		if err != nil || got.Reveal() != "rt-new-"+name {
			t.Errorf("%s: read back %v", name, err)
		}
		if name != "kv2 new" {
			other := ref
			other.Field = "client_id"
			if got, err := v.Source("c", other).Fetch(ctx); err != nil || got.Reveal() != "keep-me" {
				t.Errorf("%s: the secret's other field was lost (%v)", name, err)
			}
		}
	}

	// A token that may read but not update is refused, and the error says what it needs.
	_, err = root.Logical().Write("sys/policies/acl/readonly", map[string]any{
		"policy": `path "secret/data/oauth" { capabilities = ["read"] }`,
	})
	must(t, err)
	tok, err := root.Auth().Token().Create(&api.TokenCreateRequest{Policies: []string{"readonly"}})
	must(t, err)
	ro := startVault(t, srv.Addr, VaultAuth{Method: AuthToken, TokenFile: writeFile(t, tok.Auth.ClientToken)})
	err = ro.WriteKV(ctx, VaultRef{Mount: "secret", Path: "oauth", Field: "refresh_token"}, NewSecret("rt-canary-value"))
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "permission denied writing vault secret secret/oauth") ||
		strings.Contains(err.Error(), "rt-canary-value") {
		t.Errorf("read-only token: %v", err)
	}
	if err := v.WriteKV(ctx, VaultRef{Path: "db/creds/x", Field: "f", Lease: true}, NewSecret("x")); err == nil {
		t.Error("a lease was written")
	}
}
