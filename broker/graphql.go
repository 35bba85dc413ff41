package broker

import (
	"errors"
	"net/http"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/graphql"
	"github.com/capbroker/capbroker/broker/policy"
)

// describeGraphQL sets in.ReadGraphQL for a request to a GraphQL endpoint (protocols.graphql),
// and reports whether it is one: its body is then read for the policy whatever its content
// type. The operations are read only if the policy refers to input.graphql; the first is
// named in the audit event.
func (x *exchange) describeGraphQL(r *http.Request, in *policy.Input) bool {
	if !x.g.isGraphQL(in.Host, in.Path) {
		return false
	}
	ct, query := r.Header.Get("Content-Type"), in.Query
	hasBody := r.Body != nil && r.Body != http.NoBody
	in.ReadGraphQL = func(body []byte) ([]any, error) {
		if hasBody && body == nil {
			// Not read (cut short, or over policy.max_body_bytes, which refuses it anyway):
			// what it executes is unknown, which is not "nothing".
			return nil, errors.New("the GraphQL request body could not be read")
		}
		ops, err := graphql.Describe(graphql.Request{ContentType: ct, Query: query, Body: body})
		if err != nil {
			return nil, err
		}
		if len(ops) > 0 {
			x.ev.GraphQL = &audit.GraphQLCall{Type: ops[0].Type, Name: ops[0].Name}
		}
		return graphql.Values(ops), nil
	}
	return true
}

// isGraphQL reports whether a request to host and path (normalised) is to a GraphQL endpoint.
func (g *generation) isGraphQL(host, path string) bool {
	for _, e := range g.graphql {
		if e.Matches(host, path) {
			return true
		}
	}
	return false
}
