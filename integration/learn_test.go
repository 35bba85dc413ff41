package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPolicyLearn drafts a policy from a real monitor-mode run: curl through the broker to a
// TLS upstream, then `policy learn` on the audit log; the draft's own tests pass, replay of
// the same log changes nothing, and a near miss is denied by `policy eval`.
func TestPolicyLearn(t *testing.T) {
	e := newEnv(t, envOpts{mode: "monitor", inputLevel: "headers"})
	const noteValue, bodyValue = "learn-header-value-q8", "learn-body-value-z3"
	reqs := [][]string{
		{e.url("/api/items/123")},
		{e.url("/api/items/9f86d081884c7d659a2feaa0c55ad015")},
		{"-X", "POST", "-H", "X-Note: " + noteValue, "-H", "Content-Type: application/json", "--data", `{"v":"` + bodyValue + `"}`, e.url("/api/items")},
		{e.url("/open/readme?lang=en")},
	}
	var ids []string
	for _, args := range reqs {
		out, err := e.curl(append([]string{"-i"}, args...)...)
		if err != nil || !hasStatus(out, 200) {
			t.Fatalf("curl %v: %v\n%s", args, err, out)
		}
		ids = append(ids, headerValue(out, "X-Broker-Request-Id"))
	}
	for _, id := range ids {
		e.broker.waitAudit(t, id)
	}
	dir := t.TempDir()
	logFile, draft := filepath.Join(dir, "audit.jsonl"), filepath.Join(dir, "draft")
	if err := os.WriteFile(logFile, []byte(strings.Join(e.broker.auditLog.snapshot(), "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	out, code := run(t, dir, "policy", "learn", "--from", logFile, "--out", draft)
	if code != 0 || !strings.Contains(out, "1 agents") {
		t.Fatalf("policy learn: exit %d\n%s", code, out)
	}
	data, err := os.ReadFile(filepath.Join(draft, "learned.json"))
	if err != nil {
		t.Fatal(err)
	}
	var learned struct {
		Learned struct {
			Agents map[string]struct {
				Connect  []map[string]any
				Requests []struct {
					Method, Path string
					Credentials  []string
				}
			}
		}
	}
	if err := json.Unmarshal(data, &learned); err != nil {
		t.Fatal(err)
	}
	a := learned.Learned.Agents[agentID]
	var rules []string
	for _, r := range a.Requests {
		rules = append(rules, r.Method+" "+r.Path+" "+strings.Join(r.Credentials, ","))
	}
	if got, want := strings.Join(rules, "|"), "POST /api/items canary|GET /api/items/* canary|GET /open/readme "; got != want || len(a.Connect) != 1 {
		t.Errorf("learned rules %q, want %q; connect %v", got, want, a.Connect)
	}
	for _, f := range []string{"learned.json", "learned.rego", "learned_test.rego"} {
		b, _ := os.ReadFile(filepath.Join(draft, f))
		for _, never := range []string{noteValue, bodyValue, e.canary, e.token, "lang"} {
			if strings.Contains(string(b), never) {
				t.Errorf("%s carries %q", f, never)
			}
		}
	}

	if out, code := run(t, dir, "policy", "test", draft); code != 0 || !strings.Contains(out, "PASS: ") {
		t.Fatalf("policy test of the draft: exit %d\n%s", code, out)
	}
	out, code = run(t, dir, "policy", "replay", "--policies", draft, "--log", logFile)
	if code != 0 || !strings.Contains(out, "replay: 8 re-decided, 0 changed") {
		t.Fatalf("policy replay: exit %d\n%s", code, out)
	}

	// Near misses: another method, a sibling path; the connect seen is allowed.
	for target, want := range map[string]string{
		"DELETE " + e.url("/api/items/123"):                   `"reason": "learned policy: agent \"` + agentID + `\" was not seen sending DELETE`,
		"GET " + e.url("/api/other/123"):                      `"allow": false`,
		"CONNECT " + strings.TrimPrefix(e.up.URL, "https://"): `"allow": true`,
	} {
		f := strings.Fields(target)
		out, code := run(t, dir, "policy", "eval", "--policies", draft, "--agent", agentID, f[0], f[1])
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("eval %s: exit %d, want %s\n%s", target, code, want, out)
		}
	}
	// The broker binds the canary credential to 127.0.0.1; eval's METHOD URL form names none.
	port := strings.TrimPrefix(e.up.URL, "https://127.0.0.1:")
	in := filepath.Join(dir, "input.json")
	if err := os.WriteFile(in, []byte(`{"phase":"request","agent":{"id":"`+agentID+`"},"request":{"method":"GET","scheme":"https","host":"127.0.0.1","port":`+port+`,"path":"/api/items/77"},"credentials":["canary"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := run(t, dir, "policy", "eval", "--policies", draft, "--input", in); code != 0 || !strings.Contains(out, `"allow": true`) || !strings.Contains(out, `"canary"`) {
		t.Errorf("a new id under a learned pattern: exit %d\n%s", code, out)
	}
	if out, _ := run(t, dir, "policy", "eval", "--policies", draft, "--agent", "someone-else", "GET", e.url("/api/items/123")); !strings.Contains(out, `"allow": false`) {
		t.Errorf("another agent: %s", out)
	}

	// A request the recording policy would have denied is learned, and replay shows it as a
	// change; with --skip-denied it is left out, and replay passes.
	out, err = e.curl("-i", e.url("/not-allowed/thing"))
	if err != nil || !hasStatus(out, 200) {
		t.Fatalf("monitor mode lets a would-deny request through: %v\n%s", err, out)
	}
	if ev := e.broker.waitAudit(t, headerValue(out, "X-Broker-Request-Id")); ev["would_deny"] != true {
		t.Fatalf("not a would_deny event: %v", ev)
	}
	if err := os.WriteFile(logFile, []byte(strings.Join(e.broker.auditLog.snapshot(), "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := run(t, dir, "policy", "learn", "--from", logFile, "--out", draft, "--force"); code != 0 {
		t.Fatalf("policy learn --force: exit %d\n%s", code, out)
	}
	out, code = run(t, dir, "policy", "replay", "--policies", draft, "--log", logFile)
	if code == 0 || !strings.Contains(out, "GET 127.0.0.1 /not-allowed/thing: deny") || !strings.Contains(out, "-> allow\n") {
		t.Errorf("replay of a draft that learned a would_deny request: exit %d\n%s", code, out)
	}
	strict := filepath.Join(dir, "strict")
	if out, code := run(t, dir, "policy", "learn", "--skip-denied", "--from", logFile, "--out", strict); code != 0 || !strings.Contains(out, "1 denied skipped") {
		t.Fatalf("policy learn --skip-denied: exit %d\n%s", code, out)
	}
	if out, code := run(t, dir, "policy", "test", strict); code != 0 {
		t.Errorf("policy test of the --skip-denied draft: exit %d\n%s", code, out)
	}
	if out, code := run(t, dir, "policy", "replay", "--policies", strict, "--log", logFile); code != 0 || !strings.Contains(out, "replay: 10 re-decided, 0 changed") {
		t.Errorf("replay of the --skip-denied draft: exit %d\n%s", code, out)
	}

	// A log whose events carry no input is refused, and nothing is written.
	bare := filepath.Join(dir, "bare.jsonl")
	if err := os.WriteFile(bare, []byte(`{"msg":"decision","agent":"coder-1","decision":"allow"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code = run(t, dir, "policy", "learn", "--from", bare, "--out", filepath.Join(dir, "none"))
	if code == 0 || !strings.Contains(out, "no decision event carries its policy input") {
		t.Errorf("learn of a log without input: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "none")); err == nil {
		t.Error("learn wrote a draft from a log without input")
	}
}
