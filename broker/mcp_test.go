package broker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/identity"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/broker/upstream"
)

// mcpHost is the MCP server of these tests: a host a credential (and so a scrubber) is bound to.
const mcpHost = "api.github.com"

// mcpUpstream is an upstream answering with a function.
type mcpUpstream func(*http.Request) *http.Response

func (f mcpUpstream) RoundTrip(r *http.Request, _ upstream.Pool) (*http.Response, error) {
	return f(r), nil
}
func (mcpUpstream) CloseIdleConnections() {}
func (mcpUpstream) Prepare(string, bool)  {}

const mcpPolicy = `package broker
default decision := {"allow": false, "reason": "tool not allowed"}
decision := {"allow": true} if not input.mcp
decision := {"allow": true} if {
	input.mcp
	every m in input.mcp { m.tool != "delete" }
}`

// mcpBroker is a broker whose protocols.mcp is https://api.github.com/mcp, deciding with
// mcpPolicy, its audit events written to events.
func mcpBroker(t *testing.T, up upstreamClient, events io.Writer) (*Broker, *tunnel) {
	t.Helper()
	e, err := policy.New(context.Background(), fstest.MapFS{"p.rego": {Data: []byte(mcpPolicy)}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.Protocols.MCP = []config.ProtocolEndpoint{{Hosts: []string{mcpHost}, Path: "/mcp"}}
	deps := Deps{Policy: e, Secrets: benchSecrets{}}
	if events != nil {
		deps.Audit = audit.New(events)
	}
	return testBroker(t, cfg, deps, up, mcpHost)
}

func mcpPost(path, body, session string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	r.Host = mcpHost
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Accept", "application/json, text/event-stream")
	if session != "" {
		r.Header.Set("Mcp-Session-Id", session)
	}
	return r
}

// sessionUpstream issues session "s-1" on initialize and answers everything else with {}.
func sessionUpstream(r *http.Request) *http.Response {
	b, _ := io.ReadAll(r.Body)
	h := http.Header{"Content-Type": {"application/json"}}
	if bytes.Contains(b, []byte(`"initialize"`)) {
		h.Set("Mcp-Session-Id", "s-1")
	}
	return &http.Response{StatusCode: 200, Header: h, Body: io.NopCloser(strings.NewReader(`{}`)), Request: r}
}

// TestMCPRequests: the policy decides on the tool called, a body that is not JSON-RPC is
// refused with the reason, a path not configured has no input.mcp, and the audit event names
// the method and tool.
func TestMCPRequests(t *testing.T) {
	var events bytes.Buffer
	br, tun := mcpBroker(t, mcpUpstream(sessionUpstream), &events)
	for _, tc := range []struct {
		path, body string
		code       int
		reason     string
	}{
		{"/mcp", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search","arguments":{}}}`, 200, ""},
		{"/mcp", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"delete","arguments":{}}}`, 200, `{"jsonrpc":"2.0","id":2,"error":{"code":-32000,"message":"capbroker denied: tool not allowed.`},
		{"/mcp", `{"query":"{ viewer { login } }"}`, 403, "the body is not a JSON-RPC message"},
		{"/other", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"delete","arguments":{}}}`, 200, ""},
	} {
		w := httptest.NewRecorder()
		br.serveTunnel(w, mcpPost(tc.path, tc.body, ""), tun)
		if w.Code != tc.code || !strings.Contains(w.Body.String(), tc.reason) {
			t.Errorf("%s %s: %d %s; want %d %q", tc.path, tc.body, w.Code, w.Body, tc.code, tc.reason)
		}
	}
	br.audit.Close()
	if got := events.String(); !strings.Contains(got, `"mcp":{"method":"tools/call","tool":"search"}`) ||
		!strings.Contains(got, `"mcp":{"method":"tools/call","tool":"delete"}`) {
		t.Errorf("audit events lack the mcp objects:\n%s", got)
	}
}

// TestMCPSessionsStayWithTheirAgent: a session id the server issued to one agent is refused
// (a JSON-RPC error) to another, and one the broker never saw issued is answered as unknown (404).
func TestMCPSessionsStayWithTheirAgent(t *testing.T) {
	br, tun := mcpBroker(t, mcpUpstream(sessionUpstream), nil)
	other := *tun
	other.agent = identity.Agent{ID: "other-agent"}
	send := func(tun *tunnel, body, session string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		br.serveTunnel(w, mcpPost("/mcp", body, session), tun)
		return w
	}
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
	if w := send(tun, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`, ""); w.Code != 200 || w.Header().Get("Mcp-Session-Id") != "s-1" {
		t.Fatalf("initialize: %d %v", w.Code, w.Header())
	}
	if w := send(tun, list, "s-1"); w.Code != 200 {
		t.Errorf("the session's own agent: %d %s", w.Code, w.Body)
	}
	if w := send(&other, list, "s-1"); w.Code != 200 || !strings.Contains(w.Body.String(), `"id":2,"error":{"code":-32000,"message":"capbroker denied: this MCP session was issued to another agent`) {
		t.Errorf("another agent: %d %s", w.Code, w.Body)
	}
	if w := send(tun, list, "s-never-issued"); w.Code != 404 {
		t.Errorf("unknown session: %d %s", w.Code, w.Body)
	}
}

// TestMCPStreamedResponse: an MCP server's SSE response reaches the agent event by event,
// scrubbed, while the server is still sending it.
func TestMCPStreamedResponse(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	br, tun := mcpBroker(t, mcpUpstream(func(r *http.Request) *http.Response {
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: pr, Request: r, ContentLength: -1}
	}), nil)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Host = mcpHost
		br.serveTunnel(w, r, tun)
	}))
	defer srv.Close()
	go func() {
		_, _ = io.WriteString(pw, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"leak\":\""+benchSecret+"\"}}\n\n")
	}()
	r, _ := http.NewRequest(http.MethodPost, srv.URL+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"longRunningOperation"}}`))
	r.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	var first string
	for !strings.HasSuffix(first, "\n\n") { // the first event, before the server sends another
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the first event: %v (so far %q)", err, first)
		}
		first += line
	}
	if strings.Contains(first, benchSecret) || !strings.Contains(first, "notifications/progress") {
		t.Errorf("first event: %q", first)
	}
	go func() {
		_, _ = io.WriteString(pw, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n")
		pw.Close()
	}()
	rest, err := io.ReadAll(rd)
	if err != nil || !strings.Contains(string(rest), `"result"`) {
		t.Errorf("rest: %q, %v", rest, err)
	}
}

// TestJSONRPCRequests: for a protocols.jsonrpc endpoint the policy sees the methods of a
// message or a batch, a body that is not JSON-RPC is refused with the reason, and an MCP
// policy's input.mcp is not there.
func TestJSONRPCRequests(t *testing.T) {
	e, err := policy.New(context.Background(), fstest.MapFS{"p.rego": {Data: []byte(`package broker
default decision := {"allow": false, "reason": "method not allowed"}
decision := {"allow": true} if {
	not input.mcp
	every m in input.jsonrpc { startswith(m.method, "eth_get") }
}`)}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.Protocols.JSONRPC = []config.ProtocolEndpoint{{Hosts: []string{mcpHost}, Path: "/rpc/"}}
	br, tun := testBroker(t, cfg, Deps{Policy: e, Secrets: benchSecrets{}}, mcpUpstream(sessionUpstream), mcpHost)
	for _, tc := range []struct {
		path, body string
		code       int
		reason     string
	}{
		{"/rpc/v1", `{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":["0x0","latest"]}`, 200, ""},
		{"/rpc/v1", `[{"jsonrpc":"2.0","id":1,"method":"eth_getBalance"},{"jsonrpc":"2.0","id":2,"method":"eth_sendRawTransaction","params":["0x00"]}]`, 200, `[{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"capbroker denied: method not allowed.`},
		{"/rpc/v1", `{"jsonrpc":"2.0","method":"eth_sendRawTransaction","params":["0x00"]}`, 403, `{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"capbroker denied: method not allowed.`},
		{"/rpc/v1", `[{"jsonrpc":"2.0","id":"a\"b","method":"eth_sendRawTransaction"},{"jsonrpc":"2.0","method":"eth_x"},{"jsonrpc":"2.0","id":{"x":1},"method":"eth_y"}]`, 200, `[{"jsonrpc":"2.0","id":"a\"b","error"`},
		{"/rpc/v1", `{"id":1,"method":"eth_getBalance"}`, 403, "the body is not a JSON-RPC message"},
		{"/other", `{"jsonrpc":"2.0","id":1,"method":"eth_getBalance"}`, 403, "method not allowed"},
	} {
		w := httptest.NewRecorder()
		br.serveTunnel(w, mcpPost(tc.path, tc.body, ""), tun)
		if w.Code != tc.code || !strings.Contains(w.Body.String(), tc.reason) {
			t.Errorf("%s %s: %d %s; want %d %q", tc.path, tc.body, w.Code, w.Body, tc.code, tc.reason)
		}
	}
}

// TestMCPAmbiguousRefused: an MCP call whose members a server may read otherwise than the
// policy is refused before the upstream, with 400 ambiguous_request as a JSON-RPC error
// naming the members (never their values), in every mode; the audit event says deny with the
// reason. A policy denial on the endpoint is a JSON-RPC error too.
func TestMCPAmbiguousRefused(t *testing.T) {
	for _, mode := range []string{config.ModeEnforce, config.ModeMonitor} {
		t.Run(mode, func(t *testing.T) {
			var events bytes.Buffer
			sent := 0
			e, err := policy.New(context.Background(), fstest.MapFS{"p.rego": {Data: []byte(mcpPolicy)}})
			if err != nil {
				t.Fatal(err)
			}
			cfg := testConfig(t)
			cfg.Policy.Mode = mode
			cfg.Protocols.MCP = []config.ProtocolEndpoint{{Hosts: []string{mcpHost}, Path: "/mcp"}}
			br, tun := testBroker(t, cfg, Deps{Policy: e, Secrets: benchSecrets{}, Audit: audit.New(&events)},
				mcpUpstream(func(r *http.Request) *http.Response { sent++; return sessionUpstream(r) }), mcpHost)
			w := httptest.NewRecorder()
			br.serveTunnel(w, mcpPost("/mcp", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"delete","Name":"sk-canary-echo","arguments":{}}}`, ""), tun)
			var got struct {
				JSONRPC string `json:"jsonrpc"`
				ID      any    `json:"id"`
				Error   struct {
					Code    int       `json:"code"`
					Message string    `json:"message"`
					Data    errorBody `json:"data"`
				} `json:"error"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
				t.Fatalf("%d %s: %v", w.Code, w.Body, err)
			}
			if w.Code != 400 || got.JSONRPC != "2.0" || got.ID != nil || got.Error.Code != -32600 ||
				got.Error.Data.Error != "ambiguous_request" || !strings.Contains(got.Error.Data.Reason, `"name" and "Name"`) ||
				!strings.Contains(got.Error.Message, "ambiguous_request") {
				t.Errorf("%d %s", w.Code, w.Body)
			}
			if strings.Contains(w.Body.String(), "canary") {
				t.Errorf("the refusal quotes a value: %s", w.Body)
			}
			if sent != 0 {
				t.Errorf("the upstream was sent %d requests", sent)
			}
			br.audit.Close()
			if ev := events.String(); !strings.Contains(ev, `"decision":"deny"`) || !strings.Contains(ev, `ambiguous JSON`) {
				t.Errorf("audit: %s", ev)
			}
		})
	}
	br, tun := mcpBroker(t, mcpUpstream(sessionUpstream), nil)
	w := httptest.NewRecorder()
	br.serveTunnel(w, mcpPost("/mcp", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"delete","arguments":{}}}`, ""), tun)
	if w.Code != 200 || !strings.HasPrefix(w.Body.String(), `{"jsonrpc":"2.0","id":2,"error":{"code":-32000,`) {
		t.Errorf("denied: %d %s", w.Code, w.Body)
	}
}

// TestPolicyBodyRefusals: a request whose body the policy reads is refused when the body is
// ambiguous (400 ambiguous_request) or sent as JSON and not JSON (400 bad_request); a body of
// whitespace is no body, and a policy that reads no body is not concerned.
func TestPolicyBodyRefusals(t *testing.T) {
	const readsBody = `package broker
default decision := {"allow": false, "reason": "purge is not allowed"}
decision := {"allow": true} if input.request.body.action != "purge"
decision := {"allow": true} if input.request.body == null`
	const readsPath = `package broker
decision := {"allow": true} if input.request.path == "/x"`
	for _, tc := range []struct {
		policy, body string
		code         int
		want         string
	}{
		{readsBody, `{"action":"archive"}`, 200, ""},
		{readsBody, `{"action":"purge"}`, 403, "purge is not allowed"},
		{readsBody, `{"action":"purge","Action":"archive"}`, 400, `"ambiguous_request"`},
		{readsBody, `{"action":"archive","action":"purge"}`, 400, `member \"action\" appears twice`},
		{readsBody, `{"items":[{"id":1,"i\u0064":2}]}`, 400, `"ambiguous_request"`},
		{readsBody, `{"action":"purge",}`, 400, `"bad_request"`},
		{readsBody, "{\"action\":\"pur\xffge\"}", 400, `"bad_request"`},
		{readsBody, "  \n", 200, ""},
		{readsPath, `{"action":"purge","Action":"archive"}`, 200, ""},
	} {
		e, err := policy.New(context.Background(), fstest.MapFS{"p.rego": {Data: []byte(tc.policy)}})
		if err != nil {
			t.Fatal(err)
		}
		sent := 0
		br, tun := testBroker(t, testConfig(t), Deps{Policy: e, Secrets: benchSecrets{}},
			mcpUpstream(func(r *http.Request) *http.Response { sent++; return sessionUpstream(r) }), mcpHost)
		w := httptest.NewRecorder()
		br.serveTunnel(w, mcpPost("/x", tc.body, ""), tun)
		if w.Code != tc.code || !strings.Contains(w.Body.String(), tc.want) || (tc.code != 200) != (sent == 0) {
			t.Errorf("%q: %d %s (sent %d); want %d %s", tc.body, w.Code, w.Body, sent, tc.code, tc.want)
		}
	}
}
