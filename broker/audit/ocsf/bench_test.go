package ocsf

import (
	"testing"

	"github.com/capbroker/capbroker/broker/audit"
)

// BenchmarkEncode is the cost of encoding one decision, the broker's JSON line against OCSF,
// for an allowed request, a denied one (OCSF: an activity and a finding) and an LLM call.
func BenchmarkEncode(b *testing.B) {
	encs := map[string]audit.Encoder{"json": audit.JSON, "ocsf": New(Options{ProductVersion: "1.0.0"})}
	for _, ev := range []string{"http allowed", "http denied", "llm call"} {
		e := cases[ev].ev
		for _, name := range []string{"json", "ocsf"} {
			enc := encs[name]
			b.Run(name+"/"+ev, func(b *testing.B) {
				b.ReportAllocs()
				var buf []byte
				for b.Loop() {
					buf = enc.Decision(buf[:0], &e, meta)
				}
				b.SetBytes(int64(len(buf)))
			})
		}
	}
}
