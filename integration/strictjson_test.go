package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
)

// The attacks of these tests send JSON whose members a server may read otherwise than the
// broker: two members equal under case or Unicode folding (name/Name, argument\u017f, the
// Kelvin sign), a member alone in another case, a name escaped, an exact duplicate first or
// last, and each of these inside a batch. The broker must refuse each before the upstream,
// in the client's shape, and audit a deny with the reason.

// ambiguousAttack is one request body and the members its refusal names.
type ambiguousAttack struct {
	name, body string
	names      []string // what the reason must mention
}

// postJSON sends body to u through the broker as the agent, returning the response's status,
// body and request id.
func postJSON(t *testing.T, c *http.Client, u, body string, header ...string) (int, string, string) {
	t.Helper()
	status, b, h := postJSONHeader(t, c, u, body, header...)
	return status, b, h.Get("X-Broker-Request-Id")
}

// postJSONHeader is postJSON returning the response's header.
func postJSONHeader(t *testing.T, c *http.Client, u, body string, header ...string) (int, string, http.Header) {
	t.Helper()
	r, err := http.NewRequest(http.MethodPost, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// checkAmbiguousRefusal asserts the agent got 400 ambiguous_request naming the members, as a
// JSON-RPC error when rpc (the broker's JSON otherwise), that the upstream saw nothing more
// than before, and that the audit event is a deny with the reason.
func checkAmbiguousRefusal(t *testing.T, e *env, a ambiguousAttack, rpc bool, status int, body, id string, before int) {
	t.Helper()
	var reason, code string
	if rpc {
		var got struct {
			JSONRPC string `json:"jsonrpc"`
			ID      any    `json:"id"`
			Error   struct {
				Code    int               `json:"code"`
				Message string            `json:"message"`
				Data    map[string]string `json:"data"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(body), &got); err != nil || got.JSONRPC != "2.0" || got.ID != nil || got.Error.Code != -32600 ||
			!strings.Contains(got.Error.Message, "ambiguous_request") {
			t.Errorf("%s: not a JSON-RPC invalid request error (%v): %d %s", a.name, err, status, body)
		}
		reason, code = got.Error.Data["reason"], got.Error.Data["error"]
	} else {
		var got map[string]string
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Errorf("%s: not the broker's error JSON (%v): %s", a.name, err, body)
		}
		reason, code = got["reason"], got["error"]
	}
	if status != http.StatusBadRequest || code != "ambiguous_request" {
		t.Errorf("%s: %d %s, want 400 ambiguous_request", a.name, status, body)
	}
	for _, n := range a.names {
		if !strings.Contains(reason, n) {
			t.Errorf("%s: reason %q does not name %s", a.name, reason, n)
		}
	}
	if n := len(e.received()); n != before {
		t.Errorf("%s: the upstream received the refused request", a.name)
	}
	ev := e.broker.waitAudit(t, id)
	if ev["decision"] != "deny" || !strings.HasPrefix(ev["reason"].(string), "ambiguous JSON") {
		t.Errorf("%s: audit decision %v reason %v, want deny for ambiguous JSON", a.name, ev["decision"], ev["reason"])
	}
}

// TestStrictJSONMCPAgainstSDKServer: MCP calls whose members the MCP TypeScript SDK's server
// (server-everything) reads otherwise than a case-folding, last-wins reader are refused as
// JSON-RPC errors before the server; the same session's plain calls still work.
func TestStrictJSONMCPAgainstSDKServer(t *testing.T) {
	modules := nodeModules(t)
	addr := startMCPEverything(t, modules)
	front := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: addr})
	front.FlushInterval = -1
	e := newEnv(t, envOpts{
		policy:      mcpPolicy,
		policyFiles: map[string]string{"mcp.rego": readShipped(t, "mcp.rego"), "data.yaml": mcpData},
		handler:     http.StripPrefix("/api/custom", front),
		extraConfig: "protocols:\n  mcp: [{hosts: [127.0.0.1], path: /api/custom/mcp}]\n",
	})
	c := e.broker.client(t, agentID, e.token)
	u := e.url("/api/custom/mcp")
	hdr := []string{"Accept", "application/json, text/event-stream", "Mcp-Protocol-Version", "2025-06-18"}
	status, body, h := postJSONHeader(t, c, u, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`, hdr...)
	session := h.Get("Mcp-Session-Id")
	if status != 200 || session == "" {
		t.Fatalf("initialize: %d, session %q: %s", status, session, body)
	}
	hdr = append(hdr, "Mcp-Session-Id", session)
	if status, body, _ := postJSON(t, c, u, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, hdr...); status != 202 {
		t.Fatalf("initialized: %d %s", status, body)
	}
	call := func(params string) string {
		return `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":` + params + `}`
	}
	// The controls: the policy lets echo "hello" through and refuses get-sum.
	if status, body, _ := postJSON(t, c, u, call(`{"name":"echo","arguments":{"message":"hello"}}`), hdr...); status != 200 || !strings.Contains(body, "Echo: hello") {
		t.Fatalf("echo hello: %d %s", status, body)
	}
	if status, body, _ := postJSON(t, c, u, call(`{"name":"get-sum","arguments":{"a":1,"b":2}}`), hdr...); status != 200 ||
		!strings.HasPrefix(body, `{"jsonrpc":"2.0","id":7,"error":{"code":-32000,`) || !strings.Contains(body, "MCP tool get-sum is not allowed") {
		t.Fatalf("get-sum: %d %s", status, body)
	}
	for _, a := range []ambiguousAttack{
		// The SDK runs get-sum: JSON.parse keeps both members and the server reads "name".
		{"name/Name", call(`{"name":"get-sum","Name":"echo","arguments":{"a":1,"b":2}}`), []string{`"name"`, `"Name"`}},
		{"Name alone", call(`{"Name":"echo","arguments":{"message":"hello"}}`), []string{`"Name"`}},
		{"NAME, name last", call(`{"NAME":"echo","name":"get-sum","arguments":{"a":1,"b":2}}`), []string{`"NAME"`, `"name"`}},
		{"method/Method", `{"jsonrpc":"2.0","id":7,"method":"tools/call","Method":"tools/list","params":{"name":"get-sum","arguments":{"a":1,"b":2}}}`, []string{`"method"`, `"Method"`}},
		{"Method alone", `{"jsonrpc":"2.0","id":7,"Method":"tools/call","params":{"name":"get-sum"}}`, []string{`"Method"`}},
		{"arguments/ARGUMENTS", call(`{"name":"echo","arguments":{"message":"secret-plan"},"ARGUMENTS":{"message":"hello"}}`), []string{`"arguments"`, `"ARGUMENTS"`}},
		{"ARGUMENTS alone", call(`{"name":"echo","ARGUMENTS":{"message":"secret-plan"}}`), []string{`"ARGUMENTS"`}},
		{"argument long s", call("{\"name\":\"echo\",\"arguments\":{\"message\":\"secret-plan\"},\"argument\u017f\":{\"message\":\"hello\"}}"), []string{`"arguments"`, "argument\u017f"}},
		{"argument long s escaped", call(`{"name":"echo","arguments":{"message":"secret-plan"},"argument\u017f":{"message":"hello"}}`), []string{`"arguments"`}},
		{"Kelvin sign in arguments", call("{\"name\":\"echo\",\"arguments\":{\"message\":\"hello\",\"kind\":\"a\",\"\u212aind\":\"b\"}}"), []string{`"kind"`}},
		{"escaped name", call(`{"name":"get-sum","\u006eame":"echo","arguments":{"a":1,"b":2}}`), []string{`"name" appears twice`}},
		{"name twice, allowed last", call(`{"name":"get-sum","name":"echo","arguments":{"a":1,"b":2}}`), []string{`"name" appears twice`}},
		{"name twice, allowed first", call(`{"name":"echo","name":"get-sum","arguments":{"a":1,"b":2}}`), []string{`"name" appears twice`}},
		{"argument twice", call(`{"name":"echo","arguments":{"message":"secret-plan","message":"hello"}}`), []string{`"message" appears twice`}},
		{"in a batch", `[{"jsonrpc":"2.0","id":8,"method":"ping"},` + call(`{"name":"get-sum","Name":"echo","arguments":{"a":1,"b":2}}`) + `]`, []string{`"name"`, `"Name"`}},
	} {
		t.Run(a.name, func(t *testing.T) {
			before := len(e.received())
			status, body, id := postJSON(t, c, u, a.body, hdr...)
			checkAmbiguousRefusal(t, e, a, true, status, body, id, before)
			if strings.Contains(body, "secret-plan") || strings.Contains(body, "get-sum") {
				t.Errorf("the refusal quotes a value: %s", body)
			}
		})
	}
}

// TestStrictJSONRPC: a JSON-RPC endpoint's methods are read exactly; a body whose method a
// server may read otherwise is refused as a JSON-RPC error.
func TestStrictJSONRPC(t *testing.T) {
	e := newEnv(t, envOpts{
		policy: `package broker

default decision := {"allow": false, "reason": "method not allowed"}

decision := {"allow": true, "intercept": true} if input.phase == "connect"

decision := {"allow": true} if {
	input.phase == "request"
	every m in input.jsonrpc { startswith(m.method, "eth_get") }
}
`,
		extraConfig: "protocols:\n  jsonrpc: [{hosts: [127.0.0.1], path: /rpc}]\n",
	})
	c := e.broker.client(t, agentID, e.token)
	u := e.url("/rpc")
	if status, body, _ := postJSON(t, c, u, `{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":["0x0","latest"]}`); status != 200 {
		t.Fatalf("eth_getBalance: %d %s", status, body)
	}
	if status, body, _ := postJSON(t, c, u, `{"jsonrpc":"2.0","id":1,"method":"eth_sendRawTransaction","params":["0x00"]}`); status != 200 || !strings.HasPrefix(body, `{"jsonrpc":"2.0","id":1,"error":`) {
		t.Fatalf("eth_sendRawTransaction: %d %s", status, body)
	}
	send := `"eth_sendRawTransaction"`
	for _, a := range []ambiguousAttack{
		{"method/Method", `{"jsonrpc":"2.0","id":1,"method":` + send + `,"Method":"eth_getBalance","params":["0x00"]}`, []string{`"method"`, `"Method"`}},
		{"Method alone", `{"jsonrpc":"2.0","id":1,"Method":` + send + `,"params":["0x00"]}`, []string{`"Method"`}},
		{"METHOD, method last", `{"jsonrpc":"2.0","id":1,"METHOD":` + send + `,"method":"eth_getBalance"}`, []string{`"METHOD"`}},
		{"method twice, allowed last", `{"jsonrpc":"2.0","id":1,"method":` + send + `,"method":"eth_getBalance"}`, []string{`"method" appears twice`}},
		{"method twice, allowed first", `{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","method":` + send + `}`, []string{`"method" appears twice`}},
		{"escaped method", `{"jsonrpc":"2.0","id":1,"method":` + send + `,"\u006dethod":"eth_getBalance"}`, []string{`"method" appears twice`}},
		{"params/PARAMS", `{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":["0x0"],"PARAMS":["0x1"]}`, []string{`"PARAMS"`}},
		{"Kelvin sign in params", "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"eth_getBalance\",\"params\":{\"key\":1,\"\u212aey\":2}}", []string{`"key"`}},
		{"long s in params", "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"eth_getBalance\",\"params\":{\"addre\u017f\u017f\":\"a\",\"address\":\"b\"}}", []string{`"address"`}},
		{"in a batch", `[{"jsonrpc":"2.0","id":1,"method":"eth_getBalance"},{"jsonrpc":"2.0","id":2,"method":` + send + `,"Method":"eth_getCode"}]`, []string{`"Method"`}},
	} {
		t.Run(a.name, func(t *testing.T) {
			before := len(e.received())
			status, body, id := postJSON(t, c, u, a.body)
			checkAmbiguousRefusal(t, e, a, true, status, body, id, before)
		})
	}
}

// TestStrictJSONGraphQL: GraphQL's JSON envelope is read exactly; a query, operationName,
// variables or extensions a server may read otherwise, in a body, a batch or the URL's
// extensions, is refused with the broker's error JSON.
func TestStrictJSONGraphQL(t *testing.T) {
	e := graphqlEnv(t, "enforce")
	c := e.broker.client(t, agentID, e.token)
	u := e.url("/graphql")
	const del = `mutation { deleteRepository(input: {repositoryId: \"R_1\"}) { clientMutationId } }`
	if status, body, _ := postJSON(t, c, u, `{"query":"query Viewer { viewer { login } }"}`); status != 200 {
		t.Fatalf("query: %d %s", status, body)
	}
	for _, a := range []ambiguousAttack{
		{"query/Query", `{"query":"{ viewer { login } }","Query":"` + del + `"}`, []string{`"query"`, `"Query"`}},
		{"Query alone", `{"Query":"` + del + `"}`, []string{`"Query"`}},
		{"query twice, allowed last", `{"query":"` + del + `","query":"{ viewer { login } }"}`, []string{`"query" appears twice`}},
		{"query twice, allowed first", `{"query":"{ viewer { login } }","query":"` + del + `"}`, []string{`"query" appears twice`}},
		{"escaped query", `{"query":"{ viewer { login } }","\u0071uery":"` + del + `"}`, []string{`"query" appears twice`}},
		{"operationName/OperationName", `{"query":"query A { viewer { login } } mutation B { deleteRepository(input: {repositoryId: \"R_1\"}) { clientMutationId } }","operationName":"A","OperationName":"B"}`, []string{`"OperationName"`}},
		{"operation_name alone", `{"query":"query A { viewer { login } } mutation B { deleteRepository(input: {repositoryId: \"R_1\"}) { clientMutationId } }","operation_name":"B"}`, []string{`"operation_name"`}},
		{"variables twice", `{"query":"query Q($id: ID!) { node(id: $id) { id } }","variables":{"id":"a"},"variables":{"id":"b"}}`, []string{`"variables" appears twice`}},
		{"Kelvin sign in variables", "{\"query\":\"{ viewer { login } }\",\"variables\":{\"kind\":1,\"\u212aind\":2}}", []string{`"kind"`}},
		{"long s", "{\"query\":\"{ viewer { login } }\",\"extension\u017f\":{},\"extensions\":{}}", []string{`"extensions"`}},
		{"in a batch", `[{"query":"{ viewer { login } }"},{"query":"{ viewer { login } }","QUERY":"` + del + `"}]`, []string{`"QUERY"`}},
	} {
		t.Run(a.name, func(t *testing.T) {
			before := len(e.received())
			status, body, id := postJSON(t, c, u, a.body)
			checkAmbiguousRefusal(t, e, a, false, status, body, id, before)
		})
	}
	t.Run("extensions in the URL", func(t *testing.T) {
		before := len(e.received())
		q := u + "?operationName=Viewer&extensions=" + url.QueryEscape(`{"persistedQuery":{"version":1,"sha256Hash":"aa","sha256hash":"bb"}}`)
		resp, err := c.Get(q)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		checkAmbiguousRefusal(t, e, ambiguousAttack{"extensions in the URL", "", []string{`"sha256hash"`}}, false,
			resp.StatusCode, string(b), resp.Header.Get("X-Broker-Request-Id"), before)
	})
}

// TestStrictJSONPolicyBody: a request whose body a policy reads (input.request.body) is refused
// when its members are ambiguous, in enforce and monitor mode alike, and when it is sent as
// JSON and is not JSON; a policy that reads no body lets the same bodies through.
func TestStrictJSONPolicyBody(t *testing.T) {
	const readsBody = `package broker

default decision := {"allow": false, "reason": "purge is not allowed"}

decision := {"allow": true, "intercept": true} if input.phase == "connect"

decision := {"allow": true} if {
	input.phase == "request"
	input.request.body.action != "purge"
}
`
	for _, mode := range []string{"enforce", "monitor"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t, envOpts{mode: mode, policy: readsBody})
			c := e.broker.client(t, agentID, e.token)
			u := e.url("/jobs")
			if status, body, _ := postJSON(t, c, u, `{"action":"archive"}`); status != 200 {
				t.Fatalf("archive: %d %s", status, body)
			}
			for _, a := range []ambiguousAttack{
				{"action twice, allowed first", `{"action":"archive","action":"purge"}`, []string{`"action" appears twice`}},
				{"action twice, allowed last", `{"action":"purge","action":"archive"}`, []string{`"action" appears twice`}},
				{"action/Action", `{"action":"purge","Action":"archive"}`, []string{`"action"`, `"Action"`}},
				{"escaped", `{"action":"purge","\u0061ction":"archive"}`, []string{`"action" appears twice`}},
				{"Kelvin sign, deep", "{\"action\":\"archive\",\"opts\":{\"kind\":\"soft\",\"\u212aind\":\"hard\"}}", []string{`"kind"`}},
				{"long s", "{\"action\":\"archive\",\"targets\":[{\"scope\":\"one\",\"\u017fcope\":\"all\"}]}", []string{`"scope"`}},
			} {
				t.Run(a.name, func(t *testing.T) {
					before := len(e.received())
					status, body, id := postJSON(t, c, u, a.body)
					checkAmbiguousRefusal(t, e, a, false, status, body, id, before)
				})
			}
			before := len(e.received())
			status, body, _ := postJSON(t, c, u, `{"action":"purge",}`)
			if status != 400 || !strings.Contains(body, `"bad_request"`) || !strings.Contains(body, "not valid JSON") || len(e.received()) != before {
				t.Errorf("invalid JSON: %d %s", status, body)
			}
		})
	}
	e := newEnv(t, envOpts{policy: `package broker

decision := {"allow": true, "intercept": true}
`})
	c := e.broker.client(t, agentID, e.token)
	if status, body, _ := postJSON(t, c, e.url("/jobs"), `{"action":"purge","Action":"archive"}`); status != 200 {
		t.Errorf("a policy that reads no body: %d %s", status, body)
	}
}
