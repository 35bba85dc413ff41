package broker

import "testing"

// BenchmarkResponseScrubber times finding the Replacer for a response from a credentialed
// host, as every request does: the hot path of the registry of known secrets.
func BenchmarkResponseScrubber(b *testing.B) {
	br, _ := benchBroker(b, false)
	g := br.gen.Load()
	if g.responseScrubber("api.openai.com").Empty() {
		b.Fatal("nothing to scrub")
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = g.responseScrubber("api.openai.com")
	}
}
