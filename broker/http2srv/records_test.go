package http2srv

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/capbroker/capbroker/internal/testkit"
)

// serveTLS serves h on one TLS connection whose records rc counts, and returns an HTTP/2
// client connection to it.
func serveTLS(t *testing.T, h http.Handler) (*http2.ClientConn, *testkit.RecordConn) {
	t.Helper()
	agent, srvTLS, rc := testkit.RecordedTLS(t, "h2")
	s := &Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 30 * time.Second, PingTimeout: 5 * time.Second,
		MaxHeaderBytes: 64 << 10, MaxConcurrentStreams: 100}
	go s.NewConn(srvTLS, func() {}).Serve()
	cc, err := (&http2.Transport{}).NewClientConn(agent)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	rc.Count()
	return cc, rc
}

// settle writes what the connection has pending and waits for any write under way: the
// reader's own frames of the connection's start may be in a write when a handler begins.
func settle(w http.ResponseWriter) {
	c := w.(*responseWriter).st.c
	c.wmu.Lock()
	c.flushLocked(true)
	c.wmu.Unlock()
}

// TestDataInWholeRecords: a body written and flushed a record at a time (a download streamed
// as it arrives) leaves in whole TLS records. A 16 KiB DATA frame is 9 bytes more than a
// record: each flush holds what is over for the next frame, where it went as a record of
// its own after every frame (a second write, and a record of 9 bytes).
func TestDataInWholeRecords(t *testing.T) {
	defer func(d time.Duration) { tailDelay = d }(tailDelay)
	tailDelay = time.Hour // a held tail leaves with the next frames, never on its own here
	const frames = 8
	var rc *testkit.RecordConn
	steps := make(chan []int, frames+1)
	cc, rc := serveTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("start"))
		w.(http.Flusher).Flush() // a small write: at once
		settle(w)
		steps <- rc.Take()
		for range frames {
			w.Write(bytes.Repeat([]byte{'x'}, writeSize))
			w.(http.Flusher).Flush()
			steps <- rc.Take()
		}
	}))
	req, _ := http.NewRequest("GET", "https://agent.test/", nil)
	resp, err := cc.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil || len(body) != len("start")+frames*writeSize {
		t.Fatalf("body: %d bytes, %v", len(body), err)
	}
	<-steps // the connection's start and "start": records of their own sizes
	for i := range frames {
		// Each frame's record: the one before held 9 bytes more each time, still short of a
		// record's worth here (8 frames: 72 bytes).
		if got := <-steps; !slices.Equal(got, []int{writeSize}) {
			t.Errorf("frame %d: records %v, want one of %d", i+1, got, writeSize)
		}
	}
	// The end: what was held, and the END_STREAM frame.
	end := rc.Take()
	if len(end) != 1 || end[0] != frames*9+9 {
		t.Errorf("the response's end: records %v, want one of %d", end, frames*9+9)
	}
}

// TestHeldTailSent: a tail held by a flush reaches the agent on its own when no write
// follows (the upstream paused after a large read): the handler waits, after writing and
// flushing two records' worth, until the agent has read all of it.
func TestHeldTailSent(t *testing.T) {
	read := make(chan struct{})
	cc, _ := serveTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(bytes.Repeat([]byte{'y'}, 2*writeSize))
		w.(http.Flusher).Flush()
		select {
		case <-read:
		case <-time.After(10 * time.Second):
			t.Error("the agent did not get the frame's last bytes: its tail was held")
		}
		w.Write([]byte("end"))
	}))
	req, _ := http.NewRequest("GET", "https://agent.test/", nil)
	resp, err := cc.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 2*writeSize)
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatal(err)
	}
	close(read)
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "end" {
		t.Fatalf("after the frames: %q, %v", rest, err)
	}
}

// TestHeldTailBeforeWindowWait: a writer that must wait for the agent's window first sends
// a held tail: the agent returns window only for frames it has whole, so a tail held then
// would leave both waiting (until the hold's delay, an hour here).
func TestHeldTailBeforeWindowWait(t *testing.T) {
	defer func(d time.Duration) { tailDelay = d }(tailDelay)
	tailDelay = time.Hour
	r, _ := dialRaw(t, testServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		for range 3 {
			w.Write(bytes.Repeat([]byte{'z'}, writeSize))
			w.(http.Flusher).Flush()
		}
	})))
	r.write(func() { r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: writeSize}) })
	r.headers(1, true, get...)
	got, updated := 0, false
	for got < 3*writeSize {
		f := r.next(func(f http2.Frame) bool { _, ok := f.(*http2.DataFrame); return ok })
		got += len(f.(*http2.DataFrame).Data())
		if got >= writeSize && !updated { // the stream's window is spent: open it
			updated = true
			r.write(func() { r.fr.WriteWindowUpdate(1, 4*writeSize) })
		}
		if f.Header().Flags.Has(http2.FlagDataEndStream) {
			break
		}
	}
	if got != 3*writeSize {
		t.Fatalf("%d bytes of DATA, want %d", got, 3*writeSize)
	}
}

// TestHeldTailWaitsForLastHold: a download holds a tail after every frame, and the timer is
// not moved each time (that wakes the runtime's poller): it fires at the first hold's
// deadline, finds a later hold's deadline ahead, and waits for that one. Firing early leaves
// the tail held; firing at the deadline sends it.
func TestHeldTailWaitsForLastHold(t *testing.T) {
	defer func(d time.Duration) { tailDelay = d }(tailDelay)
	tailDelay = time.Hour // the timer itself never fires here: the test calls it
	var c *Conn
	started := make(chan struct{})
	failures := make(chan string, 4)
	held := func() int {
		c.wmu.Lock()
		defer c.wmu.Unlock()
		return len(c.out.b)
	}
	r, conn := dialRaw(t, testServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		<-started
		defer close(failures)
		settle(w) // the client sends nothing more: no other write from here
		for range 2 {
			w.Write(bytes.Repeat([]byte{'y'}, writeSize))
			w.(http.Flusher).Flush()
		}
		if held() == 0 {
			failures <- "no tail held after a frame"
			return
		}
		c.sendTail() // early: the last hold's deadline is an hour away
		if held() == 0 {
			failures <- "the timer sent the tail before the last hold's deadline"
		}
		c.wmu.Lock()
		armed := c.tail.Armed()
		c.tail.Set(-time.Millisecond, c.sendTail) // the deadline has passed (armed: no timer moved)
		c.wmu.Unlock()
		if !armed {
			failures <- "the timer was not armed again for the last hold's deadline"
		}
		c.sendTail() // at the deadline
		if n := held(); n != 0 {
			failures <- fmt.Sprintf("%d bytes still held after the deadline", n)
		}
	})))
	c = conn
	close(started)
	r.headers(1, true, get...)
	for f := range failures {
		t.Error(f)
	}
	got := 0
	for got < 2*writeSize {
		f := r.next(func(f http2.Frame) bool { _, ok := f.(*http2.DataFrame); return ok })
		got += len(f.(*http2.DataFrame).Data())
	}
}
