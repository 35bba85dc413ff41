package audit

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
)

// maxPending bounds the events waiting to be written. A request that would go over it waits
// for the writer: events are never dropped.
const maxPending = 1 << 20

// batchWriter writes events on a goroutine of its own. A request hands its event over and goes
// on; when events arrive faster than one write takes, the next write carries all that came
// meanwhile, so under load many events share one write call. Each event is one Write from
// zerolog and stays whole: lines never interleave.
type batchWriter struct {
	w    io.Writer
	wake chan struct{} // capacity 1: the writer has something to do
	stop chan struct{}
	done chan struct{}

	lost atomic.Int64 // events whose write failed

	mu      sync.Mutex
	room    sync.Cond // signalled when pending has been taken
	pending []byte
	spare   []byte
	closed  bool
}

func newBatchWriter(w io.Writer) *batchWriter {
	b := &batchWriter{w: w, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	b.room.L = &b.mu
	go b.run()
	return b
}

func (b *batchWriter) Write(p []byte) (int, error) {
	b.mu.Lock()
	for len(b.pending) >= maxPending && !b.closed {
		b.room.Wait()
	}
	if b.closed { // after Close: written here and now
		defer b.mu.Unlock()
		n, err := b.w.Write(p)
		if err != nil {
			b.lost.Add(1)
		}
		return n, err
	}
	b.pending = append(b.pending, p...)
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default: // the writer is already due to look
	}
	return len(p), nil
}

func (b *batchWriter) run() {
	defer close(b.done)
	for {
		select {
		case <-b.wake:
			b.flush()
		case <-b.stop:
			b.flush()
			return
		}
	}
}

// flush writes what is pending until nothing is. Two buffers take turns: events are added to
// one while the other is written.
func (b *batchWriter) flush() {
	for {
		b.mu.Lock()
		buf := b.pending
		if len(buf) == 0 {
			b.mu.Unlock()
			return
		}
		b.pending, b.spare = b.spare[:0], nil
		b.room.Broadcast()
		b.mu.Unlock()
		if _, err := b.w.Write(buf); err != nil {
			// As zerolog reports a failed synchronous write; the events are lost, and counted.
			fmt.Fprintf(os.Stderr, "audit: writing events: %v\n", err)
			b.lost.Add(int64(bytes.Count(buf, []byte{'\n'})))
		}
		if cap(buf) <= 2*maxPending { // pending stops growing just past maxPending
			b.mu.Lock()
			b.spare = buf[:0]
			b.mu.Unlock()
		}
	}
}

// Close writes every pending event, stops the writer, and makes later writes synchronous.
func (b *batchWriter) Close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	b.room.Broadcast()
	b.mu.Unlock()
	close(b.stop)
	<-b.done
}
