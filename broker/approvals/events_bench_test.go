package approvals

import (
	"strings"
	"testing"
)

// BenchmarkAuditTap is the cost of the console's tap on each audit decision event with no
// console open: the event is kept for Recent and published to nobody.
func BenchmarkAuditTap(b *testing.B) {
	h := NewHub()
	line := []byte(`{"level":"info","request_id":"9c0f","agent":"coder-1","path":"/` + strings.Repeat("x", 400) + `","msg":"decision","time":"2026-12-05T20:33:24Z"}` + "\n")
	b.ReportAllocs()
	for b.Loop() {
		h.AuditTap(line)
	}
}
