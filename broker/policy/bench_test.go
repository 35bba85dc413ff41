package policy

import (
	"context"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/capbroker/capbroker/policies"
)

// benchInputs are requests the shipped policy decides, one per kind of answer.
var benchInputs = map[string]*Input{
	"llm_allow": {
		Phase: PhaseRequest, AgentID: "coder-1", Labels: map[string]string{"team": "platform"}, SourceIP: "127.0.0.1",
		Method: "POST", Scheme: "https", Host: "api.openai.com", Port: 443, Path: "/v1/chat/completions",
		Query: map[string][]string{}, Credentials: []string{"openai"},
		Headers:  map[string]string{"content-type": "application/json", "user-agent": "agent/1.0", "accept": "*/*"},
		ReadBody: func() ([]byte, int64) { return llmBody, int64(len(llmBody)) },
	},
	"github_read": {
		Phase: PhaseRequest, AgentID: "coder-1", SourceIP: "127.0.0.1",
		Method: "GET", Scheme: "https", Host: "api.github.com", Port: 443, Path: "/repos/capbroker/capbroker/issues",
		Query: map[string][]string{"state": {"open"}}, Credentials: []string{"github"},
		Headers: map[string]string{"accept": "application/vnd.github+json", "user-agent": "agent/1.0"},
	},
	"deny_unknown_host": {
		Phase: PhaseRequest, AgentID: "coder-1", SourceIP: "127.0.0.1",
		Method: "GET", Scheme: "https", Host: "evil.example", Port: 443, Path: "/",
		Headers: map[string]string{"user-agent": "agent/1.0"},
	},
	"connect": {
		Phase: PhaseConnect, AgentID: "coder-1", SourceIP: "127.0.0.1", Method: "CONNECT", Host: "api.openai.com", Port: 443,
	},
}

// llm_long_prompt is llm_allow with a conversation of about 100 KB: the body is scanned for its
// model, never decoded.
func init() {
	long := *benchInputs["llm_allow"]
	long.ReadBody = func() ([]byte, int64) { return longBody, int64(len(longBody)) }
	benchInputs["llm_long_prompt"] = &long
}

var longBody = []byte(`{"model":"gpt-4.1-mini","max_tokens":64,"messages":[{"role":"user","content":"` +
	strings.Repeat(`lorem ipsum dolor sit amet, \"quoted\" `, 2500) + `"}]}`)

var llmBody = []byte(`{"model":"gpt-4.1-mini","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`)

// BenchmarkDecide decides with the shipped policy (policies/) as the broker does per request:
// "cached" is a request like one decided before (the decision cache answers), "evaluated" one
// the policy evaluates.
func BenchmarkDecide(b *testing.B) {
	e, err := New(context.Background(), policies.FS)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for name, in := range benchInputs {
		b.Run("cached/"+name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				in := *in // each request's body is read, as text, for its own decision
				if _, err := e.Decide(ctx, &in); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("evaluated/"+name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				in := *in
				in.loadBody()
				if _, err := evaluateInput(ctx, e.cur.Load(), &in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestInputValueMatchesDocument checks that the value given to the evaluator is the document
// the audit log records and `broker policy eval` reads.
func TestInputValueMatchesDocument(t *testing.T) {
	for name, in := range benchInputs {
		t.Run(name, func(t *testing.T) {
			evaluated, logged := *in, *in
			evaluated.loadBody() // as Decide does
			got, err := evaluated.astValue()
			if err != nil {
				t.Fatal(err)
			}
			want, err := ast.InterfaceToValue(logged.Document(true))
			if err != nil {
				t.Fatal(err)
			}
			if got.Compare(want) != 0 {
				t.Errorf("astValue:\n%v\ndocument:\n%v", got, want)
			}
		})
	}
}
