package integration

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	vaultapi "github.com/hashicorp/vault/api"

	"github.com/capbroker/capbroker/credentials/github/githubtest"
	"github.com/capbroker/capbroker/credentials/vaulttest"
	"github.com/capbroker/capbroker/internal/harness"
)

// githubPolicy intercepts tunnels to 127.0.0.1 and grants the App's token narrowed to
// writing the contents of r1.
const githubPolicy = `package broker

default decision := {"allow": false, "reason": "not allowed by the test policy"}

decision := {"allow": true, "intercept": true} if {
	input.phase == "connect"
	input.request.host == "127.0.0.1"
}

decision := {"allow": true, "credentials": [{"name": "gh_app", "scope": {"repositories": ["r1"], "permissions": {"contents": "write"}}}]} if {
	input.phase == "request"
	input.request.host == "127.0.0.1"
}
`

// TestGitHubAppThroughBroker: git clone and push, and curl to the API, as an agent holding no
// credential, against a GitHub stand-in that checks the app JWT with the App's public key and
// enforces each token's scope. The App's key is in Vault: as a transit key that never leaves
// it, or as a PEM in KV. The tokens never reach the agent, the audit or the log, and are
// revoked when the broker stops.
func TestGitHubAppThroughBroker(t *testing.T) {
	for _, mode := range []string{"transit", "kv"} {
		t.Run(mode, func(t *testing.T) { testGitHubApp(t, mode) })
	}
}

func testGitHubApp(t *testing.T, mode string) {
	vault := vaulttest.Start(t)
	vc := vault.Client()
	var pub *rsa.PublicKey
	source := ""
	transit := ""
	switch mode {
	case "transit":
		if err := vc.Sys().Mount("transit", &vaultapi.MountInput{Type: "transit"}); err != nil {
			t.Fatal(err)
		}
		if _, err := vc.Logical().Write("transit/keys/gh-app", map[string]any{"type": "rsa-2048"}); err != nil {
			t.Fatal(err)
		}
		s, err := vc.Logical().Read("transit/keys/gh-app")
		if err != nil {
			t.Fatal(err)
		}
		block, _ := pem.Decode([]byte(s.Data["keys"].(map[string]any)["1"].(map[string]any)["public_key"].(string)))
		k, err := x509.ParsePKIXPublicKey(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		pub = k.(*rsa.PublicKey)
		transit = ", transit: {mount: transit, key: gh-app}"
	case "kv":
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatal(err)
		}
		pub = &key.PublicKey
		p := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
		if _, err := vc.KVv2("secret").Put(t.Context(), "github-app", map[string]any{"private_key": string(p)}); err != nil {
			t.Fatal(err)
		}
		source = "\n    source: {vault: {mount: secret, path: github-app, field: private_key}}"
	}

	root := t.TempDir()
	git := func(dir string, args ...string) (string, error) {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(harness.Env(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t",
			"GIT_COMMITTER_EMAIL=t@t", "GIT_CONFIG_NOSYSTEM=1", "HOME="+root, "GIT_TERMINAL_PROMPT=0")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	mustGit := func(dir string, args ...string) string {
		t.Helper()
		out, err := git(dir, args...)
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return out
	}
	gitRoot := filepath.Join(root, "served")
	for _, name := range []string{"r1", "r2"} {
		src := filepath.Join(root, "src-"+name)
		mustGit(root, "init", "-q", "-b", "main", src)
		if err := os.WriteFile(filepath.Join(src, "README"), []byte("this is "+name+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		mustGit(src, "add", "README")
		mustGit(src, "commit", "-q", "-m", "first")
		mustGit(root, "clone", "-q", "--bare", src, filepath.Join(gitRoot, "o", name+".git"))
	}

	gh := githubtest.Start(t, githubtest.Options{AppID: "4242", InstallationID: 77, PublicKey: pub, Repos: []string{"r1", "r2"}, GitRoot: gitRoot})
	agentToken := randHex(16)
	b := startBroker(t, brokerOpts{
		policy: githubPolicy,
		mode:   "enforce",
		config: fmt.Sprintf(`upstream:
  ca_file: %q
  allow_private: ["127.0.0.1/32"]
agents:
  - {id: %s, token_env: CODER1_TOKEN}
vault:
  address: %s
  auth: {method: token, token_env: BROKER_VAULT_TOKEN}
credentials:
  - name: gh_app
    hosts: ["127.0.0.1"]%s
    github_app: {app_id: "4242", installation_id: 77, api_url: %q%s}
`, gh.CAFile, agentID, vault.Addr, source, gh.URL, transit),
		env: []string{"CODER1_TOKEN=" + agentToken, "BROKER_VAULT_TOKEN=" + vault.RootToken},
	})

	proxy := b.proxyURL(agentID, agentToken)
	agentEnv := []string{"HTTPS_PROXY=" + proxy, "https_proxy=" + proxy, "NO_PROXY=", "no_proxy=",
		"GIT_SSL_CAINFO=" + b.caFile, "CURL_CA_BUNDLE=" + b.caFile}
	var seenByAgent []string // everything git and curl printed
	agentGit := func(dir string, args ...string) (string, error) {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(harness.Env(), append(agentEnv, "GIT_AUTHOR_NAME=a", "GIT_AUTHOR_EMAIL=a@a", "GIT_COMMITTER_NAME=a",
			"GIT_COMMITTER_EMAIL=a@a", "GIT_CONFIG_NOSYSTEM=1", "HOME="+t.TempDir(), "GIT_TERMINAL_PROMPT=0", "GIT_TRACE_CURL=1", "GIT_TRACE_CURL_NO_DATA=1")...)
		out, err := cmd.CombinedOutput()
		seenByAgent = append(seenByAgent, string(out))
		return string(out), err
	}
	curl := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("curl", append([]string{"-sS", "--max-time", "20", "--suppress-connect-headers", "-i"}, args...)...)
		cmd.Env = append(harness.Env(), agentEnv...)
		out, err := cmd.CombinedOutput()
		seenByAgent = append(seenByAgent, string(out))
		if err != nil {
			t.Fatalf("curl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}

	// The token endpoint down and nothing cached: 503 credential_unavailable, nothing sent.
	gh.SetFault(githubtest.Down)
	if out := curl(gh.URL + "/repos/o/r1"); !hasStatus(out, 503) || !strings.Contains(out, "credential_unavailable") {
		t.Fatalf("with the token endpoint down: %s", out)
	}
	if slices.Contains(gh.Seen(), "GET /repos/o/r1 none") {
		t.Fatal("the request was sent without its credential")
	}
	gh.SetFault(githubtest.None)
	// Once the broker's backoff (1 s) has passed, it mints again.
	for deadline := time.Now().Add(waitTimeout); ; {
		if out := curl(gh.URL + "/repos/o/r1"); hasStatus(out, 200) {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("no recovery after the token endpoint came back: %s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Clone and push r1: the token is minted for r1 with contents:write.
	work := t.TempDir()
	clone := filepath.Join(work, "r1")
	if out, err := agentGit(work, "clone", "-q", gh.URL+"/o/r1.git", clone); err != nil {
		t.Fatalf("git clone r1 through the broker: %v\n%s", err, out)
	}
	if got, _ := os.ReadFile(filepath.Join(clone, "README")); string(got) != "this is r1\n" {
		t.Fatalf("cloned README: %q", got)
	}
	if err := os.WriteFile(filepath.Join(clone, "CHANGE"), []byte("pushed by the agent\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := agentGit(clone, "add", "CHANGE"); err != nil {
		t.Fatal(out)
	}
	if out, err := agentGit(clone, "commit", "-q", "-m", "agent change"); err != nil {
		t.Fatal(out)
	}
	if out, err := agentGit(clone, "push", "-q", "origin", "main"); err != nil {
		t.Fatalf("git push r1 through the broker: %v\n%s", err, out)
	}
	local := strings.TrimSpace(mustGit(clone, "rev-parse", "HEAD"))
	served := strings.TrimSpace(mustGit(filepath.Join(gitRoot, "o", "r1.git"), "rev-parse", "main"))
	if local != served {
		t.Fatalf("the push did not reach the served repository: %s != %s", local, served)
	}

	// r2 is outside the token's scope: the stand-in refuses it.
	if out, err := agentGit(work, "clone", "-q", gh.URL+"/o/r2.git", filepath.Join(work, "r2")); err == nil {
		t.Fatalf("git clone r2 succeeded with a token for r1 only\n%s", out)
	}

	// The API with Bearer: r1 is readable, an issue cannot be opened (no issues permission).
	if out := curl(gh.URL + "/repos/o/r1"); !hasStatus(out, 200) || !strings.Contains(out, `"full_name":"o/r1"`) {
		t.Fatalf("GET /repos/o/r1: %s", out)
	}
	if out := curl(gh.URL + "/repos/o/r2"); !hasStatus(out, 404) {
		t.Fatalf("GET /repos/o/r2: %s", out)
	}
	if out := curl("-X", "POST", "-d", `{"title":"x"}`, gh.URL+"/repos/o/r1/issues"); !hasStatus(out, 403) {
		t.Fatalf("POST an issue without the issues permission: %s", out)
	}
	// An upstream that echoes the credential: the agent sees it scrubbed.
	if out := curl(gh.URL + "/echo/authorization"); !hasStatus(out, 200) || !strings.Contains(out, "[REDACTED]") {
		t.Fatalf("echoed Authorization: %s", out)
	}

	// What reached the stand-in: git with Basic auth, the API with Bearer.
	for _, want := range []string{"GET /o/r1.git/info/refs basic", "POST /o/r1.git/git-upload-pack basic",
		"POST /o/r1.git/git-receive-pack basic", "GET /repos/o/r1 bearer", "POST /repos/o/r1/issues bearer"} {
		if !slices.Contains(gh.Seen(), want) {
			t.Errorf("the stand-in never saw %q; it saw %v", want, gh.Seen())
		}
	}
	issued := gh.Issued()
	if len(issued) != 1 {
		t.Errorf("%d tokens minted for one scope, want 1", len(issued))
	}
	if repos, perms, _ := gh.Scope(issued[0]); !slices.Equal(repos, []string{"r1"}) || perms["contents"] != "write" || perms["issues"] != "" {
		t.Errorf("the token's scope at GitHub: %v %v", repos, perms)
	}
	resp, err := http.Get("http://" + b.adminAddr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	ready, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(ready), "gh_app") {
		t.Errorf("/readyz: %d %s", resp.StatusCode, ready)
	}

	// SIGTERM: every token is revoked at GitHub before the broker exits.
	if err := b.stop(t); err != nil {
		t.Fatalf("broker exit: %v", err)
	}
	if revoked := gh.Revoked(); !slices.Equal(revoked, issued) {
		t.Errorf("revoked %d of %d tokens at stop", len(revoked), len(issued))
	}
	cfg, _ := os.ReadFile(filepath.Join(clone, ".git", "config"))
	places := map[string]string{
		"what git and curl saw": strings.Join(seenByAgent, "\n") + string(cfg) + string(ready),
		"the audit log":         strings.Join(b.auditLog.snapshot(), "\n"),
		"the broker log":        b.logs.String(),
	}
	for _, tok := range issued {
		for where, text := range places {
			if strings.Contains(text, tok) {
				t.Errorf("a minted token appears in %s", where)
			}
		}
	}
	if strings.Contains(b.logs.String(), "PRIVATE KEY") {
		t.Error("the App's key appears in the broker log")
	}
}

// TestCheckConfigSignsGitHubAppJWT: check-config signs an app JWT for each github_app
// credential, so a transit key that is missing or a KV value that is not a key shows before
// the broker runs, by key path, without the value.
func TestCheckConfigSignsGitHubAppJWT(t *testing.T) {
	vault := vaulttest.Start(t)
	vc := vault.Client()
	if err := vc.Sys().Mount("transit", &vaultapi.MountInput{Type: "transit"}); err != nil {
		t.Fatal(err)
	}
	if _, err := vc.Logical().Write("transit/keys/gh-app", map[string]any{"type": "rsa-2048"}); err != nil {
		t.Fatal(err)
	}
	notAKey := "not-a-pem-" + randHex(8)
	if _, err := vc.KVv2("secret").Put(t.Context(), "github-app", map[string]any{"private_key": notAKey}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if out, code := run(t, dir, "ca", "init", "--out", "ca"); code != 0 {
		t.Fatal(out)
	}
	if err := os.MkdirAll(filepath.Join(dir, "policies"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "policies", "broker.rego"), []byte(githubPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "vault-token"), []byte(vault.RootToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "broker.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`ca: {cert_file: ca/ca.crt, key_file: ca/ca.key}
policy: {dir: policies}
vault:
  address: %s
  auth: {method: token, token_file: vault-token}
credentials:
  - name: gh_app
    hosts: ["127.0.0.1"]
    github_app: {app_id: "1", installation_id: 2, transit: {key: gh-app}}
  - name: gh_missing
    hosts: ["127.0.0.1"]
    github_app: {app_id: "1", installation_id: 2, transit: {key: no-such-key}}
  - name: gh_badpem
    hosts: ["127.0.0.1"]
    source: {vault: {mount: secret, path: github-app, field: private_key}}
    github_app: {app_id: "1", installation_id: 2}
`, vault.Addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code := run(t, dir, "check-config", "--config", cfg)
	if code != 1 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{`credentials[1].github_app: credential "gh_missing"`, `credentials[2].source: credential "gh_badpem"`, "not an RSA private key"} {
		if !strings.Contains(out, want) {
			t.Errorf("check-config output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, `"gh_app"`) || strings.Contains(out, notAKey) {
		t.Errorf("check-config output names the good credential or shows a value:\n%s", out)
	}
}
