package http2srv

import "sync"

// bodyBuf is a request body received and not yet read by its handler: the DATA frames' bytes
// in chunks taken from pools, each given back as soon as the handler has read it, so that a
// stream holds at most its window (and a chunk) whatever the body's length.
//
// It was one slice that frames were appended to and that was emptied only when the handler
// had read all of it. A handler that stays a frame behind the agent never empties it, and the
// slice kept every byte of the body (TestSlowReaderHoldsAWindow: 155 MiB of heap for a 64 MiB
// body); the broker's own upload path happened to empty it often enough. Chunks of a few
// sizes, reused, are what net/http's HTTP/2 server keeps its bodies in too; a small body
// takes a small chunk.
type bodyBuf struct {
	// chunks[h:] hold the bytes, from r in the first to w in the last; each chunk is its
	// class's whole length.
	chunks []*[]byte
	h      int
	r, w   int
	n      int // bytes held
}

// chunkSizes are the chunks' classes: a frame's bytes go to a chunk of the smallest class that
// holds them, the largest past that (a frame holds at most 16 KiB).
var chunkSizes = [...]int{1 << 10, 4 << 10, 16 << 10}

var chunkPools [len(chunkSizes)]sync.Pool

func getChunk(want int) *[]byte {
	i := 0
	for i < len(chunkSizes)-1 && want > chunkSizes[i] {
		i++
	}
	if c, ok := chunkPools[i].Get().(*[]byte); ok {
		return c
	}
	c := make([]byte, chunkSizes[i])
	return &c
}

func putChunk(c *[]byte) {
	for i, n := range chunkSizes {
		if len(*c) == n {
			chunkPools[i].Put(c)
			return
		}
	}
}

func (b *bodyBuf) len() int { return b.n }

func (b *bodyBuf) empty() bool { return b.h == len(b.chunks) }

// write appends p.
func (b *bodyBuf) write(p []byte) {
	b.n += len(p)
	for len(p) > 0 {
		if b.empty() || b.w == len(*b.chunks[len(b.chunks)-1]) {
			b.add(getChunk(len(p)))
			b.w = 0
		}
		k := copy((*b.chunks[len(b.chunks)-1])[b.w:], p)
		b.w += k
		p = p[k:]
	}
}

// add appends a chunk to the list. A list that is full and at least half given back is moved
// down instead of grown: a body read a frame behind the agent takes chunks and gives them back
// one by one for as long as it lasts, and the list holds only what is unread.
func (b *bodyBuf) add(c *[]byte) {
	if len(b.chunks) == cap(b.chunks) && b.h > 0 && b.h >= len(b.chunks)/2 {
		n := copy(b.chunks, b.chunks[b.h:])
		clear(b.chunks[n:])
		b.chunks, b.h = b.chunks[:n], 0
	}
	b.chunks = append(b.chunks, c)
}

// read moves up to len(p) of the bytes held, oldest first, to p.
func (b *bodyBuf) read(p []byte) int {
	n := 0
	for len(p) > 0 && b.n > 0 {
		c := *b.chunks[b.h]
		end := len(c)
		if b.h == len(b.chunks)-1 {
			end = b.w
		}
		k := copy(p, c[b.r:end])
		b.r += k
		b.n -= k
		n += k
		p = p[k:]
		if b.r == end {
			b.dropFirst()
		}
	}
	return n
}

// dropFirst gives the first chunk back.
func (b *bodyBuf) dropFirst() {
	putChunk(b.chunks[b.h])
	b.chunks[b.h] = nil
	b.h++
	b.r = 0
	if b.empty() {
		b.chunks, b.h, b.w = b.chunks[:0], 0, 0
	}
}

// reset drops what is held and gives every chunk back; it returns how many bytes it dropped.
func (b *bodyBuf) reset() int {
	n := b.n
	for !b.empty() {
		b.dropFirst()
	}
	b.n = 0
	return n
}
