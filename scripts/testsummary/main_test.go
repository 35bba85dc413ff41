package main

import (
	"strings"
	"testing"
)

// A run as go test -json reports it: one pass, one fail, skips for Vault and for root.
const run = `{"Action":"start","Package":"example.com/m/credentials"}
{"Action":"run","Package":"example.com/m/credentials","Test":"TestVaultLogin"}
{"Action":"output","Package":"example.com/m/credentials","Test":"TestVaultLogin","Output":"=== RUN   TestVaultLogin\n"}
{"Action":"output","Package":"example.com/m/credentials","Test":"TestVaultLogin","Output":"    vault_test.go:40: vaulttest: no Vault binary: set VAULT_BIN, put vault on PATH\n"}
{"Action":"output","Package":"example.com/m/credentials","Test":"TestVaultLogin","Output":"--- SKIP: TestVaultLogin (0.00s)\n"}
{"Action":"skip","Package":"example.com/m/credentials","Test":"TestVaultLogin"}
{"Action":"run","Package":"example.com/m/credentials","Test":"TestEnv"}
{"Action":"output","Package":"example.com/m/credentials","Test":"TestEnv","Output":"=== RUN   TestEnv\n"}
{"Action":"output","Package":"example.com/m/credentials","Test":"TestEnv","Output":"    env_test.go:9: a log line a passing test wrote\n"}
{"Action":"pass","Package":"example.com/m/credentials","Test":"TestEnv"}
{"Action":"output","Package":"example.com/m/credentials","Output":"PASS\n"}
{"Action":"output","Package":"example.com/m/credentials","Output":"ok  \texample.com/m/credentials\t0.1s\n"}
{"Action":"pass","Package":"example.com/m/credentials"}
{"Action":"run","Package":"example.com/m/integration","Test":"TestNetns"}
{"Action":"output","Package":"example.com/m/integration","Test":"TestNetns","Output":"    netns_test.go:30: some setup\n"}
{"Action":"output","Package":"example.com/m/integration","Test":"TestNetns","Output":"    netns_test.go:31: skipped: needs root\n"}
{"Action":"skip","Package":"example.com/m/integration","Test":"TestNetns"}
{"Action":"run","Package":"example.com/m/integration","Test":"TestBroken"}
{"Action":"output","Package":"example.com/m/integration","Test":"TestBroken","Output":"=== RUN   TestBroken\n"}
{"Action":"output","Package":"example.com/m/integration","Test":"TestBroken","Output":"    broken_test.go:5: want 200, got 403\n"}
{"Action":"output","Package":"example.com/m/integration","Test":"TestBroken","Output":"--- FAIL: TestBroken (0.01s)\n"}
{"Action":"fail","Package":"example.com/m/integration","Test":"TestBroken"}
{"Action":"output","Package":"example.com/m/integration","Output":"FAIL\texample.com/m/integration\t0.2s\n"}
{"Action":"fail","Package":"example.com/m/integration"}
`

func TestSummary(t *testing.T) {
	var out strings.Builder
	s := newSummary(&out)
	s.read(strings.NewReader(run))
	code := s.report(&out, "")
	got := out.String()
	for _, want := range []string{
		"ok  \texample.com/m/credentials\t0.1s\n",
		"    broken_test.go:5: want 200, got 403\n--- FAIL: TestBroken (0.01s)\n",
		"1 tests passed, 1 failed, 2 skipped\n",
		"1 skipped [not allowed]: vaulttest: no Vault binary: set VAULT_BIN, put vault on PATH\n      credentials.TestVaultLogin\n",
		"1 skipped: skipped: needs root\n      integration.TestNetns\n",
		"CAPBROKER_ALLOW_SKIP=vault",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the summary lacks %q:\n%s", want, got)
		}
	}
	for _, not := range []string{"=== RUN", "a log line a passing test wrote", "PASS\n"} {
		if strings.Contains(got, not) {
			t.Errorf("the summary prints %q, which a plain go test does not:\n%s", not, got)
		}
	}
	if code != 1 {
		t.Errorf("a Vault skip without %s=vault: exit code %d, want 1", allowVar, code)
	}
	for _, allow := range []string{"vault", "root, vault"} {
		if code := s.report(&strings.Builder{}, allow); code != 0 {
			t.Errorf("%s=%q: exit code %d, want 0", allowVar, allow, code)
		}
	}
	if code := s.report(&strings.Builder{}, "vaultx"); code != 1 {
		t.Errorf("%s=vaultx allowed the Vault skip", allowVar)
	}
	for _, reason := range []string{
		"vaulttest: VAULT_BIN=/opt/vault is not a file",
		"skipped: no Vault binary: exec: vault: not found",
	} {
		if kindOf(reason) != "vault" {
			t.Errorf("the skip %q is not counted as a Vault skip", reason)
		}
	}
	if kindOf("skipped: needs root") != "" {
		t.Errorf("a root skip is counted as a required kind")
	}
}
