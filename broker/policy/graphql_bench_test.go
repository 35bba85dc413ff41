package policy

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/broker/graphql"
	"github.com/capbroker/capbroker/policies"
)

// GraphQL bodies for BenchmarkDecideGraphQL: a GitHub query as clients send it (about 300
// bytes), and a large one (about 42 KB: 600 aliased repository lookups through a fragment).
var (
	graphqlTypical = []byte(`{"query":"query Issues($owner: String!, $name: String!) { repository(owner: $owner, name: $name) { issues(first: 20, states: OPEN) { nodes { number title author { login } labels(first: 5) { nodes { name } } } } } rateLimit { remaining } }","variables":{"owner":"capbroker","name":"capbroker"}}`)
	graphqlLarge   = func() []byte {
		var b strings.Builder
		b.WriteString(`{"query":"query Many { `)
		for i := range 600 {
			fmt.Fprintf(&b, `r%d: repository(owner: \"capbroker\", name: \"repo%d\") { ...Repo } `, i, i)
		}
		b.WriteString(`} fragment Repo on Repository { id name stargazerCount issues(first: 5) { nodes { title } } }"}`)
		return []byte(b.String())
	}()
	restJSON = []byte(`{"title":"Flaky test in broker/policy","body":"TestDecide fails one run in fifty on CI: the decision cache is shared between subtests.","labels":["bug","ci"],"assignees":["coder-1"]}`)
)

// BenchmarkDecideGraphQL decides, with the shipped policy, a POST to GitHub's REST API with a
// plain JSON body ("rest_json", the baseline) and POSTs to its GraphQL API whose operations
// are read for the policy ("graphql_typical", "graphql_large"): the difference is what reading
// input.graphql adds to a decision. The request is the same each time, so the decision cache
// answers; the body is read and the document parsed for every one, as in the broker.
func BenchmarkDecideGraphQL(b *testing.B) {
	e, err := New(context.Background(), policies.FS)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []struct {
		name, path string
		body       []byte
		graphql    bool
	}{
		{"rest_json", "/repos/capbroker/sandbox/issues", restJSON, false},
		{"graphql_typical", "/graphql", graphqlTypical, true},
		{"graphql_large", "/graphql", graphqlLarge, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			for b.Loop() {
				in := &Input{
					Phase: PhaseRequest, AgentID: "coder-1", SourceIP: "127.0.0.1",
					Method: "POST", Scheme: "https", Host: "api.github.com", Port: 443, Path: c.path,
					Query: map[string][]string{}, Credentials: []string{"github"},
					Headers:  map[string]string{"content-type": "application/json", "user-agent": "agent/1.0"},
					ReadBody: func() ([]byte, int64) { return c.body, int64(len(c.body)) },
				}
				if c.graphql {
					in.ReadGraphQL = func(body []byte) ([]any, error) {
						ops, err := graphql.Describe(graphql.Request{ContentType: "application/json", Body: body})
						return graphql.Values(ops), err
					}
				}
				d, err := e.Decide(ctx, in)
				if err != nil || !d.Allow && c.graphql {
					b.Fatalf("%v %+v", err, d)
				}
			}
		})
	}
}
