package graphql

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkDescribe reads a large document (about 42 KB): the parser's share of a decision.
func BenchmarkDescribe(b *testing.B) {
	var s strings.Builder
	s.WriteString(`{"query":"query Many { `)
	for i := range 600 {
		fmt.Fprintf(&s, `r%d: repository(owner: \"capbroker\", name: \"repo%d\") { ...Repo } `, i, i)
	}
	s.WriteString(`} fragment Repo on Repository { id name stargazerCount issues(first: 5) { nodes { title } } }"}`)
	body := []byte(s.String())
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Describe(Request{Body: body}); err != nil {
			b.Fatal(err)
		}
	}
}
