package config

import (
	"strings"
	"testing"
	"time"
)

// TestCAVaultPKI: ca.vault_pki defaults, its sign path, and every way to get it wrong, each by
// its key path.
func TestCAVaultPKI(t *testing.T) {
	const base = "policy: {dir: p}\nvault: {address: \"http://127.0.0.1:8200\", auth: {method: token, token_env: T}}\n"
	c, err := Parse([]byte(base + "ca: {vault_pki: {}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	p := c.CA.VaultPKI
	if p.Mount != "pki" || p.TTL != DefaultCATTL || p.CommonName != DefaultCACommonName || p.SignPath() != "pki/root/sign-intermediate" {
		t.Fatalf("defaults: %+v, path %s", p, p.SignPath())
	}
	c, err = Parse([]byte(base + "ca: {vault_pki: {mount: /pki_int/, issuer: broker-issuer, ttl: 20s}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p := c.CA.VaultPKI; p.SignPath() != "pki_int/issuer/broker-issuer/sign-intermediate" || p.TTL != 20*time.Second {
		t.Fatalf("path %s ttl %s", p.SignPath(), p.TTL)
	}
	for src, want := range map[string]string{
		"ca: {vault_pki: {}, cert_file: c, key_file: k}\n":                  "ca: set either cert_file and key_file or vault_pki, not both",
		"ca: {vault_pki: {ttl: 5s}}\n":                                      "ca.vault_pki.ttl: must be between 10s and 720h",
		"ca: {vault_pki: {ttl: 721h}}\n":                                    "ca.vault_pki.ttl: must be between 10s and 720h",
		"ca: {vault_pki: {mount: \"pki/../sys\"}}\n":                        "ca.vault_pki.mount: must be a Vault mount path",
		"ca: {vault_pki: {mount: \"pki?x=1\"}}\n":                           "ca.vault_pki.mount: must be a Vault mount path",
		"ca: {vault_pki: {issuer: \"a/b\"}}\n":                              "ca.vault_pki.issuer: must be an issuer name",
		"ca: {vault_pki: {common_name: \"a\\nb\"}}\n":                       "ca.vault_pki.common_name: must be at most 64 printable characters",
		"ca: {vault_pki: {common_name: " + strings.Repeat("x", 65) + "}}\n": "ca.vault_pki.common_name",
		"ca: {vault_pki: {path: pki}}\n":                                    "ca.vault_pki.path",
		"ca: {}\n":                                                          "ca.cert_file: required",
	} {
		if _, err := Parse([]byte(base + src)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want %q", src, err, want)
		}
	}
	if _, err := Parse([]byte("policy: {dir: p}\nca: {vault_pki: {}}\n")); err == nil || !strings.Contains(err.Error(), "vault: required: ca.vault_pki signs through it") {
		t.Errorf("vault_pki without vault: %v", err)
	}
}
