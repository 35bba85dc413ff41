package policy

import (
	"context"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/policies"
)

// BenchmarkMCPDecision is the shipped policy's decision for a POST to an MCP server (mcp.rego,
// input.mcp derived from the body by broker/rpc) beside the same tool call's fields in a plain
// JSON body to an LLM API (the model read from the body): "typical" is a tools/call of about
// 200 bytes, "large" one whose argument is about 100 KB. Each iteration is a new request (its
// body derived again); the decision cache answers what it can, as in the broker.
func BenchmarkMCPDecision(b *testing.B) {
	e, err := New(context.Background(), policies.FS)
	if err != nil {
		b.Fatal(err)
	}
	large := strings.Repeat("lorem ipsum dolor sit amet ", 100<<10/27)
	mcpBody := func(q string) []byte {
		return []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"search_issues","arguments":{"repository":"example/docs","query":"` + q + `"},"_meta":{"progressToken":7}}}`)
	}
	plainBody := func(q string) []byte {
		return []byte(`{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"` + q + `"}],"max_tokens":8}`)
	}
	for _, c := range []struct {
		name string
		mcp  bool
		body []byte
	}{
		{"plain_json/typical", false, plainBody("is the build green?")},
		{"plain_json/large", false, plainBody(large)},
		{"mcp/typical", true, mcpBody("is the build green?")},
		{"mcp/large", true, mcpBody(large)},
	} {
		b.Run(c.name, func(b *testing.B) {
			reads := 0
			b.ReportAllocs()
			for b.Loop() {
				var in *Input
				if c.mcp {
					in = mcpRequest(string(c.body), &reads)
					in.Host, in.Credentials = "mcp.example.com", nil
				} else {
					in = req()
					in.Method, in.Host, in.Path, in.Credentials = "POST", "api.openai.com", "/v1/chat/completions", []string{"openai"}
					in.ReadBody = func() ([]byte, int64) { return c.body, int64(len(c.body)) }
				}
				d, err := e.Decide(context.Background(), in)
				if err != nil || !d.Allow {
					b.Fatalf("%+v, %v", d, err)
				}
			}
		})
	}
}
