package integration

// audit.format: ocsf, end to end: a broker writes OCSF 1.8 events for a real request whose
// response echoes the injected secret, a denial, an LLM call, an intercepted CONNECT and a
// refused one; every line validates against the published schema (ocsfschema), the classes
// and findings are the ones docs/observability.md names, the secret appears nowhere, and
// `policy replay` and `policy learn` read the OCSF log as they read the broker's own.

import (
	"bufio"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/capbroker/capbroker/broker/audit/ocsf/ocsfschema"
)

const ocsfAgent = "ocsf-agent"

const ocsfPolicy = `package broker

default decision := {"allow": false, "reason": "not allowed by the ocsf test policy"}

decision := {"allow": true, "intercept": true} if {
	input.phase == "connect"
	input.request.host == "127.0.0.1"
}

decision := {"allow": true, "credentials": ["canary"]} if {
	input.phase == "request"
	startswith(input.request.path, "/api/")
}

decision := {"allow": true, "credentials": ["canary"]} if {
	input.phase == "request"
	input.request.path == "/v1/chat/completions"
}
`

func TestOCSFAudit(t *testing.T) {
	schema, err := ocsfschema.Load(ocsfschema.Dir())
	if err != nil {
		t.Fatal(err)
	}
	canary := "sk-canary-ocsf-" + randHex(12)
	pki := newUpstreamPKI(t)
	up := pki.serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		if r.URL.Path == "/v1/chat/completions" {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"c1","object":"chat.completion","model":"gpt-ocsf","choices":[{"index":0,`+
				`"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],`+
				`"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}`)
			return
		}
		w.Header().Set("X-Echo-Authorization", auth) // a hostile upstream echoes the secret
		fmt.Fprintf(w, "you sent %s\n", auth)
	}), false, nil)
	token := randHex(16)
	b := startBroker(t, brokerOpts{
		policy: ocsfPolicy,
		config: canaryConfig(pki.File, []string{ocsfAgent}, `audit: {format: ocsf, instance: ocsf-it, include_input: full}
llm:
  openai_compatible:
    - {name: local, hosts: ["127.0.0.1"], path_prefix: /v1}
`),
		env: []string{tokenEnv(ocsfAgent) + "=" + token, "CANARY_SECRET=" + canary},
	})
	c := b.client(t, ocsfAgent, token)
	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := c.Get(up.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(body)
	}
	resp, body := get("/api/echo")
	if resp.StatusCode != 200 || strings.Contains(body, canary) || !strings.Contains(body, "[REDACTED]") {
		t.Fatalf("echo: %d %q", resp.StatusCode, body)
	}
	echoID := resp.Header.Get("X-Broker-Request-Id")
	resp, _ = get("/forbidden")
	if resp.StatusCode != 403 {
		t.Fatalf("forbidden: %d", resp.StatusCode)
	}
	deniedID := resp.Header.Get("X-Broker-Request-Id")
	llmResp, err := c.Post(up.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"gpt-ocsf","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, llmResp.Body)
	llmResp.Body.Close()
	if llmResp.StatusCode != 200 {
		t.Fatalf("llm: %d", llmResp.StatusCode)
	}
	llmID := llmResp.Header.Get("X-Broker-Request-Id")
	refusedConnect(t, b, token, "denied.invalid:443")
	// A hostile agent writes a path meant to close the event's JSON and start another, with a
	// byte that is not UTF-8 and an escaped newline: the event stays one, whole, in its class.
	hostileID := hostileRequest(t, b, token, up.Listener.Addr().String(),
		"/api/\"},\"unmapped\":{}}{\"class_uid\":2004,\"x\":\"\xff\\%0A")

	if err := b.stop(t); err != nil { // writes every pending event
		t.Fatalf("broker: %v", err)
	}
	lines := b.auditLog.snapshot()
	var evs []auditEvent
	for i, line := range lines {
		for _, p := range schema.Validate([]byte(line)) {
			t.Errorf("line %d: %s\n%s", i, p, line)
		}
		var ev auditEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("line %d is not JSON: %s", i, line)
		}
		if _, native := ev["msg"]; native {
			t.Errorf("line %d is the broker's own JSON line, not OCSF: %s", i, line)
		}
		evs = append(evs, ev)
	}
	all := strings.Join(lines, "\n") + b.logs.String()
	if strings.Contains(all, canary) {
		t.Error("the canary secret appears in the audit log or the broker's log")
	}

	// find returns the one event of the class about the request id (its correlation_uid).
	findAll := func(class float64, requestID string, match func(auditEvent) bool) []auditEvent {
		var found []auditEvent
		for _, ev := range evs {
			md, _ := ev["metadata"].(map[string]any)
			if ev["class_uid"] == class && (requestID == "" || md["correlation_uid"] == requestID) && (match == nil || match(ev)) {
				found = append(found, ev)
			}
		}
		return found
	}
	find := func(t *testing.T, class float64, requestID string, match func(auditEvent) bool) auditEvent {
		t.Helper()
		found := findAll(class, requestID, match)
		if len(found) != 1 {
			t.Fatalf("%d events of class %v for %q, want 1:\n%s", len(found), class, requestID, strings.Join(lines, "\n"))
		}
		return found[0]
	}
	expect := func(t *testing.T, ev auditEvent, path string, want any) {
		t.Helper()
		if got := lookup(ev, path); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("class %v %s = %v, want %v", ev["class_uid"], path, got, want)
		}
	}

	t.Run("request with a secret echoed", func(t *testing.T) {
		ev := find(t, 4002, echoID, nil)
		expect(t, ev, "http_request.url.path", "/api/echo")
		expect(t, ev, "http_response.code", 200)
		expect(t, ev, "actor.user.name", ocsfAgent)
		expect(t, ev, "disposition", "Allowed")
		expect(t, ev, "metadata.reporter.name", "ocsf-it")
		expect(t, ev, "unmapped.credentials", []any{"canary"})
		expect(t, ev, "unmapped.redacted", 2) // the header and the body
		f := find(t, 2004, echoID, nil)
		expect(t, f, "finding_info.types", []any{"secret_redacted"})
		expect(t, f, "severity", "High")
		expect(t, f, "is_alert", true)
	})
	t.Run("denial", func(t *testing.T) {
		ev := find(t, 4002, deniedID, nil)
		expect(t, ev, "action", "Denied")
		expect(t, ev, "status_detail", "not allowed by the ocsf test policy")
		f := find(t, 2004, deniedID, nil)
		expect(t, f, "finding_info.types", []any{"denied"})
		expect(t, f, "finding_info.desc", "not allowed by the ocsf test policy")
	})
	t.Run("LLM call", func(t *testing.T) {
		ev := find(t, 6003, llmID, nil)
		expect(t, ev, "ai_model.name", "gpt-ocsf")
		expect(t, ev, "message_context.prompt_tokens", 12)
		expect(t, ev, "message_context.completion_tokens", 3)
		expect(t, ev, "unmapped.llm.provider", "local")
	})
	t.Run("replay and learn read the OCSF log", func(t *testing.T) {
		dir := t.TempDir()
		logFile := filepath.Join(dir, "audit.ocsf.jsonl")
		if err := os.WriteFile(logFile, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		out, code := run(t, dir, "policy", "replay", "--policies", b.policyDir, "--log", logFile)
		if code != 0 || !strings.Contains(out, "replay: 7 re-decided, 0 changed") {
			t.Errorf("replay of the recording policy: exit %d\n%s", code, out)
		}
		b.writePolicy(t, "broker.rego", strings.Replace(ocsfPolicy, `startswith(input.request.path, "/api/")`, "false", 1))
		out, code = run(t, dir, "policy", "replay", "--policies", b.policyDir, "--log", logFile)
		if code != 1 || !strings.Contains(out, echoID+" "+ocsfAgent+" GET 127.0.0.1 /api/echo: allow [canary] -> deny") {
			t.Errorf("replay of a stricter policy: exit %d\n%s", code, out)
		}
		out, code = run(t, dir, "policy", "learn", "--from", logFile, "--out", filepath.Join(dir, "draft"))
		if code != 0 || !strings.Contains(out, "1 agents") {
			t.Errorf("learn: exit %d\n%s", code, out)
		}
	})
	t.Run("a hostile path", func(t *testing.T) {
		ev := find(t, 4002, hostileID, nil)
		if p, _ := lookup(ev, "http_request.url.path").(string); !strings.HasPrefix(p, "/api/") || !strings.Contains(p, "class_uid") {
			t.Errorf("path %q", p)
		}
		if n := len(findAll(2004, hostileID, nil)); n > 1 {
			t.Errorf("%d findings for one request", n)
		}
	})
	t.Run("CONNECT", func(t *testing.T) {
		isHost := func(h string) func(auditEvent) bool {
			return func(ev auditEvent) bool {
				return lookup(ev, "dst_endpoint.ip") == h || lookup(ev, "dst_endpoint.hostname") == h
			}
		}
		opened := findAll(4001, "", func(ev auditEvent) bool { return isHost("127.0.0.1")(ev) && ev["activity_name"] == "Open" })
		if len(opened) == 0 { // one per tunnel the client opened
			t.Fatal("no Network Activity Open for the CONNECTs to 127.0.0.1")
		}
		expect(t, opened[0], "connection_info.direction", "Outbound")
		refused := find(t, 4001, "", isHost("denied.invalid"))
		expect(t, refused, "activity_name", "Refuse")
		id := lookup(refused, "metadata.correlation_uid").(string)
		f := find(t, 2004, id, nil)
		expect(t, f, "evidences", []any{map[string]any{
			"actor":        map[string]any{"user": map[string]any{"name": ocsfAgent, "uid": ocsfAgent, "type_id": 4.0, "type": "Service"}},
			"src_endpoint": map[string]any{"ip": "127.0.0.1"},
			"dst_endpoint": map[string]any{"hostname": "denied.invalid", "port": 443.0},
		}})
	})
}

// ocsfConnect sends a CONNECT as the test's agent and returns the connection and the answer.
func ocsfConnect(t *testing.T, b *brokerProc, token, hostport string) (net.Conn, *http.Response) {
	t.Helper()
	conn, err := net.Dial("tcp", b.proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	auth := base64.StdEncoding.EncodeToString([]byte(ocsfAgent + ":" + token))
	fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", hostport, hostport, auth)
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	return conn, resp
}

// refusedConnect sends a CONNECT the policy denies and checks the 403.
func refusedConnect(t *testing.T, b *brokerProc, token, hostport string) {
	t.Helper()
	conn, resp := ocsfConnect(t, b, token, hostport)
	defer conn.Close()
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Fatalf("CONNECT %s: %d, want 403", hostport, resp.StatusCode)
	}
}

// hostileRequest sends GET path, bytes as they are, in an intercepted tunnel to hostport and
// returns the request id of the broker's answer.
func hostileRequest(t *testing.T, b *brokerProc, token, hostport, path string) string {
	t.Helper()
	raw, resp := ocsfConnect(t, b, token, hostport)
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %d", resp.StatusCode)
	}
	conn := tls.Client(raw, &tls.Config{RootCAs: b.caPool(t), ServerName: "127.0.0.1"})
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, hostport)
	answer, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, answer.Body)
	answer.Body.Close()
	id := answer.Header.Get("X-Broker-Request-Id")
	if id == "" {
		t.Fatalf("no request id in the answer (%d) to GET %q", answer.StatusCode, path)
	}
	return id
}

// TestOCSFApproval: with audit.format ocsf, a person's approval of a held request is a User
// Access Management event naming the approver and the agent, the held request's activity
// carries the approval, and the console's live stream still reads the broker's own lines.
func TestOCSFApproval(t *testing.T) {
	schema, err := ocsfschema.Load(ocsfschema.Dir())
	if err != nil {
		t.Fatal(err)
	}
	canary := "sk-canary-ocsf-" + randHex(12)
	pki := newUpstreamPKI(t)
	up := pki.serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "done\n")
	}), false, nil)
	token := randHex(16)
	b := startBroker(t, brokerOpts{
		policy: askPolicy,
		config: canaryConfig(pki.File, []string{ocsfAgent}, "audit: {format: ocsf}\n"),
		env:    []string{tokenEnv(ocsfAgent) + "=" + token, "CANARY_SECRET=" + canary},
	})
	a := newAdmin(t, b)
	stream := a.events()
	c := b.client(t, ocsfAgent, token)
	done := make(chan int, 1)
	go func() {
		resp, err := c.Post(up.URL+"/ask/push", "text/plain", strings.NewReader("push"))
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	id := stream.approval("pending")
	a.approve(id, `{"scope": "once", "comment": "ok"}`)
	if code := <-done; code != 200 {
		t.Fatalf("held request: %d", code)
	}
	// The console's stream: the decision as the broker's own line.
	deadline := time.After(waitTimeout)
	for decided := false; !decided; {
		select {
		case ev, ok := <-stream.events:
			if !ok {
				t.Fatal("the event stream ended")
			}
			if ev[0] == "decision" {
				var d map[string]any
				if json.Unmarshal([]byte(ev[1]), &d) != nil || d["msg"] != "decision" {
					t.Fatalf("the console's decision is not the broker's line: %s", ev[1])
				}
				decided = d["path"] == "/ask/push"
			}
		case <-deadline:
			t.Fatal("no decision on the console's stream")
		}
	}
	if err := b.stop(t); err != nil {
		t.Fatal(err)
	}
	var grant, held auditEvent
	for i, line := range b.auditLog.snapshot() {
		for _, p := range schema.Validate([]byte(line)) {
			t.Errorf("line %d: %s\n%s", i, p, line)
		}
		var ev auditEvent
		_ = json.Unmarshal([]byte(line), &ev)
		switch {
		case ev["class_uid"] == 3005.0:
			grant = ev
		case ev["class_uid"] == 4002.0:
			held = ev
		}
		if strings.Contains(line, canary) {
			t.Error("the canary secret is in the audit log")
		}
	}
	if grant == nil || held == nil {
		t.Fatalf("approval event %v, held request's event %v", grant, held)
	}
	for path, want := range map[string]any{"activity_name": "Assign Privileges", "actor.user.name": "local",
		"user.name": ocsfAgent, "metadata.uid": id, "unmapped.comment": "ok", "unmapped.scope": "once"} {
		if got := lookup(grant, path); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("approval event %s = %v, want %v", path, got, want)
		}
	}
	if p, _ := grant["privileges"].([]any); len(p) != 1 || !strings.Contains(fmt.Sprint(p[0]), "POST https://127.0.0.1:") {
		t.Errorf("privileges %v", grant["privileges"])
	}
	for path, want := range map[string]any{"unmapped.approval.by": "local", "unmapped.approval.outcome": "approved", "http_response.code": 200} {
		if got := lookup(held, path); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("held request's event %s = %v, want %v", path, got, want)
		}
	}
}

// lookup is the value at a dotted path of an event.
func lookup(ev auditEvent, path string) any {
	var cur any = map[string]any(ev)
	for _, k := range strings.Split(path, ".") {
		m, _ := cur.(map[string]any)
		cur = m[k]
	}
	return cur
}

// TestOCSFDNS: the sandbox's resolver's answers and refusals are DNS Activity events, a
// refusal with its finding, valid against the schema. The agent is identified by its source
// address (127.0.0.2), as in transparent mode.
func TestOCSFDNS(t *testing.T) {
	schema, err := ocsfschema.Load(ocsfschema.Dir())
	if err != nil {
		t.Fatal(err)
	}
	adminToken := randHex(16)
	b := startBroker(t, brokerOpts{
		policy: dnsPolicy,
		admin:  "token_env: OCSF_ADMIN_TOKEN",
		config: `agents:
  - {id: ocsf-sandbox, addresses: ["127.0.0.2/32"]}
transparent:
  dns: {listen: "127.0.0.1:0"}
audit: {format: ocsf}
`,
		env: []string{"OCSF_ADMIN_TOKEN=" + adminToken},
	})
	var l struct{ DNS string }
	if err := json.Unmarshal([]byte(b.logs.wait(t, `"message":"resolver listening"`)), &l); err != nil {
		t.Fatal(err)
	}
	c := &dns.Client{Net: "udp", Timeout: waitTimeout, Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)}}}
	for name, want := range map[string]int{"api.allowed.test.": dns.RcodeSuccess, "exfil.denied.test.": dns.RcodeRefused} {
		q := new(dns.Msg)
		q.SetQuestion(name, dns.TypeA)
		r, _, err := c.Exchange(q, l.DNS)
		if err != nil || r.Rcode != want {
			t.Fatalf("%s: %v %v, want rcode %d", name, r, err, want)
		}
	}
	if err := b.stop(t); err != nil {
		t.Fatal(err)
	}
	byHost := map[string][]auditEvent{}
	for i, line := range b.auditLog.snapshot() {
		for _, p := range schema.Validate([]byte(line)) {
			t.Errorf("line %d: %s\n%s", i, p, line)
		}
		var ev auditEvent
		_ = json.Unmarshal([]byte(line), &ev)
		host, _ := lookup(ev, "query.hostname").(string)
		if host == "" {
			host, _ = lookup(ev, "resources").([]any)[0].(map[string]any)["name"].(string)
		}
		byHost[host] = append(byHost[host], ev)
	}
	allowed, denied := byHost["api.allowed.test"], byHost["exfil.denied.test"]
	if len(allowed) != 1 || len(denied) != 2 {
		t.Fatalf("events by name: %v", byHost)
	}
	for path, want := range map[string]any{"class_uid": 4003, "rcode": "NoError", "actor.user.name": "ocsf-sandbox", "src_endpoint.ip": "127.0.0.2", "unmapped.mode": "transparent"} {
		if got := lookup(allowed[0], path); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("answer %s = %v, want %v", path, got, want)
		}
	}
	for path, want := range map[string]any{"class_uid": 4003, "rcode": "Refused", "query.type": "A", "disposition": "Blocked"} {
		if got := lookup(denied[0], path); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("refusal %s = %v, want %v", path, got, want)
		}
	}
	if f := denied[1]; f["class_uid"] != 2004.0 || fmt.Sprint(lookup(f, "finding_info.types")) != "[denied]" {
		t.Errorf("refusal's finding: %v", f)
	}
}
