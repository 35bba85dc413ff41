package integration

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestPolicyEvalUsesConfigPolicyDir: `broker policy eval --config FILE` decides with the
// config's policy.dir, the policy the broker would run, not ./policies; --policies still
// names another one; a config whose policy is a bundle is refused with what to do.
func TestPolicyEvalUsesConfigPolicyDir(t *testing.T) {
	dir := t.TempDir()
	verdict := func(reason string) string {
		return "package broker\n\ndefault decision := {\"allow\": false, \"reason\": \"" + reason + "\"}\n"
	}
	writeFiles(t, dir, map[string]string{
		"policies/broker.rego":    verdict("the default ./policies"),
		"from-config/broker.rego": verdict("the config's policy.dir"),
		"candidate/broker.rego":   verdict("the --policies candidate"),
		"broker.yaml":             "ca: {cert_file: ca.crt, key_file: ca.key}\npolicy: {dir: from-config}\nagents: [{id: a, token_sha256: \"" + strings.Repeat("ab", 32) + "\"}]\n",
		"bundle.yaml":             "ca: {cert_file: ca.crt, key_file: ca.key}\npolicy: {bundle: {url: \"https://127.0.0.1:1/b.tar.gz\"}}\nagents: [{id: a, token_sha256: \"" + strings.Repeat("ab", 32) + "\"}]\n",
	})
	reason := func(args ...string) string {
		t.Helper()
		out, code := run(t, dir, append([]string{"policy", "eval"}, args...)...)
		var d struct{ Reason string }
		if code != 0 || json.Unmarshal([]byte(out), &d) != nil {
			t.Fatalf("policy eval %v: exit %d:\n%s", args, code, out)
		}
		return d.Reason
	}
	req := []string{"--agent", "a", "GET", "https://api.example.test/x"}
	if got := reason(append([]string{"--config", "broker.yaml"}, req...)...); got != "the config's policy.dir" {
		t.Errorf("--config: decided by %q", got)
	}
	if got := reason(append([]string{"--config", "broker.yaml", "--policies", "candidate"}, req...)...); got != "the --policies candidate" {
		t.Errorf("--config and --policies: decided by %q", got)
	}
	if got := reason(req...); got != "the default ./policies" {
		t.Errorf("no --config: decided by %q", got)
	}
	out, code := run(t, dir, append([]string{"policy", "eval", "--config", "bundle.yaml"}, req...)...)
	if code != 1 || !strings.Contains(out, "policy.bundle") || !strings.Contains(out, "--policies") {
		t.Errorf("a bundle config: exit %d:\n%s", code, out)
	}
}
