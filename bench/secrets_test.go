package main

import (
	"testing"

	"github.com/capbroker/capbroker/broker/scrub"
)

// TestSecretsRedacts: the measured scrubbers redact the keys they are built from, in the text
// the bench reads through them.
func TestSecretsRedacts(t *testing.T) {
	for _, special := range []bool{false, true} {
		pairs, n := keyForms(100, special)
		if n < 100*7 {
			t.Fatalf("%d patterns for 100 keys", n)
		}
		r := scrub.New(pairs...)
		text := string(scrubText()[:4096]) + pairs[0] + " " + pairs[len(pairs)-2]
		out := r.String(text)
		if out == text || len(out) >= len(text) {
			t.Fatalf("special %v: the keys' forms were not redacted", special)
		}
	}
}

func BenchmarkSecrets(b *testing.B) {
	text := scrubText()
	for _, n := range []int{1, 100} {
		pairs, _ := keyForms(n, false)
		r := scrub.New(pairs...)
		b.Run(map[int]string{1: "one", 100: "many"}[n], func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				scrubRound(r, text, 1)
			}
		})
	}
}
