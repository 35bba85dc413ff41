package integration

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	vaultapi "github.com/hashicorp/vault/api"

	"github.com/capbroker/capbroker/credentials/vaulttest"
)

// TestVaultCredentialsEndToEnd runs the broker against a real Vault dev server: KV v2 and v1
// values injected, a rotation picked up and both values scrubbed, an outage served from the
// cache until max_stale and then refused with 503, and recovery when Vault is back.
func TestVaultCredentialsEndToEnd(t *testing.T) {
	vault := vaulttest.Start(t)
	vc := vault.Client()
	v2 := func(value string) {
		t.Helper()
		if _, err := vc.KVv2("secret").Put(t.Context(), "broker/api", map[string]any{"token": value}); err != nil {
			t.Fatal(err)
		}
	}
	seed := func(kv2, kv1 string) {
		t.Helper()
		v2(kv2)
		if err := vc.Sys().Mount("kv1", &vaultapi.MountInput{Type: "kv", Options: map[string]string{"version": "1"}}); err != nil && !strings.Contains(err.Error(), "path is already in use") {
			t.Fatal(err)
		}
		if _, err := vc.Logical().Write("kv1/app", map[string]any{"key": kv1}); err != nil {
			t.Fatal(err)
		}
	}
	kv2Old, kv2New, kv1 := "v2-first-"+randHex(8), "v2-second-"+randHex(8), "v1-key-"+randHex(8)
	seed(kv2Old, kv1)

	var mu sync.Mutex
	echoOld := "" // a value the upstream leaks back, to prove old values are scrubbed too
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		old := echoOld
		mu.Unlock()
		fmt.Fprintf(w, "auth=%s key=%s old=%s", r.Header.Get("Authorization"), r.Header.Get("X-Api-Key"), old)
	})
	e := newEnv(t, envOpts{
		handler: echo,
		extraCredentials: `  - name: vault-kv2
    hosts: ["127.0.0.1"]
    source: {vault: {mount: secret, path: broker/api, field: token}}
    inject: {header: Authorization, value: "Bearer {{secret}}"}
  - name: vault-kv1
    hosts: ["127.0.0.1"]
    source: {vault: {mount: kv1, path: app, field: key, kv_version: 1}}
    inject: {header: X-Api-Key, value: "{{secret}}"}`,
		extraConfig: fmt.Sprintf(`vault:
  address: %s
  refresh_interval: 200ms
  max_stale: 2s
  auth: {method: token, token_env: BROKER_VAULT_TOKEN}
`, vault.Addr),
		env: []string{"BROKER_VAULT_TOKEN=" + vault.RootToken},
	})
	client := e.broker.client(t, agentID, e.token)
	get := func() (int, string) {
		t.Helper()
		resp, err := client.Get(e.url("/vault/echo"))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	lastAuth := func() string {
		r := e.received()
		if len(r) == 0 {
			return ""
		}
		return r[len(r)-1].Header.Get("Authorization") + " " + r[len(r)-1].Header.Get("X-Api-Key")
	}
	// until repeats real requests (each one a full round trip through the broker) until cond
	// holds; the bound is on the number of requests, not on time.
	until := func(what string, cond func(status int, body string) bool) {
		t.Helper()
		for i := 0; i < 2000; i++ {
			if status, body := get(); cond(status, body) {
				return
			}
		}
		t.Fatalf("never saw: %s", what)
	}

	status, body := get()
	if status != 200 || lastAuth() != "Bearer "+kv2Old+" "+kv1 {
		t.Fatalf("KV v2 and v1 injection: %d %q, upstream saw %q", status, body, lastAuth())
	}
	if body != "auth=Bearer [REDACTED] key=[REDACTED] old=" {
		t.Fatalf("agent saw %q", body)
	}

	// Rotation: the new value is injected within the refresh interval, and a response that
	// leaks the old value is scrubbed too.
	v2(kv2New)
	mu.Lock()
	echoOld = kv2Old
	mu.Unlock()
	until("the rotated value injected", func(int, string) bool { return lastAuth() == "Bearer "+kv2New+" "+kv1 })
	if _, body := get(); strings.Contains(body, kv2Old) || strings.Contains(body, kv2New) || !strings.Contains(body, "old=[REDACTED]") {
		t.Fatalf("after rotation the agent saw %q", body)
	}

	// Outage: cached values keep serving, then 503 once they are max_stale old.
	vault.Stop()
	if status, _ := get(); status != 200 {
		t.Fatalf("right after Vault stopped: %d, want 200 from the cache", status)
	}
	// Expiry is a matter of time passing: watch /readyz (cheap, bounded in count) until the
	// broker reports the credential stale.
	for i := 0; !e.broker.notReady(t, "vault-kv2"); i++ {
		if i == 100000 {
			t.Fatal("the credential never went stale")
		}
	}
	after := len(e.received())
	if status, body := get(); status != 503 || !strings.Contains(body, `"error":"credential_unavailable"`) || len(e.received()) != after {
		t.Fatalf("after max_stale: %d %q; want 503 credential_unavailable and nothing forwarded", status, body)
	}

	// Recovery without restarting the broker.
	vault.Restart()
	kv2Third := "v2-third-" + randHex(8)
	seed(kv2Third, kv1)
	until("recovery after Vault restart", func(status int, _ string) bool {
		return status == 200 && lastAuth() == "Bearer "+kv2Third+" "+kv1
	})
	for _, v := range []string{kv2Old, kv2New, kv2Third, kv1} {
		if strings.Contains(strings.Join(e.broker.auditLog.snapshot(), "\n")+e.broker.logs.String(), v) {
			t.Fatalf("a Vault value appears in the broker's logs")
		}
	}
}

func TestCheckConfigReadsVaultCredentials(t *testing.T) {
	vault := vaulttest.Start(t)
	secret := "checked-" + randHex(8)
	if _, err := vault.Client().KVv2("secret").Put(t.Context(), "broker/app", map[string]any{"token": secret}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if out, code := run(t, dir, "ca", "init", "--out", "ca"); code != 0 {
		t.Fatal(out)
	}
	os.MkdirAll(filepath.Join(dir, "policies"), 0o755)
	os.WriteFile(filepath.Join(dir, "policies", "broker.rego"), []byte(testPolicy), 0o644)
	os.WriteFile(filepath.Join(dir, "vault-token"), []byte(vault.RootToken+"\n"), 0o600)
	cfg := filepath.Join(dir, "broker.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`ca: {cert_file: ca/ca.crt, key_file: ca/ca.key}
policy: {dir: policies}
vault:
  address: %s
  auth: {method: token, token_file: vault-token}
credentials:
  - name: good
    hosts: ["api.example.com"]
    source: {vault: {mount: secret, path: broker/app, field: token}}
    inject: {header: Authorization, value: "Bearer {{secret}}"}
  - name: nofield
    hosts: ["api.example.com"]
    source: {vault: {mount: secret, path: broker/app, field: password}}
    inject: {header: X-Key, value: "{{secret}}"}
  - name: nosecret
    hosts: ["api.example.com"]
    source: {vault: {mount: secret, path: broker/missing, field: token}}
    inject: {header: X-Other, value: "{{secret}}"}
`, vault.Addr)), 0o600)
	out, code := run(t, dir, "check-config", "--config", cfg)
	if code != 1 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{`credential "nofield"`, `has no field "password"`, `credential "nosecret"`, "not found"} {
		if !strings.Contains(out, want) {
			t.Errorf("check-config output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, `credential "good"`) || strings.Contains(out, secret) {
		t.Fatalf("check-config reported the readable credential or printed a value:\n%s", out)
	}
}
