package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestBatchWriterKeepsEveryEventWhole writes events from many goroutines through a writer that
// is slow at first (it holds its first write until released, so events pile up past
// maxPending): after Close, every event is there once, as a line of its own.
func TestBatchWriterKeepsEveryEventWhole(t *testing.T) {
	var out lockedBuffer
	release := make(chan struct{})
	out.gate = release
	l := New(&out)
	const writers, each = 8, 2000
	pad := strings.Repeat("x", 200) // 8*2000 events of ~500 bytes: several times maxPending
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				l.Write(&Event{RequestID: fmt.Sprintf("%d-%d", w, i), Reason: pad, Start: time.Now()})
			}
		})
	}
	close(release)
	wg.Wait()
	l.Close()

	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out.Bytes()))
	for sc.Scan() {
		var ev struct {
			RequestID string `json:"request_id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("a line is not one event: %.200q", sc.Text())
		}
		if seen[ev.RequestID] {
			t.Fatalf("event %s written twice", ev.RequestID)
		}
		seen[ev.RequestID] = true
	}
	if len(seen) != writers*each {
		t.Fatalf("%d events written, want %d", len(seen), writers*each)
	}
	if out.writes >= writers*each {
		t.Errorf("%d writes for %d events: none was batched", out.writes, writers*each)
	}
}

func TestBatchWriterAfterClose(t *testing.T) {
	var out lockedBuffer
	l := New(&out)
	l.Close()
	l.Close() // twice is harmless
	l.Write(&Event{RequestID: "late", Start: time.Now()})
	if !strings.Contains(string(out.Bytes()), `"request_id":"late"`) {
		t.Fatalf("an event written after Close is not there at once: %q", out.Bytes())
	}
}

// lockedBuffer records writes; the first one waits for gate, when set.
type lockedBuffer struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	writes int
	gate   chan struct{}
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	if b.gate != nil {
		<-b.gate
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.writes++
	return b.buf.Write(p)
}

func (b *lockedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

// TestBatchWriterReusesItsBuffers writes events from several goroutines while the writer
// writes others: its two buffers take turns, so events allocate only while the buffers grow.
func TestBatchWriterReusesItsBuffers(t *testing.T) {
	w := newBatchWriter(io.Discard)
	defer w.Close()
	line := []byte(strings.Repeat("x", 300) + "\n")
	const writers, each = 4, 20000
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for range each {
				w.Write(line)
			}
		})
	}
	wg.Wait()
	runtime.ReadMemStats(&after)
	if n := after.Mallocs - before.Mallocs; n > 300 {
		t.Errorf("%d allocations for %d events", n, writers*each)
	}
}

// TestLostEventsAreCounted writes events to a destination that fails: each one is counted as
// lost, whether it was batched or written after Close.
func TestLostEventsAreCounted(t *testing.T) {
	l := New(failingWriter{})
	for i := range 5 {
		l.Write(&Event{RequestID: fmt.Sprint(i), Start: time.Now()})
	}
	l.Close() // every pending event has been attempted
	if n := l.Lost(); n != 5 {
		t.Fatalf("%d events counted lost, want 5", n)
	}
	l.Write(&Event{RequestID: "after close", Start: time.Now()})
	if n := l.Lost(); n != 6 {
		t.Fatalf("%d events counted lost after a write after Close, want 6", n)
	}
	if n := New(io.Discard).Lost(); n != 0 {
		t.Fatalf("%d events lost on a working destination", n)
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// TestBatchWriterLingers writes events 50 µs apart, as requests under load end, and waits for
// them all without Close: they arrive in a few writes, not one each (as they did when the writer
// wrote whatever was pending as soon as it woke), and none waits for a later event or for Close.
func TestBatchWriterLingers(t *testing.T) {
	const events, apart = 200, 50 * time.Microsecond
	sink := &lineSink{want: events, all: make(chan struct{})}
	w := newBatchWriter(sink)
	defer w.Close()
	line := []byte(strings.Repeat("x", 100) + "\n")
	for range events {
		w.Write(line)
		for start := time.Now(); time.Since(start) < apart; { // the time a request takes
		}
	}
	select {
	case <-sink.all:
	case <-time.After(10 * time.Second):
		t.Fatalf("%d of %d events written without Close", sink.lines(), events)
	}
	if n := sink.writeCount(); n > events/10 {
		t.Errorf("%d writes for %d events %v apart", n, events, apart)
	}
}

// lineSink counts lines and writes, and closes all when want lines have arrived.
type lineSink struct {
	mu        sync.Mutex
	n, writes int
	want      int
	all       chan struct{}
}

func (s *lineSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	before := s.n
	s.n += bytes.Count(p, []byte{'\n'})
	if before < s.want && s.n >= s.want {
		close(s.all)
	}
	return len(p), nil
}

func (s *lineSink) lines() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func (s *lineSink) writeCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writes
}
