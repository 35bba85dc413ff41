package scrub_test

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/capbroker/capbroker/broker/scrub"
)

// FuzzReader: for any input, patterns and read split, the streaming Reader produces exactly
// what String does, and no pattern survives in the output when the replacement cannot
// recreate it. This covers both scrubbing and placeholder substitution.
func FuzzReader(f *testing.F) {
	f.Add("xx sk-secret yy sk-sec", "sk-secret", "PLACEHOLDER", 3)
	f.Add("aaaa", "aa", "a", 1)
	f.Fuzz(func(t *testing.T, in, p1, p2 string, chunk int) {
		r := scrub.New(p1, "[REDACTED]", p2, "[REDACTED]")
		want := r.String(in)
		if chunk <= 0 || chunk > 64 {
			chunk = 1 + len(in)%7
		}
		got, err := io.ReadAll(r.Reader(io.NopCloser(iotest.OneByteReader(&chunked{s: in, n: chunk}))))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Fatalf("Reader %q != String %q", got, want)
		}
		// Read as the broker reads, into a buffer larger than the reader's own: src is read
		// straight into it, and the caller overwrites it between reads.
		rd := r.Reader(io.NopCloser(iotest.OneByteReader(&chunked{s: in, n: chunk})))
		var large []byte
		buf := make([]byte, 64<<10)
		for {
			n, err := rd.Read(buf)
			large = append(large, buf[:n]...)
			clear(buf)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if string(large) != want {
			t.Fatalf("Reader read into a large buffer %q != String %q", large, want)
		}
		for _, p := range []string{p1, p2} {
			if p != "" && !strings.Contains("[REDACTED]", p) && strings.Contains(want, p) {
				t.Fatalf("pattern %q survived in %q", p, want)
			}
		}
	})
}
