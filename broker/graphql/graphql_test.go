package graphql

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/broker/wire/strictjson"
)

func TestDescribe(t *testing.T) {
	q := func(kv ...string) map[string][]string {
		m := map[string][]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = append(m[kv[i]], kv[i+1])
		}
		return m
	}
	for _, tc := range []struct {
		name string
		r    Request
		want []Operation
	}{
		{"GitHub query", Request{ContentType: "application/json", Body: []byte(`{"query":"query Viewer { viewer { login } rateLimit { remaining } }","variables":{}}`)},
			[]Operation{{Type: "query", Name: "Viewer", Fields: []string{"viewer", "rateLimit"}}}},
		{"shorthand query, aliases", Request{Body: []byte(`{"query":"{ me: viewer { login } viewer { id } }"}`)},
			[]Operation{{Type: "query", Fields: []string{"viewer"}}}},
		{"mutation with variables", Request{ContentType: "application/json", Body: []byte(`{"query":"mutation AddComment($id: ID!, $body: String!) { addComment(input: {subjectId: $id, body: $body}) { clientMutationId } }","variables":{"id":"I_1","body":"hi"},"operationName":"AddComment"}`)},
			[]Operation{{Type: "mutation", Name: "AddComment", Fields: []string{"addComment"}}}},
		{"subscription", Request{Body: []byte(`{"query":"subscription S { issueChanged { id } }"}`)},
			[]Operation{{Type: "subscription", Name: "S", Fields: []string{"issueChanged"}}}},
		{"operationName selects", Request{Body: []byte(`{"query":"query A { viewer { login } } mutation B { deleteRepository(input: {}) { clientMutationId } }","operationName":"B"}`)},
			[]Operation{{Type: "mutation", Name: "B", Fields: []string{"deleteRepository"}}}},
		{"fragments at the top level", Request{Body: []byte(`{"query":"query Q { ...Top ... on Query { rateLimit { cost } } } fragment Top on Query { viewer { login } ...More } fragment More on Query { node(id: \"x\") { id } }"}`)},
			[]Operation{{Type: "query", Name: "Q", Fields: []string{"viewer", "node", "rateLimit"}}}},
		{"introspection", Request{Body: []byte(`{"query":"query IntrospectionQuery { __schema { types { name } } __type(name: \"Repository\") { name } __typename }"}`)},
			[]Operation{{Type: "query", Name: "IntrospectionQuery", Fields: []string{"__schema", "__type", "__typename"}}}},
		{"batch", Request{Body: []byte(`[{"query":"query A { viewer { login } }"},{"query":"mutation B { addStar(input: {starrableId: \"x\"}) { clientMutationId } }"}]`)},
			[]Operation{{Type: "query", Name: "A", Fields: []string{"viewer"}}, {Type: "mutation", Name: "B", Fields: []string{"addStar"}}}},
		{"application/graphql", Request{ContentType: "application/graphql; charset=utf-8", Query: q("operationName", "M"), Body: []byte("query Q { a } mutation M { b c }")},
			[]Operation{{Type: "mutation", Name: "M", Fields: []string{"b", "c"}}}},
		{"GET", Request{Query: q("query", "query Repo { repository(owner: \"o\", name: \"n\") { id } }")},
			[]Operation{{Type: "query", Name: "Repo", Fields: []string{"repository"}}}},
		{"Apollo persisted GET", Request{Query: q("operationName", "Viewer", "extensions", `{"persistedQuery":{"version":1,"sha256Hash":"ecf4edb46db40b5132295c0291d62fb65d6759a9eedfa4d5d612dd5ec54a6b38"}}`)},
			[]Operation{{Type: "persisted", Name: "Viewer", Fields: []string{}, Hash: "ecf4edb46db40b5132295c0291d62fb65d6759a9eedfa4d5d612dd5ec54a6b38"}}},
		{"Apollo persisted POST", Request{Body: []byte(`{"operationName":"X","extensions":{"persistedQuery":{"version":1,"sha256Hash":"abc"}}}`)},
			[]Operation{{Type: "persisted", Name: "X", Fields: []string{}, Hash: "abc"}}},
		{"APQ registration: the query counts", Request{Body: []byte(`{"query":"mutation X { a }","extensions":{"persistedQuery":{"version":1,"sha256Hash":"abc"}}}`)},
			[]Operation{{Type: "mutation", Name: "X", Fields: []string{"a"}}}},
		{"documentId", Request{Body: []byte(`{"documentId":"sha256:123","variables":{}}`)},
			[]Operation{{Type: "persisted", Fields: []string{}, Hash: "sha256:123"}}},
		{"Relay id", Request{Body: []byte(`{"id":"q42","operationName":null}`)},
			[]Operation{{Type: "persisted", Fields: []string{}, Hash: "q42"}}},
		{"no GraphQL parameters", Request{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Describe(tc.r)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestDescribeBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    Request
		want string
	}{
		{"syntax", Request{Body: []byte(`{"query":"query { viewer { login }"}`)}, "the GraphQL document does not parse: "},
		{"not GraphQL at all", Request{Body: []byte(`{"query":"SELECT * FROM users"}`)}, "the GraphQL document does not parse: "},
		{"application/graphql syntax", Request{ContentType: "application/graphql", Body: []byte("mutation {")}, "the GraphQL document does not parse: "},
		{"not JSON", Request{ContentType: "application/json", Body: []byte(`{"query": "{ a }"`)}, "the GraphQL request body is not JSON"},
		{"form", Request{ContentType: "application/x-www-form-urlencoded", Body: []byte(`query=%7Ba%7D`)}, "the GraphQL request body is not JSON"},
		{"two JSON values", Request{Body: []byte(`{"query":"{ a }"} {"query":"mutation { b }"}`)}, "the GraphQL request body is not JSON"},
		{"several operations, no operationName", Request{Body: []byte(`{"query":"query A { a } mutation B { b }"}`)}, "has 2 operations and the request no operationName"},
		{"unknown operationName", Request{Body: []byte(`{"query":"query A { a }","operationName":"B"}`)}, `no operation named "B"`},
		{"duplicate operation names", Request{Body: []byte(`{"query":"query A { a } mutation A { b }","operationName":"A"}`)}, `two operations named "A"`},
		{"anonymous beside named", Request{Body: []byte(`{"query":"{ a } mutation B { b }","operationName":"B"}`)}, "anonymous operation beside others"},
		{"fragments only", Request{Body: []byte(`{"query":"fragment F on Query { a }"}`)}, "no operation"},
		{"undefined fragment", Request{Body: []byte(`{"query":"{ ...F }"}`)}, `spreads fragment "F"`},
		{"fragment cycle", Request{Body: []byte(`{"query":"{ ...F } fragment F on Query { ...G } fragment G on Query { ...F }"}`)}, "spreads itself"},
		{"no query", Request{Body: []byte(`{"variables":{}}`)}, "has no query"},
		{"query not a string", Request{Body: []byte(`{"query":["{ a }"]}`)}, "query is not a string"},
		{"empty batch", Request{Body: []byte(`[]`)}, "empty batch"},
		{"bad batch item", Request{Body: []byte(`[{"query":"{ a }"},{"query":"mutation {"}]`)}, "batch's item 1: the GraphQL document does not parse"},
		{"scalar body", Request{Body: []byte(`"{ a }"`)}, "neither an object nor a batch"},
		{"URL and body", Request{Query: map[string][]string{"query": {"{ a }"}}, Body: []byte(`{"query":"mutation { b }"}`)}, "both the URL and the body"},
		{"repeated URL parameter", Request{Query: map[string][]string{"query": {"{ a }", "mutation { b }"}}}, "query 2 times"},
		{"bad extensions", Request{Query: map[string][]string{"extensions": {"{"}}}, "extensions parameter is not JSON"},
		{"member twice", Request{Body: []byte(`{"query":"{ a }","query":"mutation { b }"}`)}, `is ambiguous: ambiguous JSON: member "query" appears twice`},
		{"member twice in another case", Request{Body: []byte(`{"query":"{ a }","QUERY":"mutation { b }"}`)}, `members "query" and "QUERY"`},
		{"member in another case", Request{Body: []byte(`{"Query":"mutation { b }"}`)}, `member "Query" differs from "query"`},
		{"member escaped twice", Request{Body: []byte(`{"query":"{ a }","\u0071uery":"mutation { b }"}`)}, `member "query" appears twice`},
		{"batch item member twice", Request{Body: []byte(`[{"query":"{ a }"},{"operationName":"A","OperationName":"B","query":"query A { a } mutation B { b }"}]`)}, `members "operationName" and "OperationName"`},
		{"nested batch", Request{Body: []byte(`[[{"query":"{ a }"}]]`)}, "not an object"},
		{"trailing garbage", Request{Body: []byte(`{"query":"{ a }"}]`)}, "the GraphQL request body is not JSON"},
		{"application/graphql, operationName twice", Request{ContentType: "application/graphql", Query: map[string][]string{"operationName": {"A", "B"}}, Body: []byte("query A { a } mutation B { b }")}, "operationName 2 times"},
		{"empty application/graphql", Request{ContentType: "application/graphql"}, "no document"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ops, err := Describe(tc.r)
			if err == nil {
				t.Fatalf("no error; operations %+v", ops)
			}
			if !IsError(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestReasonBounded(t *testing.T) {
	_, err := Describe(Request{Body: []byte(`{"query":"query { a(x: \"` + strings.Repeat("z", 5000) + `) }"}`)})
	if err == nil || len(err.Error()) > maxReason+3 {
		t.Fatalf("error %d bytes: %v", len(err.Error()), err)
	}
}

// TestDescribeAmbiguous: a request whose JSON a server may read otherwise than the broker (a
// member twice, in another case or folding, escaped, alone in another spelling, in a batch,
// in the extensions parameter) is an Error wrapping strictjson.ErrAmbiguous, which the broker
// refuses as ambiguous; the reason names members, never values.
func TestDescribeAmbiguous(t *testing.T) {
	for name, r := range map[string]Request{
		"query/Query":                 {Body: []byte(`{"query":"{ a }","Query":"mutation { b }"}`)},
		"Query alone":                 {Body: []byte(`{"Query":"mutation { b }"}`)},
		"operationName/OperationName": {Body: []byte(`{"query":"query A { a } mutation B { b }","operationName":"A","OperationName":"B"}`)},
		"operation_name alone":        {Body: []byte(`{"query":"query A { a } mutation B { b }","operation_name":"B"}`)},
		"variables twice":             {Body: []byte(`{"query":"{ a }","variables":{"id":1},"variables":{"id":2}}`)},
		"in variables":                {Body: []byte(`{"query":"{ a }","variables":{"id":"x","ID":"y"}}`)},
		"kelvin":                      {Body: []byte("{\"query\":\"{ a }\",\"variables\":{\"kind\":1,\"\u212aind\":2}}")},
		"long s":                      {Body: []byte("{\"query\":\"{ a }\",\"extension\u017f\":{}}")},
		"escaped twice":               {Body: []byte(`{"query":"{ a }","\u0071uery":"mutation { b }"}`)},
		"in a batch":                  {Body: []byte(`[{"query":"{ a }"},{"query":"{ a }","QUERY":"mutation { b }"}]`)},
		"persisted hash":              {Body: []byte(`{"extensions":{"persistedQuery":{"sha256Hash":"a","SHA256Hash":"b"}}}`)},
		"persistedquery":              {Body: []byte(`{"extensions":{"persistedquery":{"sha256Hash":"a"}}}`)},
		"extensions in the URL":       {Query: map[string][]string{"extensions": {`{"persistedQuery":{"sha256Hash":"a","sha256hash":"b"}}`}}},
	} {
		t.Run(name, func(t *testing.T) {
			ops, err := Describe(r)
			if !IsError(err) || !errors.Is(err, strictjson.ErrAmbiguous) {
				t.Fatalf("%+v, %v: want an ambiguous Error", ops, err)
			}
			if strings.Contains(err.Error(), "mutation") {
				t.Errorf("the reason quotes a value: %v", err)
			}
		})
	}
}
