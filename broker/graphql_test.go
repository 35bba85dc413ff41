package broker

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/policy"
)

// TestGraphQLEndpoint: at a protocols.graphql endpoint the body is read for input.graphql
// whatever its content type, and one that cannot be read is refused, not taken for none.
func TestGraphQLEndpoint(t *testing.T) {
	cfg := testConfig(t)
	cfg.Protocols.GraphQL = []config.ProtocolEndpoint{{Hosts: []string{"api.example.com"}, Path: "/graphql"}}
	br, tun := testBroker(t, cfg, Deps{Policy: allowAll{}, Secrets: benchSecrets{}}, memoryUpstream{}, "api.example.com")
	e, err := policy.New(context.Background(), fstest.MapFS{"p.rego": {Data: []byte(`package broker

decision := {"allow": true} if {
	count(input.graphql) > 0
	every op in input.graphql { op.type == "query" }
} else := {"allow": false, "reason": sprintf("not queries: %v", [input.graphql])}
`)}})
	if err != nil {
		t.Fatal(err)
	}
	br.policy = e
	for _, c := range []struct {
		name, path, ct, body string
		short                bool // the body ends before its Content-Length
		status               int
		reason               string
	}{
		{"JSON", "/graphql", "application/json", `{"query":"{ viewer { login } }"}`, false, 200, ""},
		{"JSON sent as a form", "/graphql", "application/x-www-form-urlencoded", `{"query":"{ viewer { login } }"}`, false, 200, ""},
		{"mutation", "/graphql", "text/plain", `{"query":"mutation { deleteRepository }"}`, false, 403, `not queries: [{"fields": ["deleteRepository"], "name": "", "type": "mutation"}]`},
		{"cut short", "/graphql", "application/json", `{"query":"{ viewer { login } }"}`, true, 403, "the GraphQL request body could not be read"},
		{"does not parse", "/graphql", "application/json", `{"query":"{"}`, false, 403, "the GraphQL document does not parse: input:1:2: Expected Name, found <EOF>"},
		{"not the endpoint", "/graphql2", "application/json", `{"query":"{ viewer { login } }"}`, false, 403, policy.ReasonUndefined}, // no input.graphql
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, c.path, strings.NewReader(c.body))
			r.Host = "api.example.com"
			r.Header.Set("Content-Type", c.ct)
			if c.short {
				r.ContentLength = int64(len(c.body)) + 10
				r.Header.Set("Expect", "100-continue") // read for the policy, not up front
			}
			w := httptest.NewRecorder()
			br.serveTunnel(w, r, tun)
			if w.Code != c.status {
				t.Fatalf("status %d, want %d: %s", w.Code, c.status, w.Body)
			}
			if c.status == 403 {
				var b map[string]string
				_ = json.Unmarshal(w.Body.Bytes(), &b)
				if !strings.HasPrefix(b["reason"], c.reason) {
					t.Fatalf("reason %q, want %q", b["reason"], c.reason)
				}
			}
			_, _ = io.Copy(io.Discard, w.Body)
		})
	}
}
