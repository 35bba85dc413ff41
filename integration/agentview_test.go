package integration

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// What agents and approvers see of a refusal (issue 34): in the shape their client reads, and
// in an audit event that names what was asked.

// mcpEnv is an env whose upstream fronts server-everything at /api/custom/mcp (an MCP endpoint
// under mcpPolicy) and has a JSON-RPC endpoint at /api/custom/rpc.
func mcpEnv(t *testing.T) (*env, string) {
	t.Helper()
	modules := nodeModules(t)
	addr := startMCPEverything(t, modules)
	front := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: addr})
	front.FlushInterval = -1
	e := newEnv(t, envOpts{
		policy:      mcpPolicy,
		policyFiles: map[string]string{"mcp.rego": readShipped(t, "mcp.rego"), "data.yaml": mcpData},
		handler:     http.StripPrefix("/api/custom", front),
		extraConfig: "protocols:\n  mcp: [{hosts: [127.0.0.1], path: /api/custom/mcp}]\n  jsonrpc: [{hosts: [127.0.0.1], path: /api/custom/rpc}]\n",
	})
	return e, modules
}

// TestAgentViewMCPRefusalSettlesTheCall: the official MCP SDK client's call of a tool the
// policy refuses rejects with an McpError (JSON-RPC code -32000, not a transport error with the
// HTTP status) whose message is the broker's reason, and the session goes on serving the next
// call. The audit event keeps the deny and the refusal's status.
func TestAgentViewMCPRefusalSettlesTheCall(t *testing.T) {
	e, modules := mcpEnv(t)
	done := make(chan string, 1)
	go func() {
		done <- e.run(filepath.Dir(modules), e.agentEnv(), "node", "mcp-client.mjs", e.url("/api/custom/mcp"))
	}()
	var got string
	select {
	case got = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the MCP client did not finish")
	}
	lines := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(got), "\n") {
		step, rest, _ := strings.Cut(l, " ")
		lines[step] = rest
	}
	for step, want := range map[string]string{
		"sum-error":         `"-32000 MCP error -32000: capbroker denied: MCP tool get-sum is not allowed on 127.0.0.1: agents may call echo, trigger-long-running-operation. This request is not allowed`,
		"echo-secret-error": `"-32000 MCP error -32000: capbroker denied: MCP tool echo: argument message secret-plan is not allowed for agent ` + agentID,
		"long":              `Long running operation completed`,
	} {
		if !strings.HasPrefix(lines[step], want) && !strings.Contains(lines[step], want) {
			t.Errorf("%s: %q lacks %q\nclient output:\n%s", step, lines[step], want, got)
		}
	}
	evs := e.broker.waitAuditWhere(t, 1, "the get-sum call's event", func(ev auditEvent) bool {
		m, _ := ev["mcp"].(map[string]any)
		return m != nil && m["tool"] == "get-sum"
	})
	if ev := evs[0]; ev["decision"] != "deny" || ev["status"] != float64(403) || !strings.Contains(ev["reason"].(string), "get-sum is not allowed") {
		t.Errorf("the get-sum call's event: %v", ev)
	}
}

// TestAgentViewMCPBatchAndNotifications: a refused batch is answered with an error response
// for each of its requests, by id (strings and numbers as sent), none for its notification,
// and its audit event names every message; a refused notification alone, which no id can
// answer, keeps the 403; a JSON-RPC endpoint's refusal answers by id too, and its event names
// the method; a session the broker never saw issued is a 404 audited as a deny.
func TestAgentViewMCPBatchAndNotifications(t *testing.T) {
	e, _ := mcpEnv(t)
	c := e.broker.client(t, agentID, e.token)
	hdr := []string{"Accept", "application/json, text/event-stream", "Mcp-Protocol-Version", "2025-06-18"}
	event := func(resp http.Header) auditEvent {
		t.Helper()
		return e.broker.waitAudit(t, resp.Get("X-Broker-Request-Id"))
	}

	batch := `[{"jsonrpc":"2.0","id":"a-1","method":"tools/call","params":{"name":"echo","arguments":{"message":"hello"}}},` +
		`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}},` +
		`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"get-sum","arguments":{"a":1,"b":2}}}]`
	status, body, h := postJSONHeader(t, c, e.url("/api/custom/mcp"), batch, hdr...)
	if status != 200 || !strings.HasPrefix(body, `[{"jsonrpc":"2.0","id":"a-1","error":{"code":-32000,"message":"capbroker denied: MCP tool get-sum is not allowed`) ||
		!strings.Contains(body, `},{"jsonrpc":"2.0","id":9,"error":{"code":-32000,`) || strings.Count(body, `"jsonrpc"`) != 2 {
		t.Errorf("batch: %d %s", status, body)
	}
	ev := event(h)
	m, _ := ev["mcp"].(map[string]any)
	b, _ := m["batch"].([]any)
	if ev["decision"] != "deny" || ev["status"] != float64(403) || m["method"] != "tools/call" || m["tool"] != "echo" || len(b) != 3 ||
		b[1].(map[string]any)["method"] != "notifications/progress" || b[2].(map[string]any)["tool"] != "get-sum" {
		t.Errorf("batch event: %v", ev)
	}

	status, body, h = postJSONHeader(t, c, e.url("/api/custom/mcp"),
		`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"get-sum","arguments":{}}}`, hdr...)
	if status != 403 || !strings.HasPrefix(body, `{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"capbroker denied: MCP tool get-sum`) {
		t.Errorf("notification: %d %s", status, body)
	}
	if ev := event(h); ev["decision"] != "deny" {
		t.Errorf("notification event: %v", ev)
	}

	status, body, h = postJSONHeader(t, c, e.url("/api/custom/rpc"), `{"jsonrpc":"2.0","id":"q","method":"eth_sendRawTransaction","params":["0x00"]}`, hdr...)
	if status != 200 || !strings.HasPrefix(body, `{"jsonrpc":"2.0","id":"q","error":{"code":-32000,"message":"capbroker denied: `) {
		t.Errorf("JSON-RPC: %d %s", status, body)
	}
	if ev := event(h); ev["decision"] != "deny" || ev["jsonrpc"] == nil || ev["jsonrpc"].(map[string]any)["method"] != "eth_sendRawTransaction" {
		t.Errorf("JSON-RPC event: %v", ev)
	}

	status, body, h = postJSONHeader(t, c, e.url("/api/custom/mcp"), `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`,
		append(hdr, "Mcp-Session-Id", "made-up-"+randHex(8))...)
	if status != 404 || !strings.Contains(body, "mcp_session_unknown") {
		t.Errorf("unknown session: %d %s", status, body)
	}
	if ev := event(h); ev["decision"] != "deny" || ev["status"] != float64(404) {
		t.Errorf("unknown session event: %v", ev)
	}
}

// TestAgentViewChallengeNamesTarget: the 407 asking for proxy credentials, for a CONNECT or a
// plain-HTTP request in absolute form, is audited with the host and port the agent asked for.
func TestAgentViewChallengeNamesTarget(t *testing.T) {
	b := startBroker(t, brokerOpts{policy: testPolicy, config: canaryConfig(newUpstreamPKI(t).File, []string{agentID}, ""),
		env: []string{tokenEnv(agentID) + "=" + randHex(16), "CANARY_SECRET=sk-canary-" + randHex(8)}})
	for _, c := range []struct{ head, host string }{
		{"CONNECT 127.0.0.1:8443 HTTP/1.1\r\nHost: 127.0.0.1:8443\r\n\r\n", "127.0.0.1:8443"},
		{"GET http://127.0.0.2:8080/x HTTP/1.1\r\nHost: 127.0.0.2:8080\r\n\r\n", "127.0.0.2:8080"},
		{"GET http://127.0.0.3/x HTTP/1.1\r\nHost: 127.0.0.3\r\n\r\n", "127.0.0.3:80"},
	} {
		conn, err := net.Dial("tcp", b.proxyAddr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = conn.Write([]byte(c.head))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		conn.Close()
		if err != nil || resp.StatusCode != 407 {
			t.Fatalf("%q: %v %v", c.head, resp, err)
		}
		host, port, _ := net.SplitHostPort(c.host)
		ev := b.waitAudit(t, resp.Header.Get("X-Broker-Request-Id"))
		if ev["decision"] != "challenge" || ev["host"] != host || fmt.Sprint(ev["port"]) != port {
			t.Errorf("%q: event %v", c.head, ev)
		}
	}
}

// TestAgentViewConsoleHistory: a console opened after a held request was decided shows that
// decision (recently decided, and the decision in the live list), and the card of the same
// agent's next question shows what it asked before and how that was decided.
func TestAgentViewConsoleHistory(t *testing.T) {
	b := newBrokerBackend(t)
	res := b.request(t, "DELETE", "/held/history/first", nil, "")
	first := pendingID(t, b, "/held/history/first")
	if code, body := api(t, b, "POST", "/api/approvals/"+first+"/deny", map[string]string{"comment": "not this one"}); code != 200 {
		t.Fatalf("deny: %d %v", code, body)
	}
	if r := recv(t, res); r.status != 403 {
		t.Fatalf("denied request: %d %s", r.status, r.body)
	}
	if r := recv(t, b.request(t, "GET", "/open/before-the-page", nil, "")); r.status != 200 {
		t.Fatalf("allowed request: %d %s", r.status, r.body)
	}
	b.e.broker.auditLog.wait(t, `"path":"/open/before-the-page"`)

	ctx := newBrowser(t)
	login(t, ctx, b.adminURL(), b.adminToken())
	item := fmt.Sprintf(`#recent li[data-id=%q]`, first)
	do(t, ctx, chromedp.WaitVisible(chromedp.CSS(item)))
	if got := eval[string](t, ctx, `document.querySelector('`+item+`').textContent`); !strings.Contains(got, "denied by token “not this one”") ||
		!strings.Contains(got, "DELETE 127.0.0.1") || !strings.Contains(got, "/held/history/first") || !strings.Contains(got, agentID) {
		t.Errorf("recently decided: %q", got)
	}
	waitJS(t, ctx, "the decisions made before the page opened", `[...document.querySelectorAll('#live li')].some((li) => li.textContent.includes('/open/before-the-page'))`+
		` && [...document.querySelectorAll('#live li')].some((li) => li.textContent.includes('/held/history/first'))`)

	res = b.request(t, "DELETE", "/held/history/second", nil, "")
	second := pendingID(t, b, "/held/history/second")
	history := card(second) + " .history-box"
	do(t, ctx, chromedp.WaitVisible(chromedp.CSS(history)))
	if got := eval[string](t, ctx, `document.querySelector('`+history+`').textContent`); !strings.Contains(got, "asked before") ||
		!strings.Contains(got, "denied by token") || !strings.Contains(got, "/held/history/first") {
		t.Errorf("the card's history: %q", got)
	}
	// A decision replayed when the stream opened and seen live is listed once.
	do(t, ctx, chromedp.Click(chromedp.CSS(card(second)+" button.approve")))
	if r := recv(t, res); r.status != 200 {
		t.Fatalf("approved request: %d %s", r.status, r.body)
	}
	do(t, ctx, chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#recent li[data-id=%q]`, second))))
	if n := eval[float64](t, ctx, `[...document.querySelectorAll('#live li')].filter((li) => li.textContent.includes('/open/before-the-page')).length`); n != 1 {
		t.Errorf("the earlier decision is listed %v times", n)
	}
}
