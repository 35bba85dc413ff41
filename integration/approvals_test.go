package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capbroker/capbroker/internal/harness"
)

// askPolicy intercepts tunnels to 127.0.0.1 and asks about a tunnel to localhost; under
// /ask/ it asks for a person (the canary credential once approved) unless data.approved (an
// "always" approval) covers the request; under /quick/ it asks with a short timeout; /open/
// and /api/approvals are allowed without a credential.
const askPolicy = `package broker

default decision := {"allow": false, "reason": "not allowed by the test policy"}

decision := {"allow": true, "intercept": true} if {
	input.phase == "connect"
	input.request.host == "127.0.0.1"
}

decision := {"ask": {"reason": "a first connection to this host"}} if {
	input.phase == "connect"
	input.request.host == "localhost"
}

decision := {"ask": {"reason": "writes need a person", "timeout": "1m"}, "credentials": ["canary"]} if {
	input.phase == "request"
	startswith(input.request.path, "/ask/")
	not approved
}

decision := {"allow": true, "credentials": ["canary"]} if {
	input.phase == "request"
	startswith(input.request.path, "/ask/")
	approved
}

decision := {"ask": {"reason": "quick one", "timeout": "300ms", "scopes": ["once"]}} if {
	input.phase == "request"
	startswith(input.request.path, "/quick/")
}

decision := {"allow": true} if {
	input.phase == "request"
	startswith(input.request.path, "/open/")
}

decision := {"allow": true} if {
	input.phase == "request"
	input.request.path == "/api/approvals"
}

approved if {
	some a in data.approved # undefined (no approval yet): not approved
	a.agent == input.agent.id
	a.host == input.request.host
	a.method in {"", input.request.method}
	startswith(input.request.path, a.path_prefix)
}
`

// admin talks to a broker's admin API as the console does without authentication (a
// loopback-only broker): the CSRF token from /api/session on every POST and DELETE.
type admin struct {
	t     *testing.T
	b     *brokerProc
	token string // bearer token, when the broker has one
	csrf  string
}

func newAdmin(t *testing.T, b *brokerProc) *admin {
	a := &admin{t: t, b: b}
	_, s := a.call("GET", "/api/session", "", nil)
	a.csrf, _ = s["csrf"].(string)
	return a
}

func (a *admin) call(method, path, body string, hdr map[string]string) (int, map[string]any) {
	a.t.Helper()
	req, err := http.NewRequest(method, "http://"+a.b.adminAddr+path, strings.NewReader(body))
	if err != nil {
		a.t.Fatal(err)
	}
	if a.csrf != "" {
		req.Header.Set("X-CSRF-Token", a.csrf)
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := (&http.Client{Transport: &http.Transport{Proxy: nil}}).Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &out); err != nil && resp.StatusCode != 200 {
		a.t.Fatalf("%s %s: %s: %s", method, path, resp.Status, raw)
	}
	return resp.StatusCode, out
}

func (a *admin) approve(id, body string) map[string]any {
	a.t.Helper()
	code, out := a.call("POST", "/api/approvals/"+id+"/approve", body, nil)
	if code != 200 {
		a.t.Fatalf("approve %s: %d %v", id, code, out)
	}
	return out
}

// sse is a subscription to /api/events.
type sse struct {
	t      *testing.T
	events chan [2]string // name, data
}

// events subscribes to the broker's event stream; it is subscribed when this returns.
func (a *admin) events() *sse {
	a.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a.t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+a.b.adminAddr+"/api/events", nil)
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := (&http.Client{Transport: &http.Transport{Proxy: nil}}).Do(req)
	if err != nil || resp.StatusCode != 200 {
		a.t.Fatalf("events: %v %v", resp, err)
	}
	rd := bufio.NewReader(resp.Body)
	if _, err := rd.ReadString('\n'); err != nil { // the opening comment: subscribed
		a.t.Fatal(err)
	}
	s := &sse{t: a.t, events: make(chan [2]string, 1024)}
	go func() {
		defer resp.Body.Close()
		defer close(s.events)
		var name string
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimRight(line, "\n")
			switch {
			case strings.HasPrefix(line, "event: "):
				name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				s.events <- [2]string{name, strings.TrimPrefix(line, "data: ")}
			}
		}
	}()
	return s
}

// approval waits for an approval event in state, and returns its id.
func (s *sse) approval(state string) string {
	s.t.Helper()
	deadline := time.After(waitTimeout)
	var seen []string
	for {
		select {
		case ev, ok := <-s.events:
			if !ok {
				s.t.Fatalf("the event stream ended before an approval %s; seen %q", state, seen)
			}
			seen = append(seen, ev[0]+" "+ev[1])
			var d map[string]string
			if ev[0] == "approval" && json.Unmarshal([]byte(ev[1]), &d) == nil && d["state"] == state {
				return d["id"]
			}
		case <-deadline:
			s.t.Fatalf("no approval %s; events seen %q", state, seen)
		}
	}
}

// agentCurl is curl run as the agent in the background.
type agentCurl struct {
	cmd  *exec.Cmd
	out  bytes.Buffer
	done chan error
}

func (e *env) curlStart(args ...string) *agentCurl {
	e.t.Helper()
	c := &agentCurl{done: make(chan error, 1)}
	c.cmd = exec.Command("curl", append([]string{"-sS", "--max-time", "60", "--suppress-connect-headers"}, args...)...)
	proxy := e.broker.proxyURL(agentID, e.token)
	c.cmd.Env = append(harness.Env(), "HTTPS_PROXY="+proxy, "http_proxy="+proxy, "CURL_CA_BUNDLE="+e.broker.caFile, "NO_PROXY=")
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
	if err := c.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() { c.done <- c.cmd.Wait() }()
	e.t.Cleanup(func() { _ = c.cmd.Process.Kill() })
	return c
}

func (c *agentCurl) wait() string {
	<-c.done
	return c.out.String()
}

// received reports whether the upstream was sent a request under path.
func (e *env) receivedUnder(prefix string) int {
	n := 0
	for _, r := range e.received() {
		if strings.HasPrefix(r.URL.Path, prefix) {
			n++
		}
	}
	return n
}

func askEnv(t *testing.T, extra string) (*env, *admin) {
	e := newEnv(t, envOpts{policy: askPolicy, extraConfig: extra})
	return e, newAdmin(t, e.broker)
}

// decisionOf is the decision event of the request whose path is path.
func decisionOf(t *testing.T, b *brokerProc, path string) auditEvent {
	t.Helper()
	return b.waitAuditWhere(t, 1, "decision for "+path, func(ev auditEvent) bool {
		return ev["msg"] == "decision" && ev["path"] == path && ev["phase"] == "request"
	})[0]
}

func TestApprovalApprovedContinuesWithCredential(t *testing.T) {
	e, a := askEnv(t, "")
	ev := a.events()
	c := e.curlStart("-i", "-X", "POST", "-H", "Content-Type: text/plain", "--data-binary", "push this please", e.url("/ask/push?whole"))
	id := ev.approval("pending")
	code, list := a.call("GET", "/api/approvals", "", nil)
	pending, _ := list["pending"].([]any)
	if code != 200 || len(pending) != 1 {
		t.Fatalf("pending: %d %v", code, list)
	}
	p := pending[0].(map[string]any)
	if p["id"] != id || p["agent"] != agentID || p["method"] != "POST" || p["path"] != "/ask/push" || p["body_preview"] != "push this please" ||
		p["reason"] != "writes need a person" || fmt.Sprint(p["query_keys"]) != "[whole]" {
		t.Fatalf("pending request: %v", p)
	}
	if h, _ := p["headers"].(map[string]any); h["content-type"] != "text/plain" || h["proxy-authorization"] != nil {
		t.Fatalf("headers: %v", h)
	}
	if n := e.receivedUnder("/ask/"); n != 0 {
		t.Fatalf("the upstream was sent %d held requests", n)
	}
	a.approve(id, `{"scope": "once", "comment": "looks fine"}`)
	out := c.wait()
	if !hasStatus(out, 200) || !strings.Contains(out, "auth=Bearer [REDACTED]") {
		t.Fatalf("curl after approval:\n%s", out)
	}
	got := e.received()
	last := got[len(got)-1]
	if last.URL.Path != "/ask/push" || last.Header.Get("Authorization") != "Bearer "+e.canary {
		t.Fatalf("the upstream got %s, credential sent: %v", last.URL.Path, last.Header.Get("Authorization") != "")
	}
	dec := decisionOf(t, e.broker, "/ask/push")
	ap, _ := dec["approval"].(map[string]any)
	if dec["decision"] != "allow" || ap["id"] != id || ap["by"] != "local" || ap["outcome"] != "approved" || ap["scope"] != "once" || ap["comment"] != "looks fine" {
		t.Fatalf("decision event: %v", dec)
	}
	e.broker.waitAuditWhere(t, 1, "approve event", func(ev auditEvent) bool {
		return ev["msg"] == "approval" && ev["action"] == "approve" && ev["id"] == id && ev["by"] == "local"
	})
}

func TestApprovalDeniedAndTimedOut(t *testing.T) {
	e, a := askEnv(t, "")
	ev := a.events()
	c := e.curlStart("-i", e.url("/ask/delete"))
	id := ev.approval("pending")
	if code, _ := a.call("POST", "/api/approvals/"+id+"/deny", `{"comment": "use a branch"}`, nil); code != 200 {
		t.Fatalf("deny: %d", code)
	}
	out := c.wait()
	if !hasStatus(out, 403) || !strings.Contains(out, `"error":"denied_by_approver"`) || !strings.Contains(out, "use a branch") {
		t.Fatalf("denied:\n%s", out)
	}
	out, _ = e.curl("-i", e.url("/quick/x"))
	if !hasStatus(out, 403) || !strings.Contains(out, `"error":"approval_timeout"`) {
		t.Fatalf("timeout:\n%s", out)
	}
	if n := e.receivedUnder("/ask/") + e.receivedUnder("/quick/"); n != 0 {
		t.Fatalf("refused requests reached the upstream: %d", n)
	}
	if dec := decisionOf(t, e.broker, "/quick/x"); dec["decision"] != "deny" || dec["approval"].(map[string]any)["outcome"] != "timeout" {
		t.Fatalf("timeout event: %v", dec)
	}
	// An LLM API host's client reads the error in its API's shape.
	out, _ = e.curl("-i", "-X", "POST", "-H", "Content-Type: application/json", "-d", "{}", e.url("/quick/v1/chat/completions"))
	if !hasStatus(out, 403) || !strings.Contains(out, `"code":"approval_timeout"`) || !strings.Contains(out, `"message":"capbroker approval_timeout:`) {
		t.Fatalf("OpenAI-shaped timeout:\n%s", out)
	}
}

func TestApprovalWithdrawnWhenAgentDisconnects(t *testing.T) {
	e, a := askEnv(t, "")
	ev := a.events()
	// Over HTTP/1.1 in the tunnel first, then HTTP/2 (curl's choice).
	c := e.curlStart("--http1.1", e.url("/ask/gone1"))
	id := ev.approval("pending")
	_ = c.cmd.Process.Kill()
	if got := ev.approval("withdrawn"); got != id {
		t.Fatalf("withdrawn %s, want %s", got, id)
	}
	c = e.curlStart(e.url("/ask/gone"))
	id = ev.approval("pending")
	_ = c.cmd.Process.Kill()
	if got := ev.approval("withdrawn"); got != id {
		t.Fatalf("withdrawn %s, want %s", got, id)
	}
	if _, list := a.call("GET", "/api/approvals", "", nil); len(list["pending"].([]any)) != 0 {
		t.Fatalf("still pending: %v", list)
	}
	e.broker.waitAuditWhere(t, 1, "withdrawn event", func(ev auditEvent) bool {
		return ev["msg"] == "approval" && ev["action"] == "withdrawn" && ev["id"] == id
	})
	if code, _ := a.call("POST", "/api/approvals/"+id+"/approve", `{}`, nil); code != 404 {
		t.Fatalf("approving a withdrawn request: %d", code)
	}
	if e.receivedUnder("/ask/") != 0 {
		t.Fatal("a withdrawn request reached the upstream")
	}
}

func TestApprovalGrantRevokeAndCLI(t *testing.T) {
	e, a := askEnv(t, "")
	ev := a.events()
	cli := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(brokerBin, append([]string{"approvals"}, append(args, "--admin", "http://"+e.broker.adminAddr)...)...)
		cmd.Env = harness.Env()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("broker approvals %v: %v\n%s", args, err, out)
		}
		return string(out)
	}

	c := e.curlStart("-i", e.url("/ask/repo/pulls"))
	id := ev.approval("pending")
	if out := cli("list"); !strings.Contains(out, id) || !strings.Contains(out, "GET https://127.0.0.1:") || !strings.Contains(out, "writes need a person") {
		t.Fatalf("list:\n%s", out)
	}
	out := cli("approve", id, "--scope", "agent", "--duration", "10m", "--comment", "for this task")
	if !strings.Contains(out, "approved "+id) || !strings.Contains(out, "/ask/repo/") {
		t.Fatalf("approve:\n%s", out)
	}
	if out := c.wait(); !hasStatus(out, 200) {
		t.Fatalf("curl:\n%s", out)
	}
	// The grant answers the next request under its prefix without asking.
	if out, _ := e.curl("-i", e.url("/ask/repo/issues")); !hasStatus(out, 200) {
		t.Fatalf("granted request:\n%s", out)
	}
	dec := decisionOf(t, e.broker, "/ask/repo/issues")
	ap, _ := dec["approval"].(map[string]any)
	if ap["outcome"] != "granted" || ap["scope"] != "agent" || ap["by"] != "local" {
		t.Fatalf("granted decision event: %v", dec)
	}
	out = cli("grants")
	var gid string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "/ask/repo/") {
			gid = strings.Fields(line)[0]
		}
	}
	if gid == "" || !strings.Contains(out, "agent") {
		t.Fatalf("grants:\n%s", out)
	}
	if out := cli("revoke", gid); !strings.Contains(out, "revoked "+gid) {
		t.Fatalf("revoke:\n%s", out)
	}
	e.broker.waitAuditWhere(t, 1, "revoke event", func(ev auditEvent) bool {
		return ev["msg"] == "approval" && ev["action"] == "revoke" && ev["id"] == gid && ev["by"] == "local"
	})
	// Revoked: asked again.
	c = e.curlStart("-i", e.url("/ask/repo/again"))
	id = ev.approval("pending")
	if out := cli("deny", id, "--comment", "enough"); !strings.Contains(out, "denied "+id) {
		t.Fatalf("deny:\n%s", out)
	}
	if out := c.wait(); !hasStatus(out, 403) || !strings.Contains(out, "denied_by_approver") {
		t.Fatalf("after revoke:\n%s", out)
	}
}

func TestApprovalAlwaysWritesPolicyData(t *testing.T) {
	e, a := askEnv(t, "")
	ev := a.events()
	c := e.curlStart("-i", "-X", "DELETE", e.url("/ask/things/7"))
	id := ev.approval("pending")
	mark := e.broker.logs.mark()
	res := a.approve(id, `{"scope": "always", "method": "*", "path_prefix": "/ask/things/"}`)
	g, _ := res["grant"].(map[string]any)
	if g["kind"] != "always" || g["expires"] != nil {
		t.Fatalf("grant: %v", res)
	}
	if out := c.wait(); !hasStatus(out, 200) {
		t.Fatalf("curl:\n%s", out)
	}
	raw, err := os.ReadFile(filepath.Join(e.broker.policyDir, "approved.json"))
	if err != nil || !strings.Contains(string(raw), `"path_prefix": "/ask/things/"`) {
		t.Fatalf("approved.json: %s %v", raw, err)
	}
	e.broker.logs.waitFrom(t, mark, `"message":"policy reloaded"`)
	// The policy itself now allows it: no approval at all in the event.
	if out, _ := e.curl("-i", "-X", "POST", e.url("/ask/things/8")); !hasStatus(out, 200) {
		t.Fatalf("after always:\n%s", out)
	}
	if dec := decisionOf(t, e.broker, "/ask/things/8"); dec["approval"] != nil || dec["decision"] != "allow" {
		t.Fatalf("decision event: %v", dec)
	}
	if _, gs := a.call("GET", "/api/grants", "", nil); !strings.Contains(fmt.Sprint(gs), "always") {
		t.Fatalf("grants: %v", gs)
	}
}

func TestApprovalQueueBounds(t *testing.T) {
	e, a := askEnv(t, "approvals: {max_pending_per_agent: 1}\n")
	ev := a.events()
	c := e.curlStart(e.url("/ask/one"))
	id := ev.approval("pending")
	out, _ := e.curl("-i", e.url("/ask/two"))
	if !hasStatus(out, 429) || !strings.Contains(out, `"error":"approval_queue_full"`) {
		t.Fatalf("over the bound:\n%s", out)
	}
	if _, list := a.call("GET", "/api/approvals", "", nil); len(list["pending"].([]any)) != 1 {
		t.Fatalf("queued over the bound: %v", list)
	}
	a.approve(id, `{}`)
	c.wait()
}

func TestApprovalConnectPhase(t *testing.T) {
	e, a := askEnv(t, "")
	ev := a.events()
	u := strings.Replace(e.url("/open/tunnel"), "127.0.0.1", "localhost", 1)
	c := e.curlStart("-i", u)
	id := ev.approval("pending")
	_, list := a.call("GET", "/api/approvals", "", nil)
	p := list["pending"].([]any)[0].(map[string]any)
	if p["phase"] != "connect" || p["host"] != "localhost" || p["method"] != "CONNECT" {
		t.Fatalf("pending connect: %v", p)
	}
	a.approve(id, `{}`)
	if out := c.wait(); !hasStatus(out, 200) || !strings.Contains(out, "path=/open/tunnel") {
		t.Fatalf("curl:\n%s", out)
	}
}

func TestApprovalCSRFAndAgentCannotReachAdmin(t *testing.T) {
	e, a := askEnv(t, "")
	ev := a.events()
	c := e.curlStart("-i", e.url("/ask/csrf"))
	id := ev.approval("pending")
	approve := "/api/approvals/" + id + "/approve"
	if code, out := a.call("POST", approve, `{}`, map[string]string{"Origin": "http://evil.example"}); code != 403 || out["error"] != "csrf" {
		t.Fatalf("foreign origin: %d %v", code, out)
	}
	if code, out := a.call("POST", approve, `{}`, map[string]string{"X-CSRF-Token": ""}); code != 403 || out["error"] != "csrf" {
		t.Fatalf("no CSRF token: %d %v", code, out)
	}
	// The agent, through the proxy, cannot reach the admin listener at all.
	out, _ := e.curl("-i", "http://"+e.broker.adminAddr+"/api/approvals")
	if hasStatus(out, 200) || strings.Contains(out, id) {
		t.Fatalf("the agent reached the admin API:\n%s", out)
	}
	dec := decisionOf(t, e.broker, "/api/approvals")
	if dec["decision"] != "deny" || !strings.Contains(fmt.Sprint(dec["reason"]), "the broker's own listener") || !hasStatus(out, 403) {
		t.Fatalf("admin request through the proxy: %v\n%s", dec, out)
	}
	if _, list := a.call("GET", "/api/approvals", "", nil); len(list["pending"].([]any)) != 1 {
		t.Fatal("the refused POSTs changed something")
	}
	a.call("POST", "/api/approvals/"+id+"/deny", `{}`, nil)
	c.wait()
}

func TestApprovalRestartKeepsGrantsAndInterruptsPending(t *testing.T) {
	e, a := askEnv(t, "")
	ev := a.events()
	c := e.curlStart(e.url("/ask/kept/1"))
	a.approve(ev.approval("pending"), `{"scope": "agent"}`)
	c.wait()
	c = e.curlStart("-i", e.url("/ask/other/1"))
	ev.approval("pending")
	if err := e.broker.stop(t); err != nil {
		t.Fatalf("broker exit: %v", err)
	}
	if out := c.wait(); !hasStatus(out, 503) || !strings.Contains(out, `"error":"approval_interrupted"`) {
		t.Fatalf("held at SIGTERM:\n%s", out)
	}
	state, err := os.ReadFile(filepath.Join(e.broker.dir, "capbroker-approvals.json"))
	if err != nil || !strings.Contains(string(state), `"path_prefix": "/ask/kept/"`) {
		t.Fatalf("state file: %s %v", state, err)
	}
	// The same config again: the grant applies at once.
	b2 := restartBroker(t, e.broker)
	e.broker = b2
	if out, _ := e.curl("-i", e.url("/ask/kept/2")); !hasStatus(out, 200) {
		t.Fatalf("after restart:\n%s", out)
	}
	if _, gs := newAdmin(t, b2).call("GET", "/api/grants", "", nil); len(gs["grants"].([]any)) != 1 {
		t.Fatalf("grants after restart: %v", gs)
	}
}

// restartBroker runs the broker again with the config of b, which has stopped.
func restartBroker(t *testing.T, b *brokerProc) *brokerProc {
	t.Helper()
	n := &brokerProc{dir: b.dir, caFile: b.caFile, policyDir: b.policyDir, logs: newLogTail(), auditLog: newLogTail(), done: make(chan error, 1)}
	n.cmd = exec.Command(brokerBin, b.cmd.Args[1:]...)
	n.cmd.Env = b.cmd.Env
	n.cmd.Stdout, n.cmd.Stderr = n.auditLog, n.logs
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := n.cmd.Wait()
		n.logs.Write([]byte(fmt.Sprintf("broker process exited: %v\n", err)))
		n.done <- err
	}()
	t.Cleanup(func() { n.stop(t) })
	var l struct{ Proxy, Admin string }
	if err := json.Unmarshal([]byte(n.logs.wait(t, `"message":"listening"`)), &l); err != nil {
		t.Fatal(err)
	}
	n.proxyAddr, n.adminAddr = l.Proxy, l.Admin
	return n
}

func TestAdminOffLoopbackNeedsAuth(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "broker.yaml")
	if out, err := exec.Command(brokerBin, "ca", "init", "--out", dir).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	_ = os.WriteFile(cfg, []byte(fmt.Sprintf("admin: {listen: \"0.0.0.0:0\"}\nca: {cert_file: %q, key_file: %q}\npolicy: {dir: %q}\n",
		filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"), dir)), 0o600)
	cmd := exec.Command(brokerBin, "run", "--config", cfg)
	cmd.Env = harness.Env()
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "admin.listen") || !strings.Contains(string(out), "admin.token_env") {
		t.Fatalf("started with an unauthenticated admin listener off loopback: %v\n%s", err, out)
	}
}

func TestApprovalAdminTokenRequired(t *testing.T) {
	adminToken := randHex(16)
	e := newEnv(t, envOpts{policy: askPolicy, admin: "token_env: ADMIN_TOKEN", env: []string{"ADMIN_TOKEN=" + adminToken}})
	a := &admin{t: t, b: e.broker}
	if code, _ := a.call("GET", "/api/approvals", "", nil); code != 401 {
		t.Fatalf("without the token: %d", code)
	}
	a.token = adminToken
	ev := a.events()
	c := e.curlStart("-i", e.url("/ask/tok"))
	id := ev.approval("pending")
	cmd := exec.Command(brokerBin, "approvals", "approve", id, "--admin", e.broker.adminAddr, "--token-env", "ADMIN_TOKEN")
	cmd.Env = append(harness.Env(), "ADMIN_TOKEN="+adminToken)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cli: %v %s", err, out)
	}
	if out := c.wait(); !hasStatus(out, 200) {
		t.Fatalf("curl:\n%s", out)
	}
	if dec := decisionOf(t, e.broker, "/ask/tok"); dec["approval"].(map[string]any)["by"] != "token" {
		t.Fatalf("event: %v", dec)
	}
}

func TestApprovalWebhookRetriesAndMetrics(t *testing.T) {
	var mu sync.Mutex
	var calls int
	got := make(chan []byte, 10)
	sigs := make(chan string, 10)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		calls++
		fail := calls <= 2
		mu.Unlock()
		if fail {
			http.Error(w, "chat is down", http.StatusServiceUnavailable)
			return
		}
		sigs <- r.Header.Get("X-Capbroker-Signature")
		got <- body
	}))
	defer recv.Close()
	secret := randHex(16)
	e := newEnv(t, envOpts{policy: askPolicy, env: []string{"HOOK_SECRET=" + secret},
		extraConfig: fmt.Sprintf("approvals: {console_url: \"https://console.example/console/\", webhook: {url: %q, secret_env: HOOK_SECRET}}\n", recv.URL)})
	a := newAdmin(t, e.broker)
	ev := a.events()
	c1 := e.curlStart(e.url("/ask/hook1"))
	id := ev.approval("pending")
	body := <-got
	sig := <-sigs
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	if sig != "sha256="+hex.EncodeToString(m.Sum(nil)) {
		t.Fatalf("signature %q", sig)
	}
	var msg map[string]any
	if err := json.Unmarshal(body, &msg); err != nil {
		t.Fatal(err)
	}
	if text, _ := msg["text"].(string); !strings.Contains(text, "https://console.example/console/#approval-"+id) || !strings.Contains(text, agentID) {
		t.Fatalf("message: %s", body)
	}
	// A second message arrives only once the first delivery is over (and counted).
	c2 := e.curlStart(e.url("/ask/hook2"))
	id2 := ev.approval("pending")
	<-got
	metrics := func() string {
		resp, err := http.Get("http://" + e.broker.adminAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}()
	for _, want := range []string{`capbroker_webhook_deliveries_total{outcome="retry"} 2`, `capbroker_webhook_deliveries_total{outcome="failed"} 0`, `capbroker_approvals_pending 2`} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("metrics lack %s", want)
		}
	}
	// The first message is counted delivered; the second may be already.
	if !strings.Contains(metrics, `capbroker_webhook_deliveries_total{outcome="ok"} 1`+"\n") && !strings.Contains(metrics, `capbroker_webhook_deliveries_total{outcome="ok"} 2`+"\n") {
		t.Errorf("metrics: deliveries not counted ok:\n%s", metrics)
	}
	a.call("POST", "/api/approvals/"+id+"/deny", `{}`, nil)
	a.call("POST", "/api/approvals/"+id2+"/deny", `{}`, nil)
	c1.wait()
	c2.wait()
}
