package http1

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/capbroker/capbroker/internal/testkit"
)

// TestChunkInOneRecord: a streamed (chunked) body's chunk leaves in the TLS record of its
// framing, and what is written goes in whole records: a chunk whose framing and data fit a
// record is one record; a larger one full records, its few bytes over held for the next
// chunk or the end.
func TestChunkInOneRecord(t *testing.T) {
	defer func(d time.Duration) { tailDelay = d }(tailDelay)
	tailDelay = time.Hour // a held tail leaves with the next write, never on its own here
	agent, srvTLS, rc := testkit.RecordedTLS(t)
	rc.Count()

	const fits = recordSize - len("3ff8\r\n") - len("\r\n") // the largest chunk one record holds
	sizes := []int{fits, fits, 100, recordSize, 2 * recordSize}
	steps := make(chan []int, len(sizes)+2)
	s := &Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("start"))
		w.(http.Flusher).Flush()
		steps <- rc.Take()
		for _, n := range sizes {
			w.Write(bytes.Repeat([]byte{'x'}, n))
			w.(http.Flusher).Flush()
			steps <- rc.Take()
		}
	}), IdleTimeout: time.Minute, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10}
	c := s.NewConn(srvTLS, func() {})
	go c.Serve()
	defer agent.Close()
	if _, err := io.WriteString(agent, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	done := make(chan []byte, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(agent), nil)
		if err != nil {
			done <- nil
			return
		}
		b, _ := io.ReadAll(resp.Body)
		done <- b
	}()
	// Each step's records, and the records of the response's end.
	want := [][]int{
		nil,                       // the head and "start": one record, of a length of the header's
		{recordSize},              // a chunk that fits
		{recordSize},              // again
		{100 + len("64\r\n\r\n")}, // a small one: flushed at once
		{recordSize},              // a record's worth: whole records, the tail held for the next
		{recordSize, recordSize},
	}
	for i, w := range want {
		got := <-steps
		if i == 0 {
			if len(got) != 1 {
				t.Errorf("the head and the first chunk: records %v, want one", got)
			}
			continue
		}
		if !slicesEqual(got, w) {
			t.Errorf("step %d (%d bytes): records %v, want %v", i, sizes[i-1], got, w)
		}
	}
	body := <-done
	if want := 5 + 2*fits + 100 + 3*recordSize; len(body) != want {
		t.Fatalf("body of %d bytes, want %d", len(body), want)
	}
	// The tails held (the framing of the last two chunks, a record's worth of data each)
	// left with the chunked end.
	if got, want := rc.Take(), []int{len("4000\r\n\r\n") + len("8000\r\n\r\n") + len("0\r\n\r\n")}; !slicesEqual(got, want) {
		t.Errorf("the end: records %v, want %v", got, want)
	}
}

func slicesEqual(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestHeldTailSent: a tail held back by a flush reaches the agent on its own when no write
// follows (the upstream paused after a large chunk): the handler waits, after writing and
// flushing a record's worth, until the agent has read all of it.
func TestHeldTailSent(t *testing.T) {
	read := make(chan struct{})
	s := &Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(bytes.Repeat([]byte{'y'}, 2*recordSize))
		w.(http.Flusher).Flush()
		select {
		case <-read:
		case <-time.After(10 * time.Second):
			t.Error("the agent did not get the chunk's last bytes: its tail was held")
		}
		w.Write([]byte("end"))
	})}
	sv := serve(t, s)
	if _, err := io.WriteString(sv.agent, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(sv.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 2*recordSize)
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatal(err)
	}
	close(read)
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "end" {
		t.Fatalf("after the chunk: %q, %v", rest, err)
	}
}

// TestHeldTailWaitsForLastHold: a download holds a tail after every chunk, and the timer is
// not moved each time (that wakes the runtime's poller): it fires at the first hold's
// deadline, finds a later hold's deadline ahead, and waits for that one. Firing early
// leaves the tail held; firing at the deadline sends it.
func TestHeldTailWaitsForLastHold(t *testing.T) {
	defer func(d time.Duration) { tailDelay = d }(tailDelay)
	tailDelay = time.Hour // the timer itself never fires here: the test calls it
	held := func(r *response) int {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.c.bw.Buffered()
	}
	failures := make(chan string, 4)
	s := &Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		defer close(failures)
		r := w.(*writer).r
		for range 2 { // a record each: the agent reads only after the handler
			w.Write(bytes.Repeat([]byte{'y'}, recordSize))
			w.(http.Flusher).Flush()
		}
		if held(r) == 0 {
			failures <- "no tail held after a chunk"
			return
		}
		r.sendTail() // early: the last hold's deadline is an hour away
		if held(r) == 0 {
			failures <- "the timer sent the tail before the last hold's deadline"
		}
		r.mu.Lock()
		armed := r.tail.Armed()
		r.tail.Set(-time.Millisecond, r.sendTail) // the deadline has passed (armed: no timer moved)
		r.mu.Unlock()
		if !armed {
			failures <- "the timer was not armed again for the last hold's deadline"
		}
		r.sendTail() // at the deadline
		if n := held(r); n != 0 {
			failures <- fmt.Sprintf("%d bytes still held after the deadline", n)
		}
	})}
	sv := serve(t, s)
	if _, err := io.WriteString(sv.agent, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	for f := range failures {
		t.Error(f)
	}
	resp, err := http.ReadResponse(sv.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := io.Copy(io.Discard, resp.Body); err != nil || n != 2*recordSize {
		t.Fatalf("body: %d bytes, %v", n, err)
	}
}
