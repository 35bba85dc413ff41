package policy

import (
	"encoding/json"

	"github.com/open-policy-agent/opa/v1/ast"
)

// graphqlPath is input.graphql, the operations of a GraphQL request (Input.ReadGraphQL).
var graphqlPath = ast.MustParseRef("input.graphql")

// loadGraphQL fills graphql from ReadGraphQL, if that has not been done, reading the body
// first. A request that does not read as GraphQL is a deny whose reason says why (CONTRACT
// §8: never "no operation"): the error is its reason.
func (in *Input) loadGraphQL() error {
	if in.ReadGraphQL == nil {
		return in.graphqlErr
	}
	in.loadBody()
	text := in.bodyText
	if text == nil && in.Body != nil {
		text, _ = json.Marshal(in.Body) // an Input made with its body parsed
	}
	ops, err := in.ReadGraphQL(text)
	in.ReadGraphQL = nil
	if err != nil {
		in.graphqlErr = err
		return err
	}
	if ops == nil {
		ops = []any{}
	}
	in.graphql = ops
	return nil
}
