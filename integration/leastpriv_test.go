package integration

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/credentials/github/githubtest"
)

// githubShippedPolicy puts the shipped policies/github.rego (and graphql.rego, paths.rego) in
// front of the test upstream, as the shipped policy does for api.github.com.
const githubShippedPolicy = `package broker

import data.github

default decision := {"allow": false, "reason": "not the GitHub API"}

decision := {"allow": true, "intercept": true} if input.phase == "connect"

decision := github.decision if input.phase == "request"
`

// shippedGitHubFiles are the shipped GitHub rules with data.yaml's settings.github replaced.
func shippedGitHubFiles(t *testing.T, settings string) map[string]string {
	t.Helper()
	files := map[string]string{"data.yaml": settings}
	for _, f := range []string{"github.rego", "graphql.rego", "paths.rego"} {
		b, err := os.ReadFile(filepath.Join("..", "policies", f))
		if err != nil {
			t.Fatal(err)
		}
		files[f] = string(b)
	}
	return files
}

// repositoryAdministration is what "write" on a repository must never reach: each request
// a hostile agent holding write on o/r sends to take the repository over.
var repositoryAdministration = []struct{ name, method, path, body string }{
	{"make it public", "PATCH", "/repos/o/r", `{"private":false}`},
	{"rename it", "PATCH", "/repos/O/R", `{"name":"gone"}`},
	{"add a webhook", "POST", "/repos/o/r/hooks", `{"config":{"url":"https://evil.example/"}}`},
	{"repoint a webhook", "PATCH", "/repos/o/r/hooks/1/config", `{"url":"https://evil.example/"}`},
	{"add a deploy key", "POST", "/repos/o/r/keys", `{"key":"ssh-ed25519 AAAA","read_only":false}`},
	{"add a collaborator", "PUT", "/repos/o/r/collaborators/mallory", `{"permission":"admin"}`},
	{"transfer it", "POST", "/repos/o/r/transfer", `{"new_owner":"mallory"}`},
	{"set an Actions secret", "PUT", "/repos/o/r/actions/secrets/NPM_TOKEN", `{"encrypted_value":"x","key_id":"1"}`},
	{"set an Actions variable", "POST", "/repos/o/r/actions/variables", `{"name":"X","value":"y"}`},
	{"set an environment secret", "PUT", "/repos/o/r/environments/prod/secrets/KEY", `{}`},
	{"drop branch protection", "PUT", "/repos/o/r/branches/main/protection", `{"required_status_checks":null}`},
	{"relax required reviews", "PATCH", "/repos/o/r/branches/main/protection/required_pull_request_reviews", `{}`},
	{"add a ruleset", "POST", "/repos/o/r/rulesets", `{}`},
	{"merge a pull request", "PUT", "/repos/o/r/pulls/1/merge", `{}`},
	{"write the default branch", "PUT", "/repos/o/r/contents/README.md", `{"message":"x","content":"eA=="}`},
}

// TestLeastPrivGitHubWriteIsNotAdministration: an agent whose repository is listed as write
// gets its issues, comments and pull requests through with the credential, and every
// request that administers the repository is a 403 naming why, never sent upstream, audited
// as a deny without credentials.
func TestLeastPrivGitHubWriteIsNotAdministration(t *testing.T) {
	e := newEnv(t, envOpts{
		mode:   "enforce",
		policy: githubShippedPolicy,
		policyFiles: shippedGitHubFiles(t, `settings:
  github:
    credential: canary
    repositories: {read: [], write: [o/r]}
    paths: []
    graphql:
      mutations: {`+agentID+`: [addComment, updateRepository, createBranchProtectionRule]}
`),
		extraConfig: "protocols:\n  graphql: [{hosts: [\"127.0.0.1\"], path: /graphql}]\n",
	})

	for _, c := range []struct{ method, path, body string }{
		{"POST", "/repos/o/r/issues", `{"title":"t"}`},
		{"POST", "/repos/o/r/issues/1/comments", `{"body":"b"}`},
		{"POST", "/repos/o/r/pulls", `{"head":"h","base":"main"}`},
		{"POST", "/repos/o/r/pulls/1/reviews", `{"event":"COMMENT"}`},
	} {
		before := len(e.received())
		out, err := e.curl("-i", "-X", c.method, "-H", "Content-Type: application/json", "-d", c.body, e.url(c.path))
		if err != nil || !hasStatus(out, 200) {
			t.Fatalf("%s %s: want 200: %v\n%s", c.method, c.path, err, out)
		}
		if got := e.received(); len(got) != before+1 || got[before].Header.Get("Authorization") != "Bearer "+e.canary {
			t.Fatalf("%s %s did not reach the upstream with the credential", c.method, c.path)
		}
	}

	for _, c := range repositoryAdministration {
		t.Run(c.name, func(t *testing.T) {
			before := len(e.received())
			out, err := e.curl("-i", "-X", c.method, "-H", "Content-Type: application/json", "-d", c.body, e.url(c.path))
			if err != nil || !hasStatus(out, 403) {
				t.Fatalf("want 403: %v\n%s", err, out)
			}
			_, body, _ := strings.Cut(out, "\r\n\r\n")
			var b map[string]string
			if err := json.Unmarshal([]byte(body), &b); err != nil || !strings.Contains(b["reason"], "is not part of write on repository o/r") {
				t.Fatalf("403 without the reason: %v\n%s", err, body)
			}
			if n := len(e.received()); n != before {
				t.Fatal("the upstream received a request that administers the repository")
			}
			ev := e.broker.waitAudit(t, headerValue(out, "X-Broker-Request-Id"))
			if ev["decision"] != "deny" || ev["reason"] != b["reason"] {
				t.Fatalf("audit: %v", ev)
			}
			if creds, _ := ev["credentials"].([]any); len(creds) != 0 {
				t.Fatalf("audit: credentials %v on a deny", creds)
			}
		})
	}

	// GraphQL: a mutation that administers is refused even when listed for the agent.
	for _, m := range []string{"updateRepository", "createBranchProtectionRule"} {
		before := len(e.received())
		q := fmt.Sprintf(`{"query":"mutation AddComment { %s(input: {repositoryId: \"R_1\"}) { clientMutationId } }"}`, m)
		out, err := e.curl("-i", "-H", "Content-Type: application/json", "-d", q, e.url("/graphql"))
		if err != nil || !hasStatus(out, 403) || !strings.Contains(out, "GraphQL mutation "+m+" is not part of write") {
			t.Fatalf("GraphQL %s: want 403: %v\n%s", m, err, out)
		}
		if len(e.received()) != before {
			t.Fatalf("the upstream received GraphQL %s", m)
		}
	}
	e.assertNoCanaryLeaked()
}

// TestLeastPrivPolicyEvalShipped: `broker policy eval` with the shipped policies and data
// refuses every administration request on the repository data.yaml lists as write.
func TestLeastPrivPolicyEvalShipped(t *testing.T) {
	dir := t.TempDir()
	shipped, err := filepath.Abs(filepath.Join("..", "policies"))
	if err != nil {
		t.Fatal(err)
	}
	// The github credential bound to api.github.com, as a deployment of the shipped policy has it.
	writeTestFile(t, filepath.Join(dir, "broker.yaml"), []byte(`ca: {cert_file: ca.crt, key_file: ca.key}
policy: {dir: policies}
agents: [{id: a, token_sha256: "`+strings.Repeat("ab", 32)+`"}]
credentials:
  - name: github
    hosts: ["api.github.com"]
    source: {env: GITHUB_TOKEN}
    inject: {header: Authorization, value: "Bearer {{secret}}"}
`))
	eval := func(method, path string) map[string]any {
		out, code := run(t, dir, "policy", "eval", "--policies", shipped, "--config", "broker.yaml", "--agent", "a", method, "https://api.github.com"+path)
		var d map[string]any
		if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &d); err != nil {
			t.Fatalf("policy eval %s %s: exit %d: %v\n%s", method, path, code, err, out)
		}
		return d
	}
	if d := eval("POST", "/repos/capbroker/sandbox/issues"); d["allow"] != true {
		t.Fatalf("writing an issue of the shipped write repository: %v", d)
	}
	for _, c := range repositoryAdministration {
		path := strings.Replace(strings.Replace(c.path, "/o/r", "/capbroker/sandbox", 1), "/O/R", "/CapBroker/Sandbox", 1)
		d := eval(c.method, path)
		if d["allow"] != false || d["credentials"] != nil && len(d["credentials"].([]any)) != 0 {
			t.Errorf("%s: %s %s: %v", c.name, c.method, path, d)
		}
		if r, _ := d["reason"].(string); !strings.Contains(r, "is not part of write on repository capbroker/sandbox") {
			t.Errorf("%s: reason %q", c.name, r)
		}
	}
}

// TestLeastPrivGitHubAppPermissions: with a github_app credential, the shipped policy mints
// for writing an issue a token of that repository with issues:write alone (what the GitHub
// stand-in was asked for), and mints nothing for a request that administers the repository.
func TestLeastPrivGitHubAppPermissions(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	gh := githubtest.Start(t, githubtest.Options{AppID: "4242", InstallationID: 77, PublicKey: &key.PublicKey, Repos: []string{"r1", "r2"}})
	agentToken := randHex(16)
	files := shippedGitHubFiles(t, `settings:
  github:
    credential: gh_app
    app: true
    repositories: {read: [o/r2], write: [o/r1]}
    paths: []
`)
	b := startBroker(t, brokerOpts{
		policy: githubShippedPolicy,
		files:  files,
		mode:   "enforce",
		config: fmt.Sprintf(`upstream:
  ca_file: %q
  allow_private: ["127.0.0.1/32"]
agents:
  - {id: %s, token_env: CODER1_TOKEN}
credentials:
  - name: gh_app
    hosts: ["127.0.0.1"]
    source: {env: GH_APP_KEY}
    github_app: {app_id: "4242", installation_id: 77, api_url: %q}
`, gh.CAFile, agentID, gh.URL),
		env: []string{"CODER1_TOKEN=" + agentToken, "GH_APP_KEY=" + string(pemKey)},
	})
	e := &env{t: t, broker: b, token: agentToken}

	out, err := e.curl("-i", "-X", "POST", "-H", "Content-Type: application/json", "-d", `{"title":"t"}`, gh.URL+"/repos/o/r1/issues")
	if err != nil || !hasStatus(out, 201) {
		t.Fatalf("creating an issue: %v\n%s", err, out)
	}
	asked := gh.Asked()
	if len(asked) != 1 || !slices.Equal(asked[0].Repositories, []string{"r1"}) || !maps.Equal(asked[0].Permissions, map[string]string{"issues": "write"}) {
		t.Fatalf("the token for an issue was asked as %+v; want repositories [r1], permissions issues:write", asked)
	}

	for _, c := range repositoryAdministration {
		path := strings.NewReplacer("/o/r", "/o/r1", "/O/R", "/O/R1").Replace(c.path)
		out, err := e.curl("-i", "-X", c.method, "-H", "Content-Type: application/json", "-d", c.body, gh.URL+path)
		if err != nil || !hasStatus(out, 403) || !strings.Contains(out, "is not part of write on repository o/r1") {
			t.Fatalf("%s: want 403: %v\n%s", c.name, err, out)
		}
	}
	if n := len(gh.Asked()); n != 1 {
		t.Fatalf("%d tokens minted after the refused requests, want still 1", n)
	}
	for _, s := range gh.Seen() {
		if !strings.HasPrefix(s, "POST /app/installations/") && s != "POST /repos/o/r1/issues bearer" {
			t.Fatalf("the GitHub stand-in saw %q", s)
		}
	}
}

// TestLeastPrivLearnSemantic: a monitor-mode recording under a policy that reads neither
// input.mcp nor input.graphql nor input.jsonrpc still records them for the protocols
// endpoints; the draft learned from it, run by a broker in enforce mode, lets the seen MCP
// tool, GraphQL mutation field and JSON-RPC method through, and denies an unseen tool,
// `mutation AddNote { deleteEverything }` (the seen operation's name, another field) and an
// unseen method, none of which reaches the upstream.
func TestLeastPrivLearnSemantic(t *testing.T) {
	protocols := "protocols:\n" +
		"  mcp: [{hosts: [\"127.0.0.1\"], path: /open/mcp}]\n" +
		"  graphql: [{hosts: [\"127.0.0.1\"], path: /open/graphql}]\n" +
		"  jsonrpc: [{hosts: [\"127.0.0.1\"], path: /open/rpc}]\n"
	e := newEnv(t, envOpts{mode: "monitor", inputLevel: "metadata", extraConfig: protocols})
	const (
		echo      = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"message":"learn-arg-value-k2"}}}`
		list      = `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
		deleteRep = `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"delete_repository","arguments":{}}}`
		addNote   = `{"query":"mutation AddNote { addNote(body: \"x\") { id } }"}`
		deleteAll = `{"query":"mutation AddNote { deleteEverything { id } }"}`
		renamed   = `{"query":"mutation Renamed { addNote(body: \"y\") { id } }"}`
		viewer    = `{"query":"query { viewer { login } }"}`
		ethCall   = `{"jsonrpc":"2.0","id":1,"method":"eth_call","params":[]}`
		ethSend   = `{"jsonrpc":"2.0","id":1,"method":"eth_sendTransaction","params":[]}`
	)
	post := func(e *env, path, body string) (string, error) {
		return e.curl("-i", "-H", "Content-Type: application/json", "-d", body, e.url(path))
	}
	var ids []string
	for _, c := range [][2]string{{"/open/mcp", echo}, {"/open/mcp", list}, {"/open/graphql", addNote}, {"/open/graphql", viewer}, {"/open/rpc", ethCall}} {
		out, err := post(e, c[0], c[1])
		if err != nil || !hasStatus(out, 200) {
			t.Fatalf("recording %s: %v\n%s", c[1], err, out)
		}
		ids = append(ids, headerValue(out, "X-Broker-Request-Id"))
	}
	for _, id := range ids {
		ev := e.broker.waitAudit(t, id)
		in, _ := ev["input"].(map[string]any)
		if in["mcp"] == nil && in["graphql"] == nil && in["jsonrpc"] == nil {
			t.Fatalf("the recorded input carries no protocol meaning: %v", in)
		}
	}

	dir := t.TempDir()
	logFile, draft := filepath.Join(dir, "audit.jsonl"), filepath.Join(dir, "draft")
	if err := os.WriteFile(logFile, []byte(strings.Join(e.broker.auditLog.snapshot(), "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := run(t, dir, "policy", "learn", "--from", logFile, "--out", draft); code != 0 {
		t.Fatalf("policy learn: exit %d\n%s", code, out)
	}
	if out, code := run(t, dir, "policy", "test", draft); code != 0 {
		t.Fatalf("policy test of the draft: exit %d\n%s", code, out)
	}
	data, err := os.ReadFile(filepath.Join(draft, "learned.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, never := range []string{"learn-arg-value-k2", "AddNote", "delete_repository"} {
		if strings.Contains(string(data), never) {
			t.Errorf("learned.json carries %q", never)
		}
	}
	rego, err := os.ReadFile(filepath.Join(draft, "learned.rego"))
	if err != nil {
		t.Fatal(err)
	}

	// The draft enforced by a broker in front of the same upstream.
	b := startBroker(t, brokerOpts{
		policy: string(rego),
		files:  map[string]string{"learned.json": string(data)},
		mode:   "enforce",
		config: canaryConfig(e.pki.File, []string{agentID}, protocols+"audit: {include_input: metadata}\n"),
		env:    []string{tokenEnv(agentID) + "=" + e.token, "CANARY_SECRET=" + e.canary},
	})
	enforced := &env{t: t, pki: e.pki, up: e.up, broker: b, canary: e.canary, token: e.token}
	for _, c := range []struct {
		path, body string
		allow      bool
		reason     string
	}{
		{"/open/mcp", echo, true, ""},
		{"/open/mcp", list, true, ""},
		{"/open/mcp", deleteRep, false, "MCP tools/call delete_repository"},
		{"/open/mcp", "[" + echo + "," + deleteRep + "]", false, "MCP tools/call delete_repository"},
		{"/open/graphql", addNote, true, ""},
		{"/open/graphql", renamed, true, ""},
		{"/open/graphql", deleteAll, false, "GraphQL mutation deleteEverything"},
		{"/open/graphql", viewer, true, ""},
		{"/open/rpc", ethCall, true, ""},
		{"/open/rpc", ethSend, false, "JSON-RPC eth_sendTransaction"},
	} {
		before := len(e.received())
		out, err := post(enforced, c.path, c.body)
		if err != nil {
			t.Fatal(err)
		}
		if c.allow {
			if !hasStatus(out, 200) || len(e.received()) != before+1 {
				t.Errorf("seen %s on %s: want 200 and sent\n%s", c.body, c.path, out)
			}
			continue
		}
		// A JSON-RPC request with an id is refused with an error response to it (HTTP 200),
		// which an MCP or JSON-RPC client reads; the audit event keeps the 403.
		want := 403
		if c.path != "/open/graphql" {
			want = 200
		}
		if !hasStatus(out, want) || !strings.Contains(out, c.reason) || want == 200 && !strings.Contains(out, `"error":{"code":-32000`) {
			t.Errorf("unseen %s on %s: want %d naming %q\n%s", c.body, c.path, want, c.reason, out)
		}
		if len(e.received()) != before {
			t.Errorf("unseen %s on %s reached the upstream", c.body, c.path)
		}
		ev := b.waitAudit(t, headerValue(out, "X-Broker-Request-Id"))
		if ev["decision"] != "deny" || !strings.Contains(fmt.Sprint(ev["reason"]), c.reason) {
			t.Errorf("audit of %s: %v", c.body, ev)
		}
	}
}
