package integration

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"

	"github.com/capbroker/capbroker/internal/harness"
)

// writeFiles writes name -> content under dir, creating directories.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// shippedPolicies is the repository's policies/ folder.
func shippedPolicies(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../policies")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

var testSummaryRe = regexp.MustCompile(`(?m)^PASS: (\d+)/(\d+)$`)

func TestPolicyTestCommand(t *testing.T) {
	t.Run("shipped policies pass", func(t *testing.T) {
		out, code := run(t, t.TempDir(), "policy", "test", shippedPolicies(t))
		m := testSummaryRe.FindStringSubmatch(out)
		if code != 0 || m == nil || m[1] != m[2] || strings.Contains(out, "FAIL") {
			t.Fatalf("exit %d:\n%s", code, out)
		}
	})
	t.Run("default directory and -v", func(t *testing.T) {
		dir := t.TempDir()
		writeFiles(t, dir, map[string]string{
			"policies/broker.rego":      "package broker\n\ndecision := {\"allow\": input.request.host in data.hosts}\n",
			"policies/data.yaml":        "hosts: [api.example.com]\n",
			"policies/broker_test.rego": "package broker_test\n\nimport data.broker\n\ntest_listed_host if broker.decision.allow with input as {\"request\": {\"host\": \"api.example.com\"}}\n",
		})
		out, code := run(t, dir, "policy", "test", "-v")
		if code != 0 || !strings.Contains(out, "policies/broker_test.rego:5:\ndata.broker_test.test_listed_host: PASS") || !strings.Contains(out, "PASS: 1/1") {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		// Flags may follow the directory, as with opa test.
		if out, code := run(t, dir, "policy", "test", "policies", "-v"); code != 0 || !strings.Contains(out, "test_listed_host: PASS") {
			t.Fatalf("DIR -v: exit %d:\n%s", code, out)
		}
		// Without -v a passing run prints only the summary.
		if out, code := run(t, dir, "policy", "test"); code != 0 || strings.TrimSpace(out) != "PASS: 1/1" {
			t.Fatalf("quiet: exit %d:\n%s", code, out)
		}
	})
	t.Run("failures", func(t *testing.T) {
		dir := t.TempDir()
		writeFiles(t, dir, map[string]string{
			"broker.rego": "package broker\n\ndecision := {\"allow\": false, \"reason\": \"no\"}\n",
			"broker_test.rego": `package broker_test

import data.broker

test_denies if not broker.decision.allow

test_allows if broker.decision.allow

cases := {"first": true, "second": false}

test_table[name] if {
	some name, want in cases
	broker.decision.allow == want
}
`,
		})
		out, code := run(t, dir, "policy", "test", ".")
		for _, want := range []string{"broker_test.rego:7:\ndata.broker_test.test_allows: FAIL", "first: FAIL", "FAIL: 2/4", "PASS: 2/4", "broker: policy test: 2 of 3 tests failed"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q", want)
			}
		}
		if code != 1 || strings.Contains(out, "test_denies: PASS") {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		if out, code := run(t, dir, "policy", "test", "--run", "denies", "."); code != 0 || strings.TrimSpace(out) != "PASS: 1/1" {
			t.Fatalf("--run: exit %d:\n%s", code, out)
		}
		if out, code := run(t, dir, "policy", "test", "--run", "nothing", "."); code != 1 || !strings.Contains(out, `no test matches --run "nothing"`) {
			t.Fatalf("--run with no match: exit %d:\n%s", code, out)
		}
	})
	t.Run("tests use the broker's capabilities", func(t *testing.T) {
		dir := t.TempDir()
		writeFiles(t, dir, map[string]string{
			"broker.rego":      "package broker\n\ndecision := {\"allow\": true}\n",
			"broker_test.rego": "package broker_test\n\ntest_net if http.send({\"method\": \"GET\", \"url\": \"http://127.0.0.1:1/\"})\n",
		})
		out, code := run(t, dir, "policy", "test", dir)
		if code != 1 || !strings.Contains(out, filepath.Join(dir, "broker_test.rego")+":3: rego_type_error: undefined function http.send") {
			t.Fatalf("exit %d:\n%s", code, out)
		}
	})
	t.Run("usage", func(t *testing.T) {
		if out, code := run(t, t.TempDir(), "policy", "test", "--help"); code != 0 || !strings.Contains(out, "-run") {
			t.Fatalf("--help: exit %d:\n%s", code, out)
		}
		if out, code := run(t, t.TempDir(), "policy", "test", "missing-dir"); code != 1 || !strings.Contains(out, "missing-dir is not a directory") {
			t.Fatalf("missing dir: exit %d:\n%s", code, out)
		}
		if out, code := run(t, t.TempDir(), "policy", "frobnicate"); code != 2 || !strings.Contains(out, "unknown command") {
			t.Fatalf("unknown subcommand: exit %d:\n%s", code, out)
		}
		if out, code := run(t, t.TempDir(), "policy", "--help"); code != 0 || !strings.Contains(out, "broker policy replay") {
			t.Fatalf("policy --help: exit %d:\n%s", code, out)
		}
	})
}

func TestPolicyEvalCommand(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"policies/broker.rego": testPolicy + `
decision := {"allow": true, "credentials": "canary"} if input.request.path == "/malformed"

decision := {"allow": true, "credentials": ["canary"]} if input.request.path == "/api/x"
`,
	})
	input := func(path string, creds ...string) string {
		b, _ := json.Marshal(map[string]any{
			"phase": "request", "agent": map[string]any{"id": agentID, "labels": map[string]any{}}, "source": map[string]any{"ip": "127.0.0.1"},
			"request":     map[string]any{"method": "GET", "scheme": "https", "host": "127.0.0.1", "port": 443, "path": path, "query": map[string]any{}, "headers": map[string]any{}, "body": nil, "body_size": 0},
			"credentials": creds,
		})
		f := filepath.Join(dir, strings.ReplaceAll(strings.Trim(path, "/"), "/", "_")+fmt.Sprint(len(creds))+".json")
		if err := os.WriteFile(f, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	cases := map[string]struct {
		input  string
		allow  bool
		reason string
		creds  []string
	}{
		"allowed with a credential":        {input: input("/api/echo", "canary", "git"), allow: true, creds: []string{"canary"}},
		"allowed without":                  {input: input("/open/x"), allow: true},
		"denied with the policy's reason":  {input: input("/admin/x"), reason: "the /admin area is off limits"},
		"default deny":                     {input: input("/else"), reason: "not allowed by the test policy"},
		"malformed decision":               {input: input("/malformed", "canary"), reason: "the policy's decision is malformed: credentials is not a list"},
		"credential not bound to the host": {input: input("/api/echo"), reason: "the policy granted a credential that may not be sent to this host"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			out, code := run(t, dir, "policy", "eval", "--input", c.input)
			if code != 0 {
				t.Fatalf("exit %d:\n%s", code, out)
			}
			var got struct {
				Allow       bool     `json:"allow"`
				Reason      string   `json:"reason"`
				Credentials []string `json:"credentials"`
				Intercept   bool     `json:"intercept"`
				Revision    string   `json:"policy_revision"`
			}
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, out)
			}
			if got.Allow != c.allow || got.Reason != c.reason || strings.Join(got.Credentials, ",") != strings.Join(c.creds, ",") || len(got.Revision) != 12 {
				t.Fatalf("got %+v", got)
			}
		})
	}
	// The exact output: indented JSON, credentials always a list, the revision.
	out, code := run(t, dir, "policy", "eval", "--policies", "policies", "--input", input("/open/y"))
	rev := regexp.MustCompile(`"policy_revision": "([0-9a-f]{12})"`).FindStringSubmatch(out)
	if code != 0 || rev == nil {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	want := "{\n  \"allow\": true,\n  \"reason\": \"\",\n  \"credentials\": [],\n  \"intercept\": true,\n  \"policy_revision\": \"" + rev[1] + "\"\n}\n"
	if out != want {
		t.Fatalf("output:\n%s\nwant:\n%s", out, want)
	}

	// Errors: a policy that cannot decide (503 policy_error in the broker), bad input, bad policy, usage.
	writeFiles(t, dir, map[string]string{"conflict/broker.rego": "package broker\n\ndecision := {\"allow\": true}\n\ndecision := {\"allow\": false}\n"})
	if out, code := run(t, dir, "policy", "eval", "--policies", "conflict", "--input", input("/x")); code != 1 || !strings.Contains(out, "policy evaluation failed") || !strings.Contains(out, "503 policy_error") {
		t.Fatalf("conflict: exit %d:\n%s", code, out)
	}
	writeFiles(t, dir, map[string]string{"bad.json": "{\"phase\": ", "list.json": "[1]", "broken/broker.rego": "package broker\n\ndecision := {\n"})
	if out, code := run(t, dir, "policy", "eval", "--input", "bad.json"); code != 1 || !strings.Contains(out, "--input bad.json") {
		t.Fatalf("bad JSON: exit %d:\n%s", code, out)
	}
	if out, code := run(t, dir, "policy", "eval", "--input", "list.json"); code != 1 || !strings.Contains(out, "must be a JSON object") {
		t.Fatalf("not an object: exit %d:\n%s", code, out)
	}
	if out, code := run(t, dir, "policy", "eval", "--policies", "broken", "--input", input("/x")); code != 1 || !strings.Contains(out, "broken/broker.rego:4: rego_parse_error") {
		t.Fatalf("broken policy: exit %d:\n%s", code, out)
	}
	if out, code := run(t, dir, "policy", "eval"); code != 2 || !strings.Contains(out, "--input is required") {
		t.Fatalf("no --input: exit %d:\n%s", code, out)
	}
	if out, code := run(t, dir, "policy", "eval", "--help"); code != 0 || !strings.Contains(out, "-policies") {
		t.Fatalf("--help: exit %d:\n%s", code, out)
	}
}

// candidatePolicy is testPolicy changed so that exactly four recorded decisions flip:
// /open/ is now denied, /admin allowed, /api/ grants the git credential instead of canary,
// and a JSON body naming model m-1 is refused.
const candidatePolicy = `package broker

default decision := {"allow": false, "reason": "not allowed by the test policy"}

decision := {"allow": true, "intercept": true} if {
	input.phase == "connect"
	input.request.host == "127.0.0.1"
}

decision := {"allow": true, "credentials": ["git"]} if {
	input.phase == "request"
	startswith(input.request.path, "/api/")
	not input.request.body.model == "m-1"
}

decision := {"allow": false, "reason": "model m-1 is retired"} if {
	input.phase == "request"
	startswith(input.request.path, "/api/")
	input.request.body.model == "m-1"
}

decision := {"allow": false, "reason": "/open/ is closed"} if {
	input.phase == "request"
	startswith(input.request.path, "/open/")
}

decision := {"allow": true} if {
	input.phase == "request"
	startswith(input.request.path, "/admin")
}

decision := {"allow": true, "credentials": ["unbound"]} if {
	input.phase == "request"
	startswith(input.request.path, "/other/")
}
`

// TestPolicyReplay records an audit log with the real broker (audit.include_input), then
// replays it against the recorded policy (nothing changes) and a candidate (exactly the
// expected decisions flip).
func TestPolicyReplay(t *testing.T) {
	e := newEnv(t, envOpts{inputLevel: "full"})
	for _, args := range [][]string{
		{e.url("/api/a")},
		{e.url("/open/b")},
		{e.url("/admin/c")},
		{e.url("/other/d")},
		{"-H", "Content-Type: application/json", "--data", `{"model":"m-1"}`, e.url("/api/e")},
	} {
		if out, err := e.curl(append([]string{"-o", "/dev/null", "-w", "%{http_code}"}, args...)...); err != nil {
			t.Fatalf("curl %v: %v %s", args, err, out)
		}
	}
	ids := map[string]string{} // path -> request id
	isRequest := func(ev auditEvent) bool { return ev["phase"] == "request" }
	for _, ev := range e.broker.waitAuditWhere(t, 5, "request events", isRequest) {
		ids[ev["path"].(string)] = ev["request_id"].(string)
	}
	dir := t.TempDir()
	log := strings.Join(e.broker.auditLog.snapshot(), "\n") + "\n"
	// An event recorded without include_input, and a line that is not an audit event.
	log += `{"level":"info","request_id":"r-noinput","agent":"coder-1","source_ip":"127.0.0.1","phase":"request","method":"GET","scheme":"https","host":"127.0.0.1","port":443,"path":"/x","decision":"allow","reason":"","credentials":[],"status":200,"bytes_in":0,"bytes_out":0,"duration_ms":1,"policy_revision":"abc","mode":"enforce","time":"2026-01-01T00:00:00Z","msg":"decision"}` + "\n"
	log += "# Audit events follow\n"
	logFile := filepath.Join(dir, "audit.jsonl")
	writeFiles(t, dir, map[string]string{"audit.jsonl": log, "recorded/broker.rego": testPolicy, "candidate/broker.rego": candidatePolicy})

	out, code := run(t, dir, "policy", "replay", "--policies", "recorded", "--log", logFile)
	if code != 0 || !regexp.MustCompile(`^replay: 10 re-decided, 0 changed, 10 unchanged, 1 skipped without input, 1 lines not decision events \(policy revision [0-9a-f]{12}\)\n$`).MatchString(out) {
		t.Fatalf("replay against the recorded policy: exit %d:\n%s", code, out)
	}

	out, code = run(t, dir, "policy", "replay", "--policies", "candidate", "--log", logFile)
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var changes []string
	for _, l := range lines {
		if strings.HasPrefix(l, "replay: ") || strings.HasPrefix(l, "broker: ") {
			continue
		}
		changes = append(changes, l)
	}
	sort.Strings(changes)
	want := []string{
		ids["/admin/c"] + ` coder-1 GET 127.0.0.1 /admin/c: deny "the /admin area is off limits" -> allow`,
		ids["/api/a"] + ` coder-1 GET 127.0.0.1 /api/a: allow [canary] -> allow [git]`,
		ids["/api/e"] + ` coder-1 POST 127.0.0.1 /api/e: allow [canary] -> deny "model m-1 is retired"`,
		ids["/open/b"] + ` coder-1 GET 127.0.0.1 /open/b: allow -> deny "/open/ is closed"`,
	}
	sort.Strings(want)
	if strings.Join(changes, "\n") != strings.Join(want, "\n") {
		t.Fatalf("changes:\n%s\nwant:\n%s\nfull output:\n%s", strings.Join(changes, "\n"), strings.Join(want, "\n"), out)
	}
	if !regexp.MustCompile(`(?m)^replay: 10 re-decided, 4 changed, 6 unchanged, 1 skipped without input, 1 lines not decision events \(policy revision [0-9a-f]{12}\)$`).MatchString(out) ||
		!strings.Contains(out, "broker: policy replay: 4 of 10 decisions changed") {
		t.Fatalf("summary:\n%s", out)
	}

	// --reasons also counts a deny whose reason changed: /other/d is still denied, now
	// because the candidate grants a credential not bound to the host.
	out, code = run(t, dir, "policy", "replay", "--policies", "candidate", "--log", logFile, "--reasons")
	if code != 1 || !strings.Contains(out, ids["/other/d"]+` coder-1 GET 127.0.0.1 /other/d: deny "not allowed by the test policy" -> deny "the policy granted a credential that may not be sent to this host"`) ||
		!strings.Contains(out, "5 changed") {
		t.Fatalf("--reasons: exit %d:\n%s", code, out)
	}

	// The log on standard input.
	cmd := exec.Command(brokerBin, "policy", "replay", "--policies", "recorded", "--log", "-")
	cmd.Dir, cmd.Stdin = dir, strings.NewReader(log)
	if b, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(b), "10 re-decided, 0 changed") {
		t.Fatalf("stdin: %v\n%s", err, b)
	}
}

func TestPolicyReplayMonitorModeAndErrors(t *testing.T) {
	dir := t.TempDir()
	event := func(id, path, decision, reason string, wouldDeny bool, errText string) string {
		ev := map[string]any{
			"level": "info", "request_id": id, "agent": agentID, "source_ip": "10.0.0.5", "phase": "request", "method": "GET",
			"scheme": "https", "host": "api.example.com", "port": 443, "path": path, "decision": decision, "reason": reason,
			"credentials": []string{}, "status": 200, "bytes_in": 0, "bytes_out": 0, "duration_ms": 1.5, "policy_revision": "0123456789ab",
			"mode": "monitor", "time": "2026-01-01T00:00:00Z", "msg": "decision",
			"input": map[string]any{"phase": "request", "agent": map[string]any{"id": agentID, "labels": map[string]any{}}, "source": map[string]any{"ip": "10.0.0.5"},
				"request":     map[string]any{"method": "GET", "scheme": "https", "host": "api.example.com", "port": 443, "path": path, "query": map[string]any{}, "headers": map[string]any{}, "body": nil, "body_size": 0},
				"credentials": []string{}},
		}
		if wouldDeny {
			ev["would_deny"] = true
		}
		if errText != "" {
			ev["error"] = errText
		}
		b, _ := json.Marshal(ev)
		return string(b) + "\n"
	}
	log := event("r1", "/x", "allow", "no", true, "") + // monitor mode: allowed, but the policy denied
		event("r2", "/y", "deny", "the broker could not evaluate its policy; the request was not sent", false, "policy evaluation failed: eval_conflict_error") +
		event("r3", "/z", "allow", "", false, "")
	writeFiles(t, dir, map[string]string{
		"audit.jsonl":        log,
		"allow-all/p.rego":   "package broker\n\ndecision := {\"allow\": true}\n",
		"deny-z/p.rego":      "package broker\n\ndefault decision := {\"allow\": false, \"reason\": \"no\"}\n\ndecision := {\"allow\": true} if input.request.path != \"/z\"\n",
		"conflicting/p.rego": "package broker\n\ndecision := {\"allow\": true}\n\ndecision := {\"allow\": false} if input.request.path == \"/z\"\n",
	})
	out, code := run(t, dir, "policy", "replay", "--policies", "allow-all", "--log", "audit.jsonl")
	if code != 1 || !strings.Contains(out, `r1 coder-1 GET api.example.com /x: deny "no" -> allow`) ||
		!strings.Contains(out, `r2 coder-1 GET api.example.com /y: error "the broker could not evaluate its policy; the request was not sent" -> allow`) ||
		strings.Contains(out, "r3 ") || !strings.Contains(out, "3 re-decided, 2 changed, 1 unchanged") {
		t.Fatalf("allow-all: exit %d:\n%s", code, out)
	}
	out, code = run(t, dir, "policy", "replay", "--policies", "conflicting", "--log", "audit.jsonl")
	if code != 1 || !regexp.MustCompile(`r3 coder-1 GET api.example.com /z: allow -> error "policy evaluation failed: .*conflict`).MatchString(out) {
		t.Fatalf("conflicting: exit %d:\n%s", code, out)
	}
	if out, code := run(t, dir, "policy", "replay", "--policies", "deny-z"); code != 2 || !strings.Contains(out, "--log is required") {
		t.Fatalf("no --log: exit %d:\n%s", code, out)
	}
	if out, code := run(t, dir, "policy", "replay", "--help"); code != 0 || !strings.Contains(out, "-reasons") {
		t.Fatalf("--help: exit %d:\n%s", code, out)
	}
	// A log recorded without include_input: nothing to compare, exit 1 with a hint.
	writeFiles(t, dir, map[string]string{"plain.jsonl": strings.ReplaceAll(`{"msg":"decision","request_id":"r9","decision":"allow"}`, "\n", "") + "\n"})
	if out, code := run(t, dir, "policy", "replay", "--policies", "deny-z", "--log", "plain.jsonl"); code != 1 || !strings.Contains(out, "0 re-decided, 0 changed, 0 unchanged, 1 skipped without input") || !strings.Contains(out, "audit.include_input: full") {
		t.Fatalf("no input: exit %d:\n%s", code, out)
	}
}

// TestPolicyCheckConfigTypes: check-config compiles the policy with the broker's
// capabilities and type-checks the decision, each problem with its key path and file:line.
func TestPolicyCheckConfigTypes(t *testing.T) {
	dir := t.TempDir()
	if out, code := run(t, dir, "ca", "init", "--out", "ca"); code != 0 {
		t.Fatal(out)
	}
	writeFiles(t, dir, map[string]string{
		"policies/broker.rego": `package broker

default decision := {"allow": false, "reason": "no"}

decision := {"allow": "yes", "credentials": "github"} if input.request.host == "a"

decision := {"allow": true, "reason": count(input.x)} if input.request.host == "b"
`,
		"policies/lib/data.json": "{\"x\": [1,\n}",
		"bad.yaml":               "ca: {cert_file: ca/ca.crt, key_file: ca/ca.key}\npolicy: {dir: policies}\n",
	})
	out, code := run(t, dir, "check-config", "--config", "bad.yaml")
	if code != 1 || !strings.Contains(out, "policy.dir: policies/lib/data.json:2: invalid JSON") {
		t.Fatalf("bad data: exit %d:\n%s", code, out)
	}
	os.Remove(filepath.Join(dir, "policies", "lib", "data.json"))
	out, code = run(t, dir, "check-config", "--config", "bad.yaml")
	for _, want := range []string{
		"policy.dir: policies/broker.rego:5: decision: allow must be a boolean, not string",
		"policy.dir: policies/broker.rego:5: decision: credentials must be an array of credential names (strings) or {name, scope} objects, not string",
		"policy.dir: policies/broker.rego:7: decision: reason must be a string, not number",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if code != 1 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	// The shipped policies check clean.
	writeFiles(t, dir, map[string]string{"good.yaml": fmt.Sprintf("ca: {cert_file: ca/ca.crt, key_file: ca/ca.key}\npolicy: {dir: %q}\n", shippedPolicies(t))})
	if out, code := run(t, dir, "check-config", "--config", "good.yaml"); code != 0 || !strings.Contains(out, "OK") {
		t.Fatalf("shipped policies: exit %d:\n%s", code, out)
	}
}

// testBundle builds a bundle as `opa build` writes it.
func testBundle(t *testing.T, revision, rego string) []byte {
	t.Helper()
	b := bundle.Bundle{
		Manifest: bundle.Manifest{Revision: revision},
		Data:     map[string]any{},
		Modules:  []bundle.ModuleFile{{URL: "/broker.rego", Path: "/broker.rego", Raw: []byte(rego), Parsed: ast.MustParseModule(rego)}},
	}
	var buf bytes.Buffer
	if err := bundle.NewWriter(&buf).Write(b); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestPolicyBundle runs the broker on policy.bundle: it fails closed while the bundle server
// is down, loads the bundle when it comes up, and swaps in a new revision.
func TestPolicyBundle(t *testing.T) {
	pki := newUpstreamPKI(t)
	up := pki.serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "upstream ok") }), false, nil)
	var mu sync.Mutex
	var body []byte
	var etag string
	bundles := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case body == nil:
			http.Error(w, "no bundle yet", http.StatusServiceUnavailable)
		case r.Header.Get("If-None-Match") == etag:
			w.WriteHeader(http.StatusNotModified)
		default:
			w.Header().Set("ETag", etag)
			w.Write(body)
		}
	}))
	defer bundles.Close()
	setBundle := func(rev, rego string) {
		mu.Lock()
		defer mu.Unlock()
		body, etag = testBundle(t, rev, rego), `"`+rev+`"`
	}

	dir := t.TempDir()
	b := &brokerProc{dir: dir, caFile: filepath.Join(dir, "ca", "ca.crt"), logs: newLogTail(), auditLog: newLogTail(), done: make(chan error, 1)}
	if out, code := run(t, dir, "ca", "init", "--out", "ca"); code != 0 {
		t.Fatal(out)
	}
	token := randHex(16)
	writeFiles(t, dir, map[string]string{"broker.yaml": fmt.Sprintf(`proxy: {listen: "127.0.0.1:0"}
admin: {listen: "127.0.0.1:0"}
ca: {cert_file: ca/ca.crt, key_file: ca/ca.key}
upstream: {ca_file: %q, allow_private: ["127.0.0.1/32"]}
policy:
  bundle: {url: %q, poll_interval: 1s}
agents: [{id: %s, token_sha256: %x}]
`, pki.File, bundles.URL+"/bundles/broker.tar.gz", agentID, sha256.Sum256([]byte(token)))})
	os.Chmod(filepath.Join(dir, "broker.yaml"), 0o600)
	b.cmd = exec.Command(brokerBin, "run", "--config", "broker.yaml")
	b.cmd.Dir = dir
	b.cmd.Env = harness.Env()
	b.cmd.Stdout, b.cmd.Stderr = b.auditLog, b.logs
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { b.done <- b.cmd.Wait() }()
	t.Cleanup(func() { b.stop(t) })
	var l struct{ Proxy, Admin string }
	if err := json.Unmarshal([]byte(b.logs.wait(t, `"message":"listening"`)), &l); err != nil {
		t.Fatal(err)
	}
	b.proxyAddr, b.adminAddr = l.Proxy, l.Admin
	client := b.client(t, agentID, token)
	get := func() (int, string) {
		resp, err := client.Get(up.URL + "/x")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("X-Broker-Request-Id")
	}

	// No bundle yet: fail closed (the CONNECT is refused with 503 policy_error).
	b.logs.wait(t, `"message":"policy bundle not loaded; keeping the last good policy"`)
	if code, _ := get(); code != 0 && code != http.StatusServiceUnavailable {
		t.Fatalf("without a bundle: %d", code)
	}
	ev := b.auditLog.wait(t, `"phase":"connect"`)
	if !strings.Contains(ev, `"decision":"deny"`) {
		t.Fatalf("connect without a bundle: %s", ev)
	}
	readyz := func() (int, map[string]any) {
		resp, err := http.Get("http://" + b.adminAddr + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body
	}
	if code, body := readyz(); code != http.StatusServiceUnavailable || body["policy"] != "no policy loaded yet" {
		t.Fatalf("/readyz without a bundle: %d %v", code, body)
	}

	allowAll := "package broker\n\ndecision := {\"allow\": true}\n"
	mark := b.logs.mark()
	setBundle("r1", allowAll)
	if line := b.logs.waitFrom(t, mark, `"policy_revision":"r1"`); !strings.Contains(line, `"message":"policy bundle loaded"`) {
		t.Fatalf("log: %s", line)
	}
	code, id := get()
	if code != http.StatusOK {
		t.Fatalf("with bundle r1: %d %s", code, id)
	}
	if code, body := readyz(); code != http.StatusOK || body["policy_revision"] != "r1" {
		t.Fatalf("/readyz with bundle r1: %d %v", code, body)
	}
	if ev := b.waitAudit(t, id); ev["policy_revision"] != "r1" || ev["decision"] != "allow" {
		t.Fatalf("audit with r1: %v", ev)
	}

	mark = b.logs.mark()
	setBundle("r2", "package broker\n\ndecision := {\"allow\": input.phase == \"connect\", \"reason\": \"bundle r2 says no\"}\n")
	if line := b.logs.waitFrom(t, mark, `"policy_revision":"r2"`); !strings.Contains(line, `"message":"policy bundle loaded"`) {
		t.Fatalf("log: %s", line)
	}
	code, id = get()
	if code != http.StatusForbidden {
		t.Fatalf("with bundle r2: %d", code)
	}
	if ev := b.waitAudit(t, id); ev["policy_revision"] != "r2" || ev["reason"] != "bundle r2 says no" {
		t.Fatalf("audit with r2: %v", ev)
	}

	// check-config downloads and checks the bundle.
	if out, code := run(t, dir, "check-config", "--config", "broker.yaml"); code != 0 || !strings.Contains(out, "OK") {
		t.Fatalf("check-config with a bundle: exit %d:\n%s", code, out)
	}

	// The bundle server goes away: r2 keeps deciding.
	bundles.CloseClientConnections()
	mu.Lock()
	body = nil
	mu.Unlock()
	mark = b.logs.mark()
	if line := b.logs.waitFrom(t, mark, `"message":"policy bundle not loaded; keeping the last good policy"`); !strings.Contains(line, `"policy_revision":"r2"`) {
		t.Fatalf("log: %s", line)
	}
	if code, _ := get(); code != http.StatusForbidden {
		t.Fatalf("after the server failed: %d", code)
	}
	if out, code := run(t, dir, "check-config", "--config", "broker.yaml"); code != 1 || !strings.Contains(out, "policy.bundle: bundle download:") || !strings.Contains(out, "503") {
		t.Fatalf("check-config without a bundle: exit %d:\n%s", code, out)
	}
}
