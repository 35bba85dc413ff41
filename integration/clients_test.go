package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/capbroker/capbroker/internal/harness"
)

// clientsPolicy lets tunnels reach 127.0.0.1 only, and decides inside them: the admin area
// and pushes are refused with reasons, a chat completion is allowed for one model only.
const clientsPolicy = `package broker

default decision := {"allow": false, "reason": "not allowed by the clients test policy"}

decision := {"allow": true, "intercept": true} if {
	input.phase == "connect"
	input.request.host == "127.0.0.1"
}

decision := {"allow": false, "reason": sprintf("%s is not on the clients test's host list", [input.request.host])} if {
	input.phase == "connect"
	input.request.host != "127.0.0.1"
}

decision := {"allow": false, "reason": "the /admin area is off limits"} if {
	input.phase == "request"
	startswith(input.request.path, "/admin")
}

decision := {"allow": true} if {
	input.phase == "request"
	startswith(input.request.path, "/open/")
}

decision := {"allow": true, "credentials": ["git"]} if {
	input.phase == "request"
	startswith(input.request.path, "/git/")
	not pushing
}

decision := {"allow": false, "reason": "pushing is not allowed from this sandbox"} if {
	input.phase == "request"
	pushing
}

pushing if input.request.query.service == ["git-receive-pack"]

pushing if endswith(input.request.path, "/git-receive-pack")

decision := {"allow": true, "credentials": ["canary"]} if {
	input.phase == "request"
	endswith(input.request.path, "/v1/chat/completions")
	input.request.body.model == "allowed-model"
}

decision := {"allow": false, "reason": sprintf("model %s is not allowed", [input.request.body.model])} if {
	input.phase == "request"
	endswith(input.request.path, "/v1/chat/completions")
	input.request.body.model != "allowed-model"
}
`

// deniedHost is refused at CONNECT; the broker never resolves or dials it.
const deniedHost = "denied.example.com"

const connectReason = "denied: " + deniedHost + " is not on the clients test's host list"

// docSnippets are the fenced blocks of docs/clients.md whose info string names a test
// ("```sh test:curl"), by that name.
func docSnippets(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../docs/clients.md")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?ms)^```\\w+ test:([\\w-]+)\n(.*?)^```")
	out := map[string]string{}
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		out[m[1]] = m[2]
	}
	return out
}

// nodeModules is where scripts/install-test-tools.sh installs the Node packages.
func nodeModules(t *testing.T) string {
	t.Helper()
	dir, _ := filepath.Abs("testdata/node/node_modules")
	for _, tool := range []string{"node", "curl", "git", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			requireTool(t, tool+" is missing")
		}
	}
	for _, pkg := range []string{"openai", "undici", "@anthropic-ai/sdk"} {
		if _, err := os.Stat(filepath.Join(dir, pkg, "package.json")); err != nil {
			requireTool(t, "the Node package "+pkg+" is missing from "+dir)
		}
	}
	return dir
}

// requireTool fails the test in CI, where scripts/install-test-tools.sh has run, and skips
// it elsewhere.
func requireTool(t *testing.T, what string) {
	t.Helper()
	if os.Getenv("CI") != "" || os.Getenv("CAPBROKER_REQUIRE_VAULT") == "1" {
		t.Fatalf("%s: run scripts/install-test-tools.sh", what)
	}
	t.Skipf("skipped: %s (run scripts/install-test-tools.sh)", what)
}

// agentEnv is the environment docs/clients.md tells an agent shell to set.
func (e *env) agentEnv(extra ...string) []string {
	proxy := e.broker.proxyURL(agentID, e.token)
	ca := e.broker.caFile
	return append(append(harness.Env(), "HTTPS_PROXY="+proxy, "https_proxy="+proxy, "HTTP_PROXY="+proxy, "http_proxy="+proxy,
		"NO_PROXY=", "no_proxy=", "SSL_CERT_FILE="+ca, "CURL_CA_BUNDLE="+ca, "REQUESTS_CA_BUNDLE="+ca,
		"NODE_EXTRA_CA_CERTS="+ca, "GIT_SSL_CAINFO="+ca, "GIT_TERMINAL_PROMPT=0", "GIT_CONFIG_NOSYSTEM=1"), extra...)
}

// run runs a client as the agent and returns what it printed (stdout and stderr).
func (e *env) run(dir string, env []string, name string, args ...string) string {
	e.t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = dir, env
	out, _ := cmd.CombinedOutput()
	return string(out)
}

// nodeScript writes a snippet as an ES module in a folder that sees the test's node_modules.
func nodeScript(t *testing.T, modules, code string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Symlink(modules, filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "snippet.mjs")
	if err := os.WriteFile(p, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// newClientsEnv is an env with clientsPolicy whose upstream also answers chat completions
// under /api/custom/v1 (the base URL the SDK is given), saying which Authorization it got.
func newClientsEnv(t *testing.T, gitRoot string) *env {
	t.Helper()
	completions := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","created":1,"model":"allowed-model","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"hello, auth=%s"}}]}`,
			r.Header.Get("Authorization"))
	})
	return newEnv(t, envOpts{policy: clientsPolicy, gitRoot: gitRoot, handler: completions})
}

// TestClientsSeeWhyTheyWereRefused runs each client of docs/clients.md through the broker and
// checks that what it prints says why it was refused: in the CONNECT status line, or in a
// body in the shape the client reads.
func TestClientsSeeWhyTheyWereRefused(t *testing.T) {
	modules := nodeModules(t)
	snips := docSnippets(t)
	for _, name := range []string{"curl", "curl-connect", "python-urllib", "python-requests", "node-fetch", "openai", "git"} {
		if snips[name] == "" {
			t.Fatalf("docs/clients.md has no snippet test:%s", name)
		}
	}
	e := newClientsEnv(t, "")
	env := e.agentEnv()
	api := func(s string) string { return strings.ReplaceAll(s, "https://api.example.com", e.up.URL) }
	deniedURL := "https://" + deniedHost + "/"
	const adminReason = "the /admin area is off limits"

	checks := []struct {
		name string
		out  func() string
		want []string
	}{
		{"curl request", func() string { return e.run("", env, "sh", "-c", api(snips["curl"])) },
			[]string{`"error":"denied"`, `"reason":"` + adminReason + `"`, `"hint":"`}},
		{"curl connect", func() string {
			return e.run("", env, "sh", "-c", strings.ReplaceAll(snips["curl-connect"], "https://"+deniedHost+"/", deniedURL))
		}, []string{"< HTTP/1.1 403 " + connectReason}},
		{"curl anthropic-style", func() string {
			return e.run("", env, "curl", "-sS", "-H", "content-type: application/json", "-d", `{"model":"m"}`, e.url("/anthropic/v1/messages"))
		}, []string{`{"type":"error","error":{"type":"permission_error","message":"capbroker denied: not allowed by the clients test policy. `,
			`"code":"denied"`, `"reason":"not allowed by the clients test policy"`, `"agent":"coder-1"`}},
		{"urllib request", func() string { return e.run("", env, "python3", "-c", snips["python-urllib"], e.url("/admin/x")) },
			[]string{"403 " + adminReason}},
		{"urllib connect", func() string { return e.run("", env, "python3", "-c", snips["python-urllib"], deniedURL) },
			[]string{"Tunnel connection failed: 403 " + connectReason}},
		{"node fetch request", func() string {
			return e.run("", env, "node", nodeScript(t, modules, snips["node-fetch"]), e.url("/admin/x"))
		}, []string{"403 {", `"reason":"` + adminReason + `"`}},
		{"node fetch connect", func() string {
			return e.run("", env, "node", nodeScript(t, modules, snips["node-fetch"]), deniedURL)
		}, []string{"fetch failed", "Proxy response (403) !== 200 when HTTP Tunneling"}},
		{"openai sdk", func() string {
			return e.run("", append(env, "OPENAI_API_KEY=dummy", "OPENAI_BASE_URL="+e.url("/api/custom/v1")), "node", nodeScript(t, modules, snips["openai"]))
		}, []string{"PermissionDeniedError 403 capbroker denied: model gpt-4o is not allowed. " + "This request is not allowed"}},
		{"openai sdk allowed", func() string {
			return e.run("", append(env, "OPENAI_API_KEY=dummy", "OPENAI_BASE_URL="+e.url("/api/custom/v1")), "node",
				nodeScript(t, modules, strings.ReplaceAll(snips["openai"], "gpt-4o", "allowed-model")))
		}, []string{"hello, auth=Bearer [REDACTED]"}},
	}
	if exec.Command("python3", "-c", "import requests").Run() == nil {
		checks = append(checks,
			struct {
				name string
				out  func() string
				want []string
			}{"requests request", func() string { return e.run("", env, "python3", "-c", snips["python-requests"], e.url("/admin/x")) },
				[]string{"403 " + adminReason}},
			struct {
				name string
				out  func() string
				want []string
			}{"requests connect", func() string { return e.run("", env, "python3", "-c", snips["python-requests"], deniedURL) },
				[]string{"Tunnel connection failed: 403 " + connectReason}},
		)
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			out := c.out()
			t.Logf("printed:\n%s", out)
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, "dummy") && c.name != "openai sdk" {
				t.Errorf("output shows the dummy key: %s", out)
			}
		})
	}

	t.Run("go net/http", func(t *testing.T) {
		_, err := e.broker.client(t, agentID, e.token).Get(deniedURL)
		if err == nil || !strings.Contains(err.Error(), connectReason) {
			t.Fatalf("Go client error: %v", err)
		}
		resp, err := e.broker.client(t, agentID, e.token).Get(e.url("/admin/x"))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b map[string]string
		if err := json.NewDecoder(resp.Body).Decode(&b); err != nil || resp.StatusCode != 403 || b["reason"] != adminReason {
			t.Fatalf("Go client: %d %v %v", resp.StatusCode, b, err)
		}
	})

	// The dummy key never reached the upstream: the broker set the credential.
	for _, r := range e.received() {
		if strings.Contains(r.Header.Get("Authorization"), "dummy") {
			t.Errorf("the upstream received the dummy key on %s", r.URL.Path)
		}
	}
}

// TestGitSeesWhyAndItsChallengeIsNoDeny: git prints the policy's reason as remote: lines, and
// the 407 it asks for before it sends proxy credentials is audited and counted as a challenge.
func TestGitSeesWhyAndItsChallengeIsNoDeny(t *testing.T) {
	nodeModules(t) // the tools
	snips := docSnippets(t)
	root := t.TempDir()
	home := t.TempDir()
	gitEnv := append(harness.Env(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t",
		"GIT_CONFIG_NOSYSTEM=1", "HOME="+home)
	git := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir, cmd.Env = dir, gitEnv
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	src := filepath.Join(root, "src")
	git(root, "init", "-q", "-b", "main", src)
	if err := os.WriteFile(filepath.Join(src, "README"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git(src, "add", "README")
	git(src, "commit", "-q", "-m", "first")
	git(root, "clone", "-q", "--bare", src, filepath.Join(root, "repos", "repo.git"))
	git(filepath.Join(root, "repos", "repo.git"), "config", "http.receivepack", "true")

	e := newClientsEnv(t, filepath.Join(root, "repos"))
	env := e.agentEnv("HOME=" + home)
	work := t.TempDir()

	// ls-remote: allowed; no deny, and at most one challenge per connection it made.
	mark := e.broker.auditLog.mark()
	out := e.run(work, env, "git", "ls-remote", e.url("/git/repo.git"))
	if !strings.Contains(out, "refs/heads/main") {
		t.Fatalf("git ls-remote: %s", out)
	}
	// The last request of ls-remote is audited before git exits: wait for it, then count.
	e.broker.waitAuditWhere(t, 1, "the info/refs request", func(ev auditEvent) bool {
		return ev["phase"] == "request" && strings.HasSuffix(fmt.Sprint(ev["path"]), "/info/refs")
	})
	evs := decodeAudit(t, e.broker.auditLog.snapshot()[mark:])
	var challenges, connects int
	for _, ev := range evs {
		switch {
		case ev["decision"] == "deny":
			t.Errorf("git ls-remote left a deny: %v", ev)
		case ev["decision"] == "challenge":
			challenges++
			if ev["status"] != float64(407) || ev["phase"] != "connect" {
				t.Errorf("challenge event: %v", ev)
			}
		case ev["phase"] == "connect" && ev["decision"] == "allow":
			connects++
		}
	}
	if challenges == 0 || challenges > connects {
		t.Errorf("%d challenges for %d connections: want at least one (git asks first), at most one each", challenges, connects)
	}
	metrics := scrapeRequests(t, e.broker.adminAddr)
	if metrics["challenge"] != challenges || metrics["deny"] != 0 || metrics["error"] != 0 {
		t.Errorf("capbroker_requests_total by decision: %v, want %d challenges and no deny or error", metrics, challenges)
	}

	// Clone as docs/clients.md shows it, then push: refused with the policy's words.
	clone := strings.ReplaceAll(snips["git"], "https://git.example.com/org/", e.url("/git/"))
	if out := e.run(work, env, "sh", "-c", clone); out != "" && strings.Contains(out, "fatal") {
		t.Fatalf("git clone: %s", out)
	}
	repo := filepath.Join(work, "repo")
	if err := os.WriteFile(filepath.Join(repo, "x"), []byte("x\n"), 0o644); err != nil {
		t.Fatalf("the clone has no work tree: %v", err)
	}
	git(repo, "add", "x")
	git(repo, "commit", "-q", "-m", "x")
	out = e.run(repo, env, "git", "push", "origin", "main")
	t.Logf("git push printed:\n%s", out)
	if !strings.Contains(out, "remote: capbroker denied: pushing is not allowed from this sandbox") {
		t.Fatalf("git push output lacks the reason:\n%s", out)
	}

	// Wrong proxy credentials stay a deny (and are not counted as a challenge).
	bad := strings.Replace(e.broker.proxyURL(agentID, e.token), e.token, "not-the-token", 1)
	cmd := exec.Command("curl", "-sS", "-o", "/dev/null", "--max-time", "20", e.url("/open/x"))
	cmd.Env = append(harness.Env(), "HTTPS_PROXY="+bad, "CURL_CA_BUNDLE="+e.broker.caFile)
	_ = cmd.Run()
	e.broker.waitAuditWhere(t, 1, "the wrong-credentials deny", func(ev auditEvent) bool {
		return ev["decision"] == "deny" && ev["status"] == float64(407)
	})
}

// scrapeRequests sums capbroker_requests_total by the value of its decision (or outcome) label.
func scrapeRequests(t *testing.T, admin string) map[string]int {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	out := map[string]int{}
	re := regexp.MustCompile(`(?:decision|outcome)="([a-z_]+)"`)
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "capbroker_requests_total{") {
			continue
		}
		m := re.FindStringSubmatch(line)
		var n float64
		fields := strings.Fields(line)
		if m == nil || len(fields) < 2 {
			continue
		}
		fmt.Sscan(fields[len(fields)-1], &n)
		out[m[1]] += int(n)
	}
	return out
}

// TestDevShellReachesAdmin: in the shell set up as `broker dev` prints, the README's
// `curl http://127.0.0.1:PORT/readyz` reaches the admin listener, not the proxy.
func TestDevShellReachesAdmin(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		requireTool(t, "curl is missing")
	}
	dir := t.TempDir()
	cmd := exec.Command(brokerBin, "dev", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	cmd.Dir = dir
	cmd.Env = harness.Env()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	var exports []string
	var admin string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		if _, rest, ok := strings.Cut(line, "admin http://"); ok {
			admin, _, _ = strings.Cut(rest, ",")
		}
		if strings.HasPrefix(line, "export ") {
			exports = append(exports, line)
		}
		if strings.HasPrefix(line, "# Audit events follow") {
			break
		}
	}
	go io.Copy(io.Discard, stdout)
	if admin == "" || len(exports) == 0 {
		t.Fatalf("dev printed no admin address or exports: %q %q", admin, exports)
	}
	u, _ := url.Parse("http://" + admin)
	for _, host := range []string{u.Hostname(), "localhost"} {
		target := "http://" + host + ":" + u.Port() + "/readyz"
		script := strings.Join(exports, "\n") + "\ncurl -sS -w ' %{http_code}' " + target + "\n"
		out, _ := exec.Command("bash", "-c", script).CombinedOutput()
		if strings.Contains(string(out), "denied") || !(strings.HasSuffix(string(out), " 200") || strings.HasSuffix(string(out), " 503")) {
			t.Errorf("curl %s in the dev shell: %s", target, out)
		}
	}
}
