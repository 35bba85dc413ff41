package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/internal/harness"
)

// TestAgentEnv: `broker agent-env` gives an agent's shell the proxy (with the agent's token),
// NO_PROXY, the CA for every client, and placeholders for each credential's SDK variables in
// the shapes the SDKs expect; never a secret; a placeholder credential's variables hold its
// placeholder, which is what the broker replaces.
func TestAgentEnv(t *testing.T) {
	dir := t.TempDir()
	const token = "agent-token-0123456789"
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := `ca: {cert_file: ca/ca.crt, key_file: ca/ca.key}
policy: {dir: policies}
agents:
  - {id: coder-1, token_file: token}
  - {id: hashed, token_sha256: "` + strings.Repeat("ab", 32) + `"}
credentials:
  - name: openai
    hosts: [api.openai.com]
    source: {env: CANARY_OPENAI}
    inject: {header: Authorization, value: "Bearer {{secret}}"}
  - name: internal
    hosts: [api.internal.example]
    source: {env: CANARY_INTERNAL}
    inject: {placeholder: "PLACEHOLDER_internal_0001"}
    agent_env: [INTERNAL_API_KEY]
  - name: aws
    hosts: ["s3.us-east-1.amazonaws.com"]
    source: {env: CANARY_AWS}
    aws_sigv4: {}
`
	path := filepath.Join(dir, "broker.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code := run(t, dir, "agent-env", "--config", path, "--agent", "coder-1", "--proxy", "broker:8080", "--ca-file", "/etc/broker/ca.crt", "--format", "env")
	if code != 0 {
		t.Fatalf("agent-env: %d %s", code, out)
	}
	env := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(line, "=")
		env[k] = v
	}
	for k, want := range map[string]string{
		"HTTPS_PROXY":         "http://coder-1:" + token + "@broker:8080",
		"no_proxy":            "127.0.0.1,localhost",
		"SSL_CERT_FILE":       "/etc/broker/ca.crt",
		"NODE_EXTRA_CA_CERTS": "/etc/broker/ca.crt",
		"AWS_CA_BUNDLE":       "/etc/broker/ca.crt",
		"INTERNAL_API_KEY":    "PLACEHOLDER_internal_0001",
	} {
		if env[k] != want {
			t.Errorf("%s=%q, want %q", k, env[k], want)
		}
	}
	for k, re := range map[string]string{
		"OPENAI_API_KEY":        `^sk-[A-Za-z0-9-]{20,}$`,
		"AWS_ACCESS_KEY_ID":     `^AKIA[A-Z0-9]{16}$`,
		"AWS_SECRET_ACCESS_KEY": `^[A-Za-z0-9/+]{40}$`,
	} {
		if !regexp.MustCompile(re).MatchString(env[k]) {
			t.Errorf("%s=%q does not look like %s", k, env[k], re)
		}
	}

	// As export lines, in a shell; an agent whose token the broker cannot read gets a reference.
	out, code = run(t, dir, "agent-env", "--config", path, "--agent", "hashed")
	if code != 0 {
		t.Fatalf("agent-env sh: %d %s", code, out)
	}
	sh := exec.Command("bash", "-euc", out+`
printf '%s\n' "$HTTPS_PROXY" "$AWS_ACCESS_KEY_ID"`)
	sh.Env = append(harness.Env(), "CAPBROKER_AGENT_TOKEN=from-the-sandbox")
	got, err := sh.CombinedOutput()
	if err != nil {
		t.Fatalf("the export lines do not run in bash: %v\n%s\n%s", err, out, got)
	}
	if lines := strings.Split(strings.TrimSpace(string(got)), "\n"); lines[0] != "http://hashed:from-the-sandbox@127.0.0.1:8080" || lines[1] != env["AWS_ACCESS_KEY_ID"] {
		t.Fatalf("in bash: %q", lines)
	}

	if out, code := run(t, dir, "agent-env", "--config", path, "--agent", "nobody"); code != 1 || !strings.Contains(out, `no agent "nobody"`) {
		t.Fatalf("unknown agent: %d %s", code, out)
	}
	if out, code := run(t, dir, "agent-env", "--config", path); code != 2 || !strings.Contains(out, "--agent is required") {
		t.Fatalf("no --agent: %d %s", code, out)
	}
}
