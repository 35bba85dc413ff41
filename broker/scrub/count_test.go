package scrub

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
)

// TestCounting: a Counting Replacer counts every replacement it makes, by every way of
// scrubbing, and a header field it removes for its name; the Replacer it was made from counts
// nothing.
func TestCounting(t *testing.T) {
	base := New("sk-canary-1", "[REDACTED]", "tok2", "[REDACTED]")
	cases := map[string]struct {
		run  func(r *Replacer)
		want int64
	}{
		"string":  {func(r *Replacer) { r.String("a sk-canary-1 b tok2 c sk-canary-1") }, 3},
		"none":    {func(r *Replacer) { r.String("nothing here") }, 0},
		"bytes":   {func(r *Replacer) { r.Bytes([]byte("tok2tok2")) }, 2},
		"stream":  {func(r *Replacer) { r.Stream(nil, []byte("x sk-canary-1 y"), true) }, 1},
		"masking": {func(r *Replacer) { r.Masking().String("sk-canary-1") }, 1},
		"header": {func(r *Replacer) {
			r.Header(http.Header{"X-Echo": {"sk-canary-1", "tok2 and tok2"}, "X-Sk-Canary-1": {"v"}})
		}, 4},
		"reader split across reads": {func(r *Replacer) {
			rd := r.Reader(io.NopCloser(iotest.OneByteReader(strings.NewReader("..sk-canary-1..tok2.."))))
			_, _ = io.ReadAll(rd)
		}, 2},
		"following": {func(r *Replacer) {
			f := Following(func() *Replacer { return base })
			var n atomic.Int64
			f.Counting(&n).String("sk-canary-1")
			r.String(strings.Repeat("tok2", int(n.Load())))
		}, 1},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			var n atomic.Int64
			c.run(base.Counting(&n))
			if got := n.Load(); got != c.want {
				t.Errorf("counted %d, want %d", got, c.want)
			}
		})
	}
	if New().Counting(new(atomic.Int64)) != New() {
		t.Error("the empty Replacer is not returned as it is")
	}
	if base.count != nil {
		t.Error("Counting changed the Replacer it was made from")
	}
}
