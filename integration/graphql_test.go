package integration

import (
	"encoding/json"
	"net/url"
	"os"
	"strings"
	"testing"
)

// graphqlPolicy puts the shipped policies/graphql.rego in front of the test upstream, as the
// shipped policy does for api.github.com/graphql.
const graphqlPolicy = `package broker

import data.graphql

default decision := {"allow": false, "reason": "not GraphQL"}

decision := {"allow": true, "intercept": true} if input.phase == "connect"

decision := graphql.github_decision if {
	input.phase == "request"
	input.request.path == "/graphql"
}
`

// graphqlEnv is a broker in mode with the shipped GraphQL rules for the test upstream's
// /graphql.
func graphqlEnv(t *testing.T, mode string) *env {
	t.Helper()
	rules, err := os.ReadFile("../policies/graphql.rego")
	if err != nil {
		t.Fatal(err)
	}
	return newEnv(t, envOpts{
		mode:   mode,
		policy: graphqlPolicy,
		policyFiles: map[string]string{"graphql.rego": string(rules), "data.yaml": `settings:
  github:
    credential: canary
    graphql:
      mutations: {` + agentID + `: [addComment]}
`},
		extraConfig: "protocols:\n  graphql: [{hosts: [\"127.0.0.1\"], path: /graphql}]\n",
	})
}

// TestGraphQLBadInputMonitor: in monitor mode a document that does not parse goes through
// without credentials, recorded as would_deny with the reason.
func TestGraphQLBadInputMonitor(t *testing.T) {
	e := graphqlEnv(t, "monitor")
	out, err := e.curl("-i", "-H", "Content-Type: application/json", "-d", `{"query":"mutation {"}`, e.url("/graphql"))
	if err != nil || !hasStatus(out, 200) {
		t.Fatalf("%v\n%s", err, out)
	}
	ev := e.broker.waitAudit(t, headerValue(out, "X-Broker-Request-Id"))
	if ev["would_deny"] != true || !strings.HasPrefix(ev["reason"].(string), "the GraphQL document does not parse: ") {
		t.Fatalf("audit: %v", ev)
	}
	if got := e.received(); len(got) != 1 || got[0].Header.Get("Authorization") != "" {
		t.Fatalf("the upstream received %d requests, the last with credentials", len(got))
	}
}

// TestGraphQLThroughBroker: GraphQL requests as clients send them (curl with GitHub's JSON
// bodies, a batch, an Apollo persisted-query GET, a document that does not parse) reach the
// shipped rule set with their operations read, and the audit event names the first one.
func TestGraphQLThroughBroker(t *testing.T) {
	e := graphqlEnv(t, "enforce")
	const (
		query    = `{"query":"query Viewer { viewer { login } rateLimit { remaining } }"}`
		comment  = `{"query":"mutation AddComment($id: ID!, $body: String!) { addComment(input: {subjectId: $id, body: $body}) { clientMutationId } }","variables":{"id":"I_kwDOA","body":"LGTM"}}`
		deleteIt = `{"query":"mutation { deleteRepository(input: {repositoryId: \"R_1\"}) { clientMutationId } }"}`
		hidden   = `{"query":"query Harmless { viewer { login } } mutation Harmful { deleteRepository(input: {repositoryId: \"R_1\"}) { clientMutationId } }","operationName":"Harmful"}`
		batch    = `[{"query":"query A { viewer { login } }"},{"query":"mutation B { mergePullRequest(input: {pullRequestId: \"P_1\"}) { clientMutationId } }"}]`
		broken   = `{"query":"query { viewer { login }"}`
	)
	persisted := e.url("/graphql") + "?operationName=Viewer&extensions=" + url.QueryEscape(`{"persistedQuery":{"version":1,"sha256Hash":"ecf4edb46db40b5132295c0291d62fb65d6759a9eedfa4d5d612dd5ec54a6b38"}}`)
	for _, c := range []struct {
		name   string
		args   []string
		status int
		reason string
		gql    map[string]any // the audit event's graphql object
	}{
		// GitHub's documented curl call: the JSON is sent as a form.
		{"query", []string{"-d", query, e.url("/graphql")}, 200, "GitHub GraphQL API", map[string]any{"type": "query", "name": "Viewer"}},
		{"listed mutation", []string{"-H", "Content-Type: application/json", "-d", comment, e.url("/graphql")}, 200, "GitHub GraphQL API", map[string]any{"type": "mutation", "name": "AddComment"}},
		{"unlisted mutation", []string{"-H", "Content-Type: application/json", "-d", deleteIt, e.url("/graphql")}, 403,
			"GraphQL mutation deleteRepository is not allowed for agent " + agentID + " (policies/data.yaml settings.github.graphql.mutations)", map[string]any{"type": "mutation", "name": ""}},
		{"operationName selects the mutation", []string{"-H", "Content-Type: application/json", "-d", hidden, e.url("/graphql")}, 403,
			"GraphQL mutation deleteRepository is not allowed for agent " + agentID + " (policies/data.yaml settings.github.graphql.mutations)", map[string]any{"type": "mutation", "name": "Harmful"}},
		{"batch", []string{"-H", "Content-Type: application/json", "-d", batch, e.url("/graphql")}, 403,
			"GraphQL mutation mergePullRequest is not allowed for agent " + agentID + " (policies/data.yaml settings.github.graphql.mutations)", map[string]any{"type": "query", "name": "A"}},
		{"persisted GET", []string{persisted}, 403, "persisted GraphQL queries are not allowed: send the query document", map[string]any{"type": "persisted", "name": "Viewer"}},
		{"chunked body", []string{"-H", "Content-Type: application/json", "-H", "Transfer-Encoding: chunked", "-d", comment, e.url("/graphql")}, 200, "GitHub GraphQL API", map[string]any{"type": "mutation", "name": "AddComment"}},
		{"GET query", []string{"-G", "--data-urlencode", "query=query Repo { repository(owner: \"o\", name: \"n\") { id } }", e.url("/graphql")}, 200, "GitHub GraphQL API", map[string]any{"type": "query", "name": "Repo"}},
		{"GET mutation", []string{"-G", "--data-urlencode", "query=mutation { deleteRepository(input: {repositoryId: \"R_1\"}) { clientMutationId } }", e.url("/graphql")}, 403,
			"GraphQL mutation deleteRepository is not allowed for agent " + agentID + " (policies/data.yaml settings.github.graphql.mutations)", map[string]any{"type": "mutation", "name": ""}},
		{"application/graphql", []string{"-H", "Content-Type: application/graphql", "-d", "query Q { viewer { login } }", e.url("/graphql")}, 200, "GitHub GraphQL API", map[string]any{"type": "query", "name": "Q"}},
		{"does not parse", []string{"-H", "Content-Type: application/json", "-d", broken, e.url("/graphql")}, 403,
			"the GraphQL document does not parse: input:1:25: Expected Name, found <EOF>", nil},
		// Not the configured endpoint: the body is not read as GraphQL.
		{"another path", []string{"-H", "Content-Type: application/json", "-d", broken, e.url("/graphql/x")}, 403, "not GraphQL", nil},
		// Refused as ambiguous (400), not denied by the policy: strictjson_test.go.
		{"member twice", []string{"-H", "Content-Type: application/json", "-d", `{"query":"{ viewer { login } }","Query":"mutation { deleteRepository(input: {repositoryId: \"R_1\"}) { clientMutationId } }"}`, e.url("/graphql")}, 400,
			`ambiguous JSON: members "query" and "Query" in one object differ only in case, folding or '_'/'-', and a server may read them as one`, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := len(e.received())
			out, err := e.curl(append([]string{"-i"}, c.args...)...)
			if err != nil || !hasStatus(out, c.status) {
				t.Fatalf("want %d: %v\n%s", c.status, err, out)
			}
			head, body, _ := strings.Cut(out, "\r\n\r\n")
			id := headerValue(head, "X-Broker-Request-Id")
			if c.status != 200 {
				var b map[string]string
				if err := json.Unmarshal([]byte(body), &b); err != nil || b["reason"] != c.reason {
					t.Fatalf("%d reason %q, want %q (%v)", c.status, b["reason"], c.reason, err)
				}
				if n := len(e.received()); n != before {
					t.Fatal("the upstream received a denied request")
				}
			} else if got := e.received(); len(got) != before+1 || got[before].Header.Get("Authorization") != "Bearer "+e.canary {
				t.Fatalf("the upstream did not receive the request with the credential: %s", body)
			}
			ev := e.broker.waitAudit(t, id)
			if ev["reason"] != c.reason {
				t.Errorf("audit reason %v, want %q", ev["reason"], c.reason)
			}
			got, _ := ev["graphql"].(map[string]any)
			if c.gql == nil && got != nil || c.gql != nil && (got["type"] != c.gql["type"] || got["name"] != c.gql["name"]) {
				t.Errorf("audit graphql %v, want %v", got, c.gql)
			}
		})
	}
}
