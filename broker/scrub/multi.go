package scrub

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"slices"
	"strings"
)

// multi finds the leftmost-longest occurrence of any of a Replacer's patterns with one pass
// over the text whose cost does not grow with the number of patterns: a response from a host
// with a hundred keys bound to it is searched for some 1,500 forms, and a search per form
// (what a Replacer with one pattern does) made scrubbing a hundred times slower than for one.
//
// It samples the text: with m the shortest pattern's length and a window of q bytes (16 when
// m is at least 24, else min(m, 8)), every occurrence of a pattern covers a window at one of
// its first s = m-q+1 offsets, so reading the window at every s-th position of the text sees
// each occurrence once. Each pattern's windows at those offsets are in a table (a bitmap for
// the common miss, then the windows' first words with their pattern and offset, and the word
// that follows); a sampled window found there is checked against the patterns it names. With
// keys 40 bytes long, one window in 25 bytes is read. A window of 16 bytes tells apart the
// keys of one service, which share a prefix ("sk-live-"): in text that holds the prefix, 8
// bytes would find a hundred keys' entries at each sample that lands on it.
// The same patterns' prefixes, sorted, tell how much of a stream's end to hold back
// (heldFrom), also without a loop over the patterns.
type multi struct {
	q, s   int
	nextAt int    // where the word after the first one starts: min(q, 8)
	wide   bool   // q is 16: both words are hashed
	mask   uint64 // the low min(q, 8) bytes of a little-endian word
	// bits is a Bloom filter of the windows (two bits each, about one bit in eight set): most
	// windows of text are told from every pattern's without a cache miss. heads is smaller.
	bits      []uint64
	bitsShift uint8 // 64 - log2(len(bits)*64)
	shift     uint8 // 64 - log2(len(heads)-1)
	// heads[h]:heads[h+1] are the entries whose gram hashes to h.
	heads   []int32
	entries []entry
	// sorted holds the patterns' indexes in the order of their bytes; first3 is a bitmap of
	// their first three bytes' hashes, for a quick "no pattern starts here".
	sorted []int32
	first3 []uint64
}

// entry is a pattern's q-gram at an offset within its first s bytes.
type entry struct {
	gram uint64
	// next and nextMask are the up to 8 pattern bytes that follow the gram, as a word, and
	// which bytes of it they are: the patterns of a host's keys often share a prefix, and a
	// window holding it is told from most of them with one more word.
	next, nextMask uint64
	pat            int32
	off            int32
}

func newMulti(pairs []pair) *multi {
	m := len(pairs[0].old)
	for _, p := range pairs {
		m = min(m, len(p.old))
	}
	q := min(m, 8)
	if m >= 24 {
		q = 16
	}
	t := &multi{q: q, s: m - q + 1, nextAt: min(q, 8), wide: q == 16, mask: ^uint64(0) >> (64 - 8*min(q, 8))}
	n := len(pairs) * t.s
	size := max(256, 1<<bits.Len(uint(n*2)))
	t.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	nbits := max(4096, 1<<bits.Len(uint(n*16)))
	t.bitsShift = uint8(64 - bits.TrailingZeros(uint(nbits)))
	t.bits = make([]uint64, nbits/64)
	counts := make([]int32, size+1)
	for i := range pairs {
		for off := range t.s {
			counts[t.entryOf(pairs[i].old, off, i).h+1]++
		}
	}
	for h := 1; h <= size; h++ {
		counts[h] += counts[h-1]
	}
	t.heads = counts
	t.entries = make([]entry, n)
	fill := slices.Clone(counts[:size])
	for i := range pairs {
		for off := range t.s {
			he := t.entryOf(pairs[i].old, off, i)
			t.setFilter(he.hv)
			t.entries[fill[he.h]] = he.entry
			fill[he.h]++
		}
	}
	t.sorted = make([]int32, len(pairs))
	for i := range t.sorted {
		t.sorted[i] = int32(i)
	}
	slices.SortFunc(t.sorted, func(a, b int32) int { return strings.Compare(pairs[a].pattern, pairs[b].pattern) })
	t.first3 = make([]uint64, 1<<16/64)
	for _, p := range pairs {
		if len(p.old) >= 3 {
			h := hash3(p.old)
			t.first3[h/64] |= 1 << (h % 64)
		}
	}
	return t
}

type hashedEntry struct {
	entry
	hv, h uint64 // the window's hash, and its slot in heads
}

// entryOf is pattern i's (p's) entry for its window at off, and the window's hash.
func (t *multi) entryOf(p []byte, off, i int) hashedEntry {
	e := entry{gram: word(p[off:]) & t.mask, pat: int32(i), off: int32(off)}
	if rest := p[off+t.nextAt:]; len(rest) > 0 {
		e.next, e.nextMask = word(rest), ^uint64(0)>>(64-8*min(len(rest), 8))
		e.next &= e.nextMask
	}
	hv := t.hash(e.gram, e.next)
	return hashedEntry{e, hv, t.slot(hv)}
}

// word is b's first 8 bytes as a little-endian word, zeros past b's end.
func word(b []byte) uint64 {
	if len(b) >= 8 {
		return binary.LittleEndian.Uint64(b)
	}
	var w [8]byte
	copy(w[:], b)
	return binary.LittleEndian.Uint64(w[:])
}

// hash is a window's hash: of its first word g, and with a wide window the next.
func (t *multi) hash(g, next uint64) uint64 { return windowHash(g, next, t.wide) }

func windowHash(g, next uint64, wide bool) uint64 {
	if wide {
		g ^= bits.RotateLeft64(next*0xC2B2AE3D27D4EB4F, 31)
	}
	return g * 0x9E3779B97F4A7C15
}

// filterBits are the two bits of a window whose hash is hv in the filter (t.bits, whose index
// bits are shift's complement): what setFilter sets and passes tests.
func filterBits(hv uint64, shift uint8) (uint64, uint64) { return hv >> shift, (hv << 24) >> shift }

// passes reports whether a window whose hash is hv may be some pattern's: both its bits are
// set in filter.
func passes(filter []uint64, shift uint8, hv uint64) bool {
	b1, b2 := filterBits(hv, shift)
	last := uint64(len(filter) - 1) // a power of two less one: the index needs no check
	return filter[(b1/64)&last]&(1<<(b1%64)) != 0 && filter[(b2/64)&last]&(1<<(b2%64)) != 0
}

// setFilter sets hv's two bits in t.bits.
func (t *multi) setFilter(hv uint64) {
	b1, b2 := filterBits(hv, t.bitsShift)
	t.bits[b1/64] |= 1 << (b1 % 64)
	t.bits[b2/64] |= 1 << (b2 % 64)
}

// slot is a hash's entry list in t.heads.
func (t *multi) slot(hv uint64) uint64 { return (hv * 0xFF51AFD7ED558CCD) >> t.shift }

func hash3(b []byte) uint32 {
	return (uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16) * 0x9E3779B1 >> 16
}

// find returns the start of the leftmost occurrence at or after pos of a pattern that lies
// wholly in src, and the longest pattern there; -1 when there is none.
func (t *multi) find(pairs []pair, src []byte, pos int) (int, int) {
	q, s := t.q, t.s
	for j := pos; j+q <= len(src); j += s {
		if j = t.skip(src, j); j+q > len(src) {
			break
		}
		var g, next uint64
		if j+16 <= len(src) {
			g, next = binary.LittleEndian.Uint64(src[j:]), binary.LittleEndian.Uint64(src[j+t.nextAt:])
		} else {
			g, next = word(src[j:]), word(src[j+t.nextAt:])
		}
		g &= t.mask
		hv := t.hash(g, next)
		if !passes(t.bits, t.bitsShift, hv) {
			continue
		}
		h := t.slot(hv)
		start, k := -1, -1
		for _, e := range t.entries[t.heads[h]:t.heads[h+1]] {
			if e.gram != g || next&e.nextMask != e.next {
				continue
			}
			st := j - int(e.off)
			if st < pos || (start >= 0 && st > start) {
				continue
			}
			p := pairs[e.pat].old
			if st+len(p) > len(src) || !bytes.Equal(src[st:st+len(p)], p) {
				continue
			}
			if start < 0 || st < start || len(p) > len(pairs[k].old) {
				start, k = st, int(e.pat)
			}
		}
		if start >= 0 {
			return start, k
		}
	}
	return -1, -1
}

// skip returns the first of j, j+s, j+2s... whose window passes the filter, or the first from
// which it reads no further (what it reads lies in src): where find looks closer, and tests
// that window itself. It is find's inner loop, apart so that it keeps what it reads in
// registers (a window is read every s bytes of every response from a host with keys bound to
// it).
func (t *multi) skip(src []byte, j int) int {
	filter, shift, mask, s := t.bits, t.bitsShift, t.mask, t.s
	if t.wide { // a loop each, so that each compiles without the other's work
		// Two windows a turn: the second's hash is worked out while the first's is tested,
		// about a tenth off a response's scrubbing (BenchmarkScrubSecrets; four a turn was
		// slower). At most one window is left after it, which find tests.
		for ; j >= 0 && j+s+16 <= len(src); j += 2 * s {
			w, v := src[j:j+16:j+16], src[j+s:j+s+16:j+s+16]
			h1 := windowHash(binary.LittleEndian.Uint64(w), binary.LittleEndian.Uint64(w[8:]), true)
			h2 := windowHash(binary.LittleEndian.Uint64(v), binary.LittleEndian.Uint64(v[8:]), true)
			if passes(filter, shift, h1) {
				return j
			}
			if passes(filter, shift, h2) {
				return j + s
			}
		}
		return j
	}
	for ; j >= 0 && j+16 <= len(src); j += s {
		if passes(filter, shift, windowHash(binary.LittleEndian.Uint64(src[j:j+8:j+8])&mask, 0, false)) {
			return j
		}
	}
	return j
}

// heldFrom returns the start of the longest suffix of src that begins at or after from and is
// a proper prefix of some pattern, or len(src) when there is none. starts holds the patterns'
// first bytes: most positions are told apart by that alone.
func (t *multi) heldFrom(pairs []pair, starts *[256]bool, src []byte, from, maxLen int) int {
	for i := max(from, len(src)-maxLen+1); i < len(src); i++ {
		if !starts[src[i]] {
			continue
		}
		tail := src[i:]
		if len(tail) >= 3 {
			h := hash3(tail)
			if t.first3[h/64]&(1<<(h%64)) == 0 {
				continue
			}
		}
		// The patterns that have tail as a proper prefix sort right after it (after tail
		// itself, when it is a pattern).
		at, _ := slices.BinarySearchFunc(t.sorted, tail, func(p int32, tail []byte) int {
			return bytes.Compare(pairs[p].old, tail)
		})
		for ; at < len(t.sorted); at++ {
			p := pairs[t.sorted[at]].old
			if !bytes.HasPrefix(p, tail) {
				break
			}
			if len(p) > len(tail) {
				return i
			}
		}
	}
	return len(src)
}
