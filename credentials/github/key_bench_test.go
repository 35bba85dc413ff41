package github

import (
	"testing"

	"github.com/capbroker/capbroker/credentials"
)

func BenchmarkAppendKey(b *testing.B) {
	s := credentials.Scope{"repositories": []any{"r1"}, "permissions": map[string]any{"contents": "write"}}
	b.ReportAllocs()
	for b.Loop() {
		var buf [128]byte
		appendKey(buf[:0], s)
	}
}
