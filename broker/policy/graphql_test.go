package policy

import (
	"context"
	"errors"
	"testing"
	"testing/fstest"

	"github.com/open-policy-agent/opa/v1/ast"
)

const graphqlPolicy = `package broker

decision := {"allow": true, "reason": "queries"} if {
	count(input.graphql) > 0
	every op in input.graphql { op.type == "query" }
} else := {"allow": false, "reason": sprintf("not only queries: %v", [[op.type | some op in input.graphql]])}
`

// graphqlInput is a request to a GraphQL endpoint whose body reads as ops (or fails with err),
// counting the reads.
func graphqlInput(body string, ops []any, err error, reads *int) *Input {
	return &Input{Phase: PhaseRequest, Method: "POST", Scheme: "https", Host: "api.github.com", Port: 443, Path: "/graphql",
		ReadBody: func() ([]byte, int64) { return []byte(body), int64(len(body)) },
		ReadGraphQL: func(text []byte) ([]any, error) {
			*reads++
			if string(text) != body {
				return nil, errors.New("ReadGraphQL given another body")
			}
			return ops, err
		}}
}

func op(typ, name string, fields ...any) any {
	return map[string]any{"type": typ, "name": name, "fields": fields}
}

// TestGraphQLDecisions: input.graphql reaches the policy, read once, only when the policy
// refers to it; the cache keys on it (a query and a mutation never share a decision); a
// request that does not read as GraphQL is denied with its reason.
func TestGraphQLDecisions(t *testing.T) {
	ctx := context.Background()
	e, err := New(ctx, fstest.MapFS{"p.rego": {Data: []byte(graphqlPolicy)}})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"query":"{ viewer { login } }"}`
	for i, tc := range []struct {
		ops    []any
		err    error
		allow  bool
		reason string
	}{
		{[]any{op("query", "", "viewer")}, nil, true, "queries"},
		{[]any{op("mutation", "", "deleteRepository")}, nil, false, `not only queries: ["mutation"]`},
		{[]any{op("query", "", "viewer")}, nil, true, "queries"}, // from the cache
		{[]any{op("query", "A", "viewer"), op("mutation", "B", "addStar")}, nil, false, `not only queries: ["query", "mutation"]`},
		{nil, nil, false, "not only queries: []"},
		{nil, errors.New("the GraphQL document does not parse: input:1: Expected Name, found <EOF>"), false, "the GraphQL document does not parse: input:1: Expected Name, found <EOF>"},
	} {
		reads := 0
		d, err := e.Decide(ctx, graphqlInput(body, tc.ops, tc.err, &reads))
		if err != nil {
			t.Fatal(err)
		}
		if d.Allow != tc.allow || d.Reason != tc.reason || reads != 1 || d.ID == "" {
			t.Errorf("%d: allow %v reason %q reads %d, want %v %q 1", i, d.Allow, d.Reason, reads, tc.allow, tc.reason)
		}
	}

	// A policy that does not refer to input.graphql never has it read.
	plain, err := New(ctx, fstest.MapFS{"p.rego": {Data: []byte("package broker\n\ndecision := {\"allow\": input.request.body.query != \"\"}\n")}})
	if err != nil {
		t.Fatal(err)
	}
	reads := 0
	d, err := plain.Decide(ctx, graphqlInput(body, nil, errors.New("bad"), &reads))
	if err != nil || !d.Allow || reads != 0 {
		t.Fatalf("allow %v err %v, ReadGraphQL called %d times", d.Allow, err, reads)
	}
}

// TestGraphQLInput: input.graphql is in the document when read, and find agrees with it.
func TestGraphQLInput(t *testing.T) {
	reads := 0
	in := graphqlInput(`{}`, []any{op("query", "Q", "viewer", "rateLimit")}, nil, &reads)
	if err := in.loadGraphQL(); err != nil {
		t.Fatal("not loaded")
	}
	doc, err := in.astValue()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"input.graphql", "input.graphql[0].type", "input.graphql[0].fields[1]", "input.graphql[1]", "input.graphql.x"} {
		checkFind(t, in, doc, ast.MustParseRef(p))
	}
	if g := in.Document(false)["graphql"].([]any); len(g) != 1 {
		t.Errorf("document: %v", g)
	}
	without := &Input{Phase: PhaseRequest, Method: "GET", Scheme: "https", Host: "h", Port: 443, Path: "/"}
	if _, ok := without.value()["graphql"]; ok {
		t.Error("input.graphql present for a request that has none")
	}
}
