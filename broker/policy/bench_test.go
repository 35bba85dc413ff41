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

// bodySizes are the request body sizes BenchmarkDecideBodySize measures (docs/policy-input.md).
var bodySizes = []struct {
	name string
	size int
}{{"64KiB", 64 << 10}, {"256KiB", 256 << 10}, {"1MiB", 1 << 20}, {"4MiB", 4 << 20}, {"8MiB", 8 << 20}}

// chatOfSize is an LLM chat request body of exactly size bytes, its prompt with escapes.
func chatOfSize(size int) []byte {
	head := `{"model":"gpt-4.1-mini","max_tokens":64,"messages":[{"role":"user","content":"`
	tail := `"}]}`
	line := `lorem ipsum dolor sit amet, \"quoted\" \u00e9\n `
	b := make([]byte, 0, size)
	b = append(b, head...)
	for len(b)+len(line)+len(tail) <= size {
		b = append(b, line...)
	}
	for len(b)+len(tail) < size {
		b = append(b, 'x')
	}
	return append(b, tail...)
}

// BenchmarkDecideBodySize decides an allowed LLM request with the shipped policy for bodies
// of growing size: "cached" as a request like one decided before (the body is validated and
// scanned for its model), "evaluated" as a cache miss (the same, and the policy evaluated with
// a body of the members it reads), "whole" as for a policy that reads the body whole (parsed
// whole for the evaluator). Each must grow no faster than the body.
func BenchmarkDecideBodySize(b *testing.B) {
	e, err := New(context.Background(), policies.FS)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	members := e.cur.Load().cache.bodyMembers
	if members == nil {
		b.Fatal("the shipped policy reads a body whole")
	}
	for _, s := range bodySizes {
		body := chatOfSize(s.size)
		if len(body) != s.size {
			b.Fatalf("body of %d bytes, want %d", len(body), s.size)
		}
		in := *benchInputs["llm_allow"]
		in.ReadBody = func() ([]byte, int64) { return body, int64(len(body)) }
		check := func(b *testing.B, d Decision) {
			if !d.Allow {
				b.Fatalf("%s: denied: %s", s.name, d.Reason)
			}
		}
		b.Run("cached/"+s.name, func(b *testing.B) {
			b.SetBytes(int64(s.size))
			b.ReportAllocs()
			for b.Loop() {
				in := in
				d, err := e.Decide(ctx, &in)
				if err != nil {
					b.Fatal(err)
				}
				check(b, d)
			}
		})
		for _, mode := range []string{"evaluated", "whole"} {
			b.Run(mode+"/"+s.name, func(b *testing.B) {
				b.SetBytes(int64(s.size))
				b.ReportAllocs()
				for b.Loop() {
					in := in
					in.loadBody()
					if mode == "evaluated" {
						in.bodyMembers = members
						if _, ok := cacheOf(e).key(nil, &in); !ok {
							b.Fatal("no key")
						}
					}
					d, err := evaluateInput(ctx, e.cur.Load(), &in)
					if err != nil {
						b.Fatal(err)
					}
					check(b, d)
				}
			})
		}
	}
}
