package audit

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// maxPending bounds the events waiting to be written. A request that would go over it waits
// for the writer: events are never dropped.
const maxPending = 1 << 20

// The writer waits up to linger after an event for others to join it in one write, unless
// lingerBytes are already pending. Under load that makes one write of tens of events instead
// of one per event (a write to a file costs several microseconds, as much as the rest of the
// event's audit); an event waits at most that long in memory before it is written.
const (
	linger      = 2 * time.Millisecond
	lingerBytes = 64 << 10
)

// batchWriter writes events on a goroutine of its own. A request hands its event over and goes
// on; the writer collects the events that arrive within linger of each other, or while a write
// is under way, into one write call. Each event is one Write from zerolog and stays whole:
// lines never interleave.
type batchWriter struct {
	w    io.Writer
	wake chan struct{} // capacity 1: the writer has something to do
	full chan struct{} // capacity 1: lingerBytes are pending, write them now
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
	b := &batchWriter{w: w, wake: make(chan struct{}, 1), full: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
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
	full := len(b.pending) >= lingerBytes
	b.mu.Unlock()
	signal(b.wake)
	if full {
		signal(b.full)
	}
	return len(p), nil
}

// signal makes c ready to receive, if it is not already.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (b *batchWriter) run() {
	defer close(b.done)
	t := time.NewTimer(linger)
	t.Stop()
	for {
		select {
		case <-b.wake:
		case <-b.stop:
			b.flush()
			return
		}
		t.Reset(linger) // since Go 1.23, a stopped or reset timer delivers no stale tick
		select {
		case <-t.C:
		case <-b.full:
		case <-b.stop: // the loop comes back to it after this write
		}
		t.Stop()
		b.flush()
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

// File is an audit file that can be reopened by its path, for log rotation: after logrotate
// (or anything else) renames the file, Reopen makes the writes that follow go to a new file
// at the path. A write is never split between two files, and none is dropped: Reopen waits for
// the write under way, and a write that comes while it runs waits for it. If the path cannot
// be opened, writes go on to the file already open.
type File struct {
	path string
	mu   sync.Mutex
	f    *os.File
}

// OpenFile opens path for appending (created 0600).
func OpenFile(path string) (*File, error) {
	f, err := openAppend(path)
	if err != nil {
		return nil, err
	}
	return &File{path: path, f: f}, nil
}

func openAppend(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
}

// Write writes p whole to the file open now.
func (f *File) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.f.Write(p)
}

// Reopen opens the path again and makes it the file written to, then closes the previous one.
// On error the previous file stays in use.
func (f *File) Reopen() error {
	nf, err := openAppend(f.path)
	if err != nil {
		return err
	}
	f.mu.Lock()
	old := f.f
	f.f = nf
	f.mu.Unlock()
	return old.Close()
}

// Close closes the file.
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.f.Close()
}
