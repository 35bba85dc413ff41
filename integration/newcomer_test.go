package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNode20PreloadUsesTheProxy follows docs/clients.md on the Node the tests have (20): an
// unchanged script's fetch goes through the broker once the documented module is preloaded
// with NODE_OPTIONS, and what `broker agent-env` prints next to NODE_USE_ENV_PROXY (which
// Node 20 ignores) says so.
func TestNode20PreloadUsesTheProxy(t *testing.T) {
	modules := nodeModules(t)
	preload := docSnippets(t)["node-preload"]
	if preload == "" {
		t.Fatal("docs/clients.md has no snippet test:node-preload")
	}
	e := newClientsEnv(t, "")
	dir := t.TempDir()
	if err := os.Symlink(modules, filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	const agent = "const res = await fetch(process.argv[2]); console.log('status', res.status, (await res.text()).length > 0);\n"
	for name, text := range map[string]string{"capbroker-proxy.mjs": preload, "agent.mjs": agent} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := e.run(dir, e.agentEnv("NODE_OPTIONS=--import="+filepath.Join(dir, "capbroker-proxy.mjs")), "node", "agent.mjs", e.url("/open/node20"))
	if !strings.Contains(out, "status 200 true") {
		t.Fatalf("node with the preload printed:\n%s", out)
	}
	if !strings.Contains(strings.Join(e.broker.auditLog.snapshot(), "\n"), `"path":"/open/node20"`) {
		t.Fatalf("the broker did not see the request; audit log:\n%s", strings.Join(e.broker.auditLog.snapshot(), "\n"))
	}

	// What agent-env prints for Node: the note is a comment, in the shell format only.
	cfgDir := t.TempDir()
	cfg := "ca: {cert_file: ca/ca.crt, key_file: ca/ca.key}\npolicy: {dir: policies}\nagents:\n  - {id: coder-1, token_env: T}\n"
	if err := os.WriteFile(filepath.Join(cfgDir, "broker.yaml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	sh, code := run(t, cfgDir, "agent-env", "--config", "broker.yaml", "--agent", "coder-1", "--proxy", "broker:8080")
	if code != 0 {
		t.Fatalf("agent-env: %d %s", code, sh)
	}
	before, _, ok := strings.Cut(sh, "export NODE_USE_ENV_PROXY=1\n")
	if !ok || !strings.Contains(before, "# Node 24+") || !strings.Contains(before, "Node 20 ignores it") || !strings.Contains(before, "NODE_OPTIONS=--import") {
		t.Errorf("agent-env does not say what Node 20 needs before NODE_USE_ENV_PROXY:\n%s", sh)
	}
	env, _ := run(t, cfgDir, "agent-env", "--config", "broker.yaml", "--agent", "coder-1", "--proxy", "broker:8080", "--format", "env")
	if strings.Contains(env, "#") {
		t.Errorf("agent-env --format env prints comments:\n%s", env)
	}
}
