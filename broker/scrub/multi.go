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
// It samples the text: with m the shortest pattern's length and q = min(m, 8), every
// occurrence of a pattern covers a window of q bytes at one of its first s = m-q+1 offsets,
// so reading the q bytes at every s-th position of the text sees each occurrence once. Each
// pattern's q-grams at those offsets are in a table (a bitmap for the common miss, then the
// grams themselves with their pattern and offset); a sampled window found there is checked
// against the patterns it names. With keys 40 bytes long, one window in 33 bytes is read.
// The same patterns' prefixes, sorted, tell how much of a stream's end to hold back
// (heldFrom), also without a loop over the patterns.
type multi struct {
	q, s  int
	mask  uint64 // the low q bytes of a little-endian word
	shift uint8  // 64 - log2(table size)
	bits  []uint64
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
	t := &multi{q: q, s: m - q + 1, mask: ^uint64(0) >> (64 - 8*q)}
	n := len(pairs) * t.s
	size := max(1024, 1<<bits.Len(uint(n*8))) // about one bit in eight set
	t.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	t.bits = make([]uint64, size/64)
	counts := make([]int32, size+1)
	for i := range pairs {
		for off := range t.s {
			h := t.hash(t.gramOf(pairs[i].old[off:]))
			counts[h+1]++
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
			g := t.gramOf(pairs[i].old[off:])
			h := t.hash(g)
			t.bits[h/64] |= 1 << (h % 64)
			e := entry{gram: g, pat: int32(i), off: int32(off)}
			if rest := pairs[i].old[off+q:]; len(rest) > 0 {
				n := min(len(rest), 8)
				var w [8]byte
				copy(w[:], rest[:n])
				e.next, e.nextMask = binary.LittleEndian.Uint64(w[:]), ^uint64(0)>>(64-8*n)
			}
			t.entries[fill[h]] = e
			fill[h]++
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

// gramOf is the q bytes at the start of b (at least q long) as a word.
func (t *multi) gramOf(b []byte) uint64 {
	if len(b) >= 8 {
		return binary.LittleEndian.Uint64(b) & t.mask
	}
	var g uint64
	for i := t.q - 1; i >= 0; i-- {
		g = g<<8 | uint64(b[i])
	}
	return g
}

func (t *multi) hash(g uint64) uint64 { return (g * 0x9E3779B97F4A7C15) >> t.shift }

func hash3(b []byte) uint32 {
	return (uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16) * 0x9E3779B1 >> 16
}

// find returns the start of the leftmost occurrence at or after pos of a pattern that lies
// wholly in src, and the longest pattern there; -1 when there is none.
func (t *multi) find(pairs []pair, src []byte, pos int) (int, int) {
	q, s := t.q, t.s
	for j := pos; j+q <= len(src); j += s {
		var g uint64
		if j+8 <= len(src) {
			g = binary.LittleEndian.Uint64(src[j:]) & t.mask
		} else {
			g = t.gramOf(src[j:])
		}
		h := t.hash(g)
		if t.bits[h/64]&(1<<(h%64)) == 0 {
			continue
		}
		start, k := -1, -1
		var next uint64
		if j+q+8 <= len(src) {
			next = binary.LittleEndian.Uint64(src[j+q:])
		} else {
			var w [8]byte
			copy(w[:], src[j+q:])
			next = binary.LittleEndian.Uint64(w[:])
		}
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

// heldFrom returns the start of the longest suffix of src that begins at or after from and is
// a proper prefix of some pattern, or len(src) when there is none.
func (t *multi) heldFrom(pairs []pair, src []byte, from, maxLen int) int {
	for i := max(from, len(src)-maxLen+1); i < len(src); i++ {
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
