// Package scrub replaces fixed byte strings in strings, headers and streams.
//
// The broker uses it in both directions: to substitute placeholders with
// secrets in outgoing requests, and to replace secrets with "[REDACTED]" in
// responses before they reach the agent.
//
// Matching is leftmost-longest and non-overlapping: the input is scanned from
// left to right, at each position the longest pattern that matches there is
// replaced, and scanning resumes after it. Replacement text is never scanned
// again. String, Bytes, Header, Stream and Reader all produce the same result for the same
// input, however a stream is split into reads.
package scrub

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Replacer replaces fixed byte strings in streams and strings.
// It is immutable and safe for concurrent use.
type Replacer struct {
	pairs  []pair    // in argument order, without empty and repeated patterns
	maxLen int       // length of the longest pattern
	minLen int       // length of the shortest pattern
	starts [256]bool // the first bytes of the patterns
	// multi searches for all the patterns at once, when there are at least multiFrom.
	multi *multi
	// follow, when set (Following), gives the patterns in force now: r has none of its own.
	follow func() *Replacer
	// count, when set (Counting), is added the number of replacements r makes.
	count *atomic.Int64
}

// Counting returns a Replacer for the same patterns that adds to n each replacement it makes
// (and each header field it removes): how many times a response carried a secret. The empty
// Replacer is returned as it is: it replaces nothing.
func (r *Replacer) Counting(n *atomic.Int64) *Replacer {
	if r.Empty() {
		return r
	}
	c := *r
	c.count = n
	return &c
}

// counted adds m replacements to r's count, if it keeps one.
func (r *Replacer) counted(m int) {
	if r.count != nil && m > 0 {
		r.count.Add(int64(m))
	}
}

// Following returns a Replacer whose patterns are, at each use, those of the Replacer current
// returns then: every String, Bytes, Header and Stream, and every read of a Reader, asks it
// again. It is for a response that outlives the set of secrets it must be scrubbed of (a
// stream open while a token is minted): what a stream reads after a pattern was added is
// scrubbed of it. It is never Empty, as patterns may come. current must not return a
// Following Replacer, and must be safe for concurrent use.
func Following(current func() *Replacer) *Replacer {
	return &Replacer{follow: current}
}

// now is the Replacer in force: r, or what r follows.
func (r *Replacer) now() *Replacer {
	if r.follow == nil {
		return r
	}
	return r.follow()
}

// pair is a pattern and its replacement.
type pair struct {
	pattern  string
	old, new []byte // the pattern as bytes, and its replacement
	rare     int    // the offset in old of its byte least common in text (rarest)
}

// none is the Replacer without patterns.
var none = &Replacer{}

// New returns a Replacer for old, new pairs, like strings.NewReplacer.
// Empty old strings are dropped; when an old string is repeated, the first
// pair wins. Like strings.NewReplacer, New panics if given an odd number of
// arguments: that is a programming error, and silently dropping a pattern
// could leave a secret unredacted.
func New(oldnew ...string) *Replacer { return build(multiFrom, oldnew) }

// build is New, searching for the patterns at once when there are at least from of them.
func build(from int, oldnew []string) *Replacer {
	if len(oldnew)%2 == 1 {
		panic("scrub.New: odd argument count")
	}
	if len(oldnew) == 0 {
		return none
	}
	size := 0
	for _, s := range oldnew {
		size += len(s)
	}
	mem := make([]byte, 0, size) // every pattern's and replacement's bytes, in one allocation
	r := &Replacer{pairs: make([]pair, 0, len(oldnew)/2)}
	for i := 0; i < len(oldnew); i += 2 {
		old, repl := oldnew[i], oldnew[i+1]
		if old == "" || slices.ContainsFunc(r.pairs, func(p pair) bool { return p.pattern == old }) {
			continue
		}
		start := len(mem)
		mem = append(mem, old...)
		mid, end := len(mem), len(mem)+len(repl)
		mem = append(mem, repl...)
		r.pairs = append(r.pairs, pair{pattern: old, old: mem[start:mid:mid], new: mem[mid:end:end], rare: rarest(old)})
		r.maxLen = max(r.maxLen, len(old))
		r.starts[old[0]] = true
	}
	if len(r.pairs) == 0 {
		return none
	}
	r.minLen = len(r.pairs[0].old)
	for _, p := range r.pairs {
		r.minLen = min(r.minLen, len(p.old))
	}
	if len(r.pairs) >= from {
		r.multi = newMulti(r.pairs)
	}
	return r
}

// multiFrom is the fewest patterns searched for at once (multi) rather than one by one: a
// single pattern is found fastest by bytes.Index. A variable for tests, which search for
// every set of patterns both ways.
var multiFrom = 2

// Empty reports whether r has no patterns, so that it never changes anything.
func (r *Replacer) Empty() bool { return len(r.pairs) == 0 && r.follow == nil }

// MaxLen is the length of the longest pattern (0 without any), now.
func (r *Replacer) MaxLen() int { return r.now().maxLen }

// Masking returns a Replacer for the same patterns whose replacements keep their length: a
// pattern becomes "[REDACTED]" padded with "*" to its length, or "*"s when it is shorter. It is
// for bytes whose offsets must not move (a byte range cut from a representation).
func (r *Replacer) Masking() *Replacer {
	count := r.count
	r = r.now() // a fixed set: offsets are decided once
	if r.Empty() {
		return none
	}
	const marker = "[REDACTED]"
	oldnew := make([]string, 0, 2*len(r.pairs))
	for _, p := range r.pairs {
		mask := strings.Repeat("*", len(p.old))
		if len(p.old) >= len(marker) {
			mask = marker + mask[len(marker):]
		}
		oldnew = append(oldnew, p.pattern, mask)
	}
	m := New(oldnew...)
	m.count = count
	return m
}

// String returns s with all patterns replaced. It does not allocate when s
// contains no pattern.
func (r *Replacer) String(s string) string {
	out, n := r.now().string(s)
	r.counted(n)
	return out
}

// string is String of a Replacer that follows none, with the number of replacements.
func (r *Replacer) string(s string) (string, int) {
	if r.multi != nil {
		// The bytes are only read.
		if i, _ := r.multi.find(r.pairs, unsafe.Slice(unsafe.StringData(s), len(s)), 0); i >= 0 {
			b, n := r.replaceAll([]byte(s))
			return string(b), n
		}
		return s, 0
	}
	for _, p := range r.pairs {
		if strings.Contains(s, p.pattern) {
			b, n := r.replaceAll([]byte(s))
			return string(b), n
		}
	}
	return s, 0
}

// Bytes returns b with all patterns replaced: b itself when it contains none.
func (r *Replacer) Bytes(b []byte) []byte {
	outer := r
	r = r.now()
	if r.multi != nil {
		if i, _ := r.multi.find(r.pairs, b, 0); i >= 0 {
			out, n := r.replaceAll(b)
			outer.counted(n)
			return out
		}
		return b
	}
	for _, p := range r.pairs {
		if bytes.Contains(b, p.old) {
			out, n := r.replaceAll(b)
			outer.counted(n)
			return out
		}
	}
	return b
}

// Stream appends to dst the replaced form of the longest prefix of in that can be decided now,
// and returns it with the length of that prefix. The rest of in, shorter than the longest
// pattern, may begin one: pass it again, ahead of the input that follows. With final, all of
// in is decided. It is what Reader does, for a caller that frames its own output.
func (r *Replacer) Stream(dst, in []byte, final bool) ([]byte, int) {
	outer := r
	if r = r.now(); r.Empty() {
		return append(dst, in...), len(in)
	}
	out, done, n := r.replace(dst, in, final, make([]int, len(r.pairs)))
	outer.counted(n)
	return out, done
}

// replaceAll returns a new slice holding b with all patterns replaced, and the number of
// replacements.
func (r *Replacer) replaceAll(b []byte) ([]byte, int) {
	out, _, n := r.replace(make([]byte, 0, len(b)), b, true, make([]int, len(r.pairs)))
	return out, n
}

// Header replaces patterns inside every value of h, in place, and removes every field whose
// name holds a pattern in any letter case. A name cannot take the replacement instead: it must
// stay a token, which "[REDACTED]" is not, and any token put in its place could collide with a
// real field. Nor can the match be exact: net/http has already changed the case of every name
// it parsed (canonical form, or lower case from HTTP/2), so "x-sk-live-ab12" arrives as
// "X-Sk-Live-Ab12", which reveals the secret as well. No real field is named after a secret.
func (r *Replacer) Header(h http.Header) {
	outer := r
	if r = r.now(); r.Empty() {
		return
	}
	for k, vs := range h {
		if r.inName(k) {
			delete(h, k)
			outer.counted(1)
			continue
		}
		for i, v := range vs {
			var n int
			vs[i], n = r.string(v)
			outer.counted(n)
		}
	}
}

// inName reports whether name holds a pattern, compared without regard to letter case.
func (r *Replacer) inName(name string) bool {
	if len(name) < r.minLen {
		return false
	}
	for _, p := range r.pairs {
		if len(p.pattern) <= len(name) && containsFold(name, p.pattern) {
			return true
		}
	}
	return false
}

// containsFold reports whether s holds sub under Unicode case folding, as strings.EqualFold.
func containsFold(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if strings.EqualFold(s[i:i+len(sub)], sub) {
			return true
		}
	}
	return false
}

// Reader returns a ReadCloser that yields src with all patterns replaced.
// Closing it closes src. If r is empty, src is returned unchanged.
//
// The reader never buffers a whole body. It holds back only the longest
// suffix of its input that is a proper prefix of some pattern (fewer than
// the longest pattern's length in bytes) and returns everything else as soon
// as src delivers it. When src returns an error, including io.EOF, the
// held-back bytes are emitted unchanged and the error is returned after them.
//
// The returned reader is not safe for concurrent use. A Following Replacer's reader takes the
// patterns in force at each read of src.
func (r *Replacer) Reader(src io.ReadCloser) io.ReadCloser {
	if r.Empty() {
		return src
	}
	return &reader{r: r.now(), follow: r.follow, count: r.count, src: src}
}

// replace appends to dst the replaced form of the longest prefix of src
// that can be decided now, and returns the extended dst, the length of
// that prefix and the number of replacements made. Unless eof, the remainder is the longest suffix of src that
// begins after the last replaced match and is a proper prefix of a pattern;
// it must be passed again, followed by more input. If eof, all of src is
// consumed. next is scratch space with one entry per pattern.
func (r *Replacer) replace(dst, src []byte, eof bool, next []int) (_ []byte, done, replaced int) {
	const unknown, absent = -2, -1
	for i := range next {
		next[i] = unknown
	}
	pos, hold := 0, r.holdFrom(src, 0, eof)
	if r.multi != nil {
		for {
			start, k := r.multi.find(r.pairs, src, pos)
			if start < 0 || start >= hold {
				break
			}
			dst = append(dst, src[pos:start]...)
			dst = append(dst, r.pairs[k].new...)
			replaced++
			pos = start + len(r.pairs[k].old)
			if pos > hold {
				hold = r.holdFrom(src, pos, eof)
			}
		}
		return append(dst, src[pos:hold]...), hold, replaced
	}
	for {
		// Find the leftmost match at or after pos, preferring the longest.
		// next caches each pattern's first occurrence at or after pos.
		start, k := absent, 0
		for i, pr := range r.pairs {
			p := pr.old
			if next[i] == absent {
				continue
			}
			if next[i] < pos {
				j := index(src[pos:], &r.pairs[i])
				if j < 0 {
					next[i] = absent
					continue
				}
				next[i] = pos + j
			}
			if start == absent || next[i] < start || (next[i] == start && len(p) > len(r.pairs[k].old)) {
				start, k = next[i], i
			}
		}
		// A match starting at or after hold is not decided yet: the held
		// bytes may complete a pattern that starts earlier and wins.
		// A match before hold is decided, because if a longer pattern could
		// still match at start, start itself would be a hold position.
		if start == absent || start >= hold {
			break
		}
		dst = append(dst, src[pos:start]...)
		dst = append(dst, r.pairs[k].new...)
		replaced++
		pos = start + len(r.pairs[k].old)
		if pos > hold {
			// The match covered the held bytes; what remains may not
			// need holding at all.
			hold = r.holdFrom(src, pos, eof)
		}
	}
	return append(dst, src[pos:hold]...), hold, replaced
}

// clean reports whether replace would leave src as it is: no pattern begins before the held
// bytes (hold, as replace holds them back).
func (r *Replacer) clean(src []byte, eof bool) (hold int, ok bool) {
	hold = r.holdFrom(src, 0, eof)
	if r.multi != nil {
		start, _ := r.multi.find(r.pairs, src, 0)
		return hold, start < 0 || start >= hold
	}
	for i := range r.pairs {
		if j := index(src[:min(hold+len(r.pairs[i].old)-1, len(src))], &r.pairs[i]); j >= 0 && j < hold {
			return hold, false
		}
	}
	return hold, true
}

// index is bytes.Index(s, p.old). A response is searched for every form of every secret
// of its host, and bytes.Index, which looks for a pattern's first byte and checks what
// follows, slows down on text full of that byte. Searching for the pattern's rarest byte
// instead finds far fewer places to check. Text full of that one (as an upstream could send)
// is left to bytes.Index, whose worst case is linear, after as many misses as it allows.
func index(s []byte, p *pair) int {
	n, c := len(p.old), p.old[p.rare]
	for off, misses := 0, 0; off+n <= len(s); misses++ {
		if misses > 4+off>>4 {
			if i := bytes.Index(s[off:], p.old); i >= 0 {
				return off + i
			}
			return -1
		}
		i := bytes.IndexByte(s[off+p.rare:len(s)-n+p.rare+1], c)
		if i < 0 {
			return -1
		}
		if bytes.Equal(s[off+i:off+i+n], p.old) {
			return off + i
		}
		off += i + 1
	}
	return -1
}

// rarest returns the offset of p's byte that is least common in text, by commonness.
func rarest(p string) int {
	best := 0
	for i := 1; i < len(p); i++ {
		if commonness[p[i]] < commonness[p[best]] {
			best = i
		}
	}
	return best
}

// commonness ranks bytes by how often they occur in the text of API responses (JSON,
// English, code): the higher, the more common. Only the order matters. Space and lower-case
// letters come first, in English order, then JSON's punctuation and digits, then upper-case
// letters in English order, then the rest.
var commonness = func() (rank [256]byte) {
	order := " etaonisrhldcupmfgwybvkxjqz\"\n,:{}._-/0123456789ETAONISRHLDCUMFPGWYBVKXJQZ=+&%<>()[];'\\*#@!?$|^`~\t\r"
	for i := range len(order) {
		rank[order[i]] = byte(len(order) - i)
	}
	return rank
}()

// holdFrom returns the start of the longest suffix of src that begins at or
// after from and is a proper prefix of some pattern, or len(src) if there is
// none or eof is set.
func (r *Replacer) holdFrom(src []byte, from int, eof bool) int {
	if eof {
		return len(src)
	}
	if r.multi != nil {
		return r.multi.heldFrom(r.pairs, &r.starts, src, from, r.maxLen)
	}
	for i := max(from, len(src)-r.maxLen+1); i < len(src); i++ {
		if !r.starts[src[i]] {
			continue
		}
		tail := src[i:]
		for _, p := range r.pairs {
			if len(p.old) > len(tail) && bytes.HasPrefix(p.old, tail) {
				return i
			}
		}
	}
	return len(src)
}

// readSize is the size of a reader's input buffer, before room for held bytes. A reader
// starts with firstReadSize and grows to readSize once a read fills its buffer, so that a
// small response (most API answers) does not allocate and clear two large buffers.
const (
	readSize      = 32 << 10
	firstReadSize = 4 << 10
)

// maxEmptyReads bounds consecutive (0, nil) reads from src, as in bufio.
const maxEmptyReads = 100

// reader is the ReadCloser returned by Replacer.Reader.
type reader struct {
	r      *Replacer
	follow func() *Replacer // Replacer.follow: r is renewed from it before each read
	count  *atomic.Int64    // Replacer.count
	src    io.ReadCloser
	in     []byte // in[:held] are held-back input bytes; the rest is read space
	held   int
	out    []byte // replaced output; out[off:] is not yet returned
	off    int
	next   []int // scratch for Replacer.replace
	full   bool  // the last read filled the input buffer: grow it before the next
	err    error // sticky error from src; set once all input is consumed

	pooled *buffers // in and out, while they are a pooled pair
	nexts  [16]int  // next, for up to 16 patterns: the forms of two keys
}

// Read implements io.Reader. It reads from src only while it has no output
// to return, so it never waits for more input than needed to return a byte.
func (z *reader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for empty := 0; z.off == len(z.out); {
		if z.err != nil {
			return 0, z.err
		}
		if empty == maxEmptyReads {
			return 0, io.ErrNoProgress
		}
		var direct []byte
		if z.in != nil && len(p) >= len(z.in) {
			// p holds what a read of the input buffer gives, as a rule: src is read into
			// it, and what holds nothing to replace is returned from there as it was read,
			// rather than copied into the input buffer and out again.
			direct = p
		}
		read, inP := z.fill(direct)
		if len(inP) > 0 {
			return len(inP), z.err
		}
		if read == 0 {
			empty++
		}
	}
	n := copy(p, z.out[z.off:])
	z.off += n
	if z.off == len(z.out) && z.err != nil {
		return n, z.err // the end with the last bytes, so the writer can send both at once
	}
	return n, nil
}

// fill performs one src.Read and replaces what can be decided into z.out. With direct (a
// caller's buffer at least as large as z.in) src is read into direct, after the held bytes:
// when what can be decided holds no pattern, direct's prefix that holds it is returned, and
// z.out left empty. It returns the number of bytes read from src.
func (z *reader) fill(direct []byte) (int, []byte) {
	switch {
	case z.in == nil:
		n := firstReadSize + z.r.maxLen
		if z.r.maxLen <= firstSlack {
			z.pooled = pool.Get().(*buffers)
			z.in, z.out = z.pooled.in[:n], z.pooled.out[:0]
		} else {
			z.in, z.out = make([]byte, n), make([]byte, 0, n)
		}
		z.next = z.nexts[:0]
		z.next = slices.Grow(z.next, len(z.r.pairs))[:len(z.r.pairs)]
	case direct == nil && (z.full && len(z.in) < readSize+z.r.maxLen || len(z.in)-z.held < firstReadSize):
		// The second case: held bytes of a Following Replacer's longer patterns.
		in := make([]byte, max(readSize+z.r.maxLen, z.held+readSize))
		copy(in, z.in[:z.held])
		z.in, z.out = in, make([]byte, 0, len(in))
		z.release()
	}
	in := z.in
	if direct != nil {
		in = direct
		copy(in, z.in[:z.held])
	}
	n, err := z.src.Read(in[z.held:])
	if z.follow != nil {
		// The patterns in force once the bytes were read: a secret the upstream wrote was
		// known before it could have been sent to it.
		if r := z.follow(); r != z.r {
			z.r = r
			z.next = slices.Grow(z.next[:0], len(r.pairs))[:len(r.pairs)]
		}
	}
	z.full = direct == nil && z.held+n == len(z.in)
	data := in[:z.held+n]
	z.off, z.err = 0, err
	if direct != nil {
		if hold, clean := z.r.clean(data, err != nil); clean {
			z.out = z.out[:0]
			z.held = copy(z.in, data[hold:])
			return n, data[:hold]
		}
	}
	out, done, replaced := z.r.replace(z.out[:0], data, err != nil, z.next)
	if replaced > 0 && z.count != nil {
		z.count.Add(int64(replaced))
	}
	z.out = out
	z.held = copy(z.in, data[done:])
	return n, nil
}

// Close closes src, and gives the reader's buffers back for another response to use.
func (z *reader) Close() error {
	if z.err != errClosed {
		z.release()
		z.in, z.out, z.off, z.held, z.err = nil, nil, 0, 0, errClosed
	}
	return z.src.Close()
}

// release gives the pooled pair back, once z no longer uses it.
func (z *reader) release() {
	if z.pooled != nil {
		pool.Put(z.pooled)
		z.pooled = nil
	}
}

var errClosed = errors.New("scrub: read after close")

// buffers are a reader's input and output buffers of the first size. Most responses are small,
// and a fresh pair for each one made the garbage collector the main cost of scrubbing them,
// so pairs are pooled. Readers with patterns longer than firstSlack do not use the pool.
type buffers struct{ in, out []byte }

var pool = sync.Pool{New: func() any {
	return &buffers{in: make([]byte, firstReadSize+firstSlack), out: make([]byte, 0, firstReadSize+firstSlack)}
}}

const firstSlack = 256
