package policy

import (
	"context"
	"strings"
	"testing"
)

// TestLoadProtocolsRecordsWithoutChangingDecisions: with inputs recorded, input.mcp,
// input.jsonrpc and input.graphql are in the recorded document under a policy that reads
// none of them, and the decisions stay what they are without recording: a body that is not
// JSON-RPC is still allowed by a policy that does not read input.mcp, and still denied, with
// the parser's reason, by one that does.
func TestLoadProtocolsRecordsWithoutChangingDecisions(t *testing.T) {
	blind := engine(t, `package broker
decision := {"allow": true}`)
	reading := engine(t, `package broker
default decision := {"allow": false, "reason": "no"}
decision := {"allow": true} if every m in input.mcp { m.tool == "echo" }`)
	reads := 0
	in := mcpRequest(toolCall("delete_repository", "acme/web"), &reads)
	in.ReadGraphQL = func([]byte) ([]any, error) {
		return []any{map[string]any{"type": "mutation", "name": "AddNote", "fields": []any{"deleteEverything"}}}, nil
	}
	in.LoadProtocols()
	d, err := blind.Decide(context.Background(), in)
	if err != nil || !d.Allow {
		t.Fatalf("blind policy: %+v %v", d, err)
	}
	doc := in.Document(false)
	mcp, _ := doc["mcp"].([]any)
	if len(mcp) != 1 || mcp[0].(map[string]any)["tool"] != "delete_repository" {
		t.Fatalf("recorded input.mcp %v", doc["mcp"])
	}
	if args := mcp[0].(map[string]any)["arguments"]; len(args.(map[string]any)) != 0 {
		t.Errorf("arguments recorded without the body: %v", args)
	}
	if l, _ := doc["jsonrpc"].([]any); len(l) != 1 {
		t.Errorf("recorded input.jsonrpc %v", doc["jsonrpc"])
	}
	if l, _ := doc["graphql"].([]any); len(l) != 1 {
		t.Errorf("recorded input.graphql %v", doc["graphql"])
	}

	for _, e := range []*Engine{blind, reading} {
		bad := mcpRequest(`{"not":"json-rpc"}`, &reads)
		bad.LoadProtocols()
		d, err := e.Decide(context.Background(), bad)
		if err != nil {
			t.Fatal(err)
		}
		if e == blind && !d.Allow || e == reading && (d.Allow || !strings.Contains(d.Reason, "not a JSON-RPC message")) {
			t.Errorf("a body that is not JSON-RPC, recorded first: %+v", d)
		}
		if _, ok := bad.Document(false)["mcp"]; ok {
			t.Error("an unreadable body recorded an input.mcp")
		}
	}
	// A GraphQL body that does not read is denied by a policy reading input.graphql as it
	// would be without recording.
	gql := engine(t, `package broker
decision := {"allow": true} if input.graphql`)
	in = req()
	in.ReadGraphQL = func([]byte) ([]any, error) { return nil, errBadGraphQL }
	in.LoadProtocols()
	if d, err := gql.Decide(context.Background(), in); err != nil || d.Allow || d.Reason != errBadGraphQL.Error() {
		t.Errorf("unreadable GraphQL, recorded first: %+v %v", d, err)
	}
}

var errBadGraphQL = errorString("the GraphQL document does not parse")

type errorString string

func (e errorString) Error() string { return string(e) }
