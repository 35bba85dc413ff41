package policy

import (
	"context"
	"testing"

	"github.com/capbroker/capbroker/broker/rpc"
	"github.com/open-policy-agent/opa/v1/ast"
)

// mcpRequest is a POST to an MCP endpoint with body, its input.mcp and input.jsonrpc derived
// by broker/rpc; reads counts the derivations.
func mcpRequest(body string, reads *int) *Input {
	in := req()
	in.Method, in.Path = "POST", "/mcp"
	in.ReadBody = func() ([]byte, int64) { return []byte(body), int64(len(body)) }
	derive := func(meaning func([]rpc.Message) ([]any, error)) func([]byte) ([]any, error) {
		return func(text []byte) ([]any, error) {
			*reads++
			msgs, err := rpc.Parse(text)
			if err != nil {
				return nil, err
			}
			return meaning(msgs)
		}
	}
	in.ReadMCP, in.ReadJSONRPC = derive(rpc.MCP), derive(rpc.JSONRPC)
	return in
}

func toolCall(tool, repo string) string {
	return `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + tool + `","arguments":{"repository":"` + repo + `"}}}`
}

// TestMCPDecisions: the policy decides on input.mcp, and the decision cache, which keys on
// what the policy reads, never answers one tool call with another's decision.
func TestMCPDecisions(t *testing.T) {
	e := engine(t, `package broker
default decision := {"allow": false, "reason": "no"}
decision := {"allow": true} if {
	every m in input.mcp { m.method != "tools/call"; m.method != "x" } # any method but these two
} else := {"allow": true} if {
	every m in input.mcp { m.tool == "search"; m.arguments.repository == "acme/web" }
}`)
	reads := 0
	for i, tc := range []struct {
		body  string
		allow bool
	}{
		{toolCall("search", "acme/web"), true},
		{toolCall("delete", "acme/web"), false},
		{toolCall("search", "acme/web"), true},
		{toolCall("search", "acme/secret"), false},
		{`[` + toolCall("search", "acme/web") + `,` + toolCall("delete", "acme/web") + `]`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, true},
		{`{"jsonrpc":"2.0","id":1,"method":"x"}`, false},
		{toolCall("delete", "acme/web"), false},
	} {
		d, err := e.Decide(context.Background(), mcpRequest(tc.body, &reads))
		if err != nil || d.Allow != tc.allow {
			t.Errorf("%d: %s: allow %v, %v; want %v", i, tc.body, d.Allow, err, tc.allow)
		}
	}
	if reads != 8 {
		t.Errorf("input.mcp derived %d times for 8 requests; input.jsonrpc must not be", reads)
	}
}

// TestRPCBadBody: a body that is not JSON-RPC is denied, with the reason, when the policy
// reads its meaning, even by a policy that would allow a request without methods.
func TestRPCBadBody(t *testing.T) {
	for _, part := range []string{"mcp", "jsonrpc"} {
		e := engine(t, `package broker
decision := {"allow": true} if count(input.`+part+`) >= 0`)
		for _, body := range []string{`{"query":"{ viewer { login } }"}`, `[]`, `not json`, ``} {
			reads := 0
			in := mcpRequest(body, &reads)
			if body == "not json" || body == "" {
				in.ReadBody = func() ([]byte, int64) { return nil, int64(len(body)) }
			}
			d, err := e.Decide(context.Background(), in)
			if err != nil || d.Allow || d.Reason != rpc.ErrNotJSONRPC.Error() {
				t.Errorf("input.%s, body %q: %+v, %v", part, body, d, err)
			}
		}
	}
}

// TestRPCLazy: a policy that does not refer to input.mcp has it neither derived nor the body
// read for it.
func TestRPCLazy(t *testing.T) {
	e := engine(t, `package broker
decision := {"allow": true} if input.request.path == "/mcp"`)
	reads := 0
	in := mcpRequest("not json", &reads)
	bodyRead := false
	in.ReadBody = func() ([]byte, int64) { bodyRead = true; return nil, 0 }
	if d, err := e.Decide(context.Background(), in); err != nil || !d.Allow || reads != 0 || bodyRead {
		t.Errorf("%+v, %v; derived %d times, body read %v", d, err, reads, bodyRead)
	}
}

// TestRPCInput: input.mcp is in the document once derived, and find agrees with it.
func TestRPCInput(t *testing.T) {
	reads := 0
	in := mcpRequest(toolCall("search", "acme/web"), &reads)
	if err := in.loadRPC(true, true); err != nil {
		t.Fatal(err)
	}
	doc, err := in.astValue()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"input.mcp", "input.mcp[0].tool", "input.mcp[0].arguments.repository", "input.jsonrpc[0].method", "input.mcp[1]"} {
		checkFind(t, in, doc, ast.MustParseRef(p))
	}
	if l := in.value()["mcp"].([]any); l[0].(map[string]any)["tool"] != "search" {
		t.Errorf("value: %v", l)
	}
	if l := in.Document(false)["mcp"].([]any); len(l[0].(map[string]any)["arguments"].(map[string]any)) != 0 {
		t.Errorf("the audit's input without the body has the arguments: %v", l)
	}
	if l := in.Document(true)["mcp"].([]any); l[0].(map[string]any)["arguments"].(map[string]any)["repository"] != "acme/web" {
		t.Errorf("the audit's input with the body lacks the arguments: %v", l)
	}
	if l := in.value()["mcp"].([]any); l[0].(map[string]any)["arguments"].(map[string]any)["repository"] != "acme/web" {
		t.Errorf("Document(false) changed the input: %v", l)
	}
	if _, ok := req().value()["mcp"]; ok {
		t.Error("input.mcp present for a request that has none")
	}
}
