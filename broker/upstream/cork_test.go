package upstream

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// writeRecorder is a connection that records its writes, one by one, and fails them with err.
type writeRecorder struct {
	net.Conn
	mu     sync.Mutex
	writes []string
	wrote  chan string
	err    error
	closed bool
}

func newWriteRecorder() *writeRecorder { return &writeRecorder{wrote: make(chan string, 16)} }

func (w *writeRecorder) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return 0, w.err
	}
	w.writes = append(w.writes, string(p))
	w.wrote <- string(p)
	return len(p), nil
}

func (w *writeRecorder) Close() error {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	return nil
}

func (w *writeRecorder) next(t *testing.T) string {
	t.Helper()
	select {
	case s := <-w.wrote:
		return s
	case <-time.After(5 * time.Second):
		t.Fatal("no write reached the connection")
		return ""
	}
}

// holdLong makes maxHold long for t: a test that counts joined writes must not see a held
// one released by its timer because the machine is busy.
func holdLong(t *testing.T) {
	old := maxHold
	maxHold = time.Minute
	t.Cleanup(func() { maxHold = old })
}

// A held write leaves with the next one, in one write, in order; the one after is on its own.
func TestCorkConnJoins(t *testing.T) {
	holdLong(t)
	rec := newWriteRecorder()
	c := newCorkConn(rec)
	defer c.Close()
	c.holdNext()
	for _, s := range []string{"headers|", "data|", "next"} {
		if n, err := c.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if got := rec.next(t); got != "headers|data|" {
		t.Fatalf("first write %q, want the held one joined to the next", got)
	}
	if got := rec.next(t); got != "next" {
		t.Fatalf("second write %q", got)
	}
	if c.joined != 1 {
		t.Errorf("joined %d, want 1", c.joined)
	}
}

// A held write that nothing follows leaves on its own (maxHold), and one too large to be
// joined by a copy still leaves with it, after it.
func TestCorkConnReleases(t *testing.T) {
	rec := newWriteRecorder()
	c := newCorkConn(rec)
	defer c.Close()
	c.holdNext()
	c.Write([]byte("alone"))
	if got := rec.next(t); got != "alone" {
		t.Fatalf("write %q, want the held one on its own", got)
	}
	c.holdNext()
	c.Write([]byte("small"))
	big := strings.Repeat("b", 4096)
	if n, err := c.Write([]byte(big)); n != len(big) || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	if got := rec.next(t) + rec.next(t); got != "small"+big {
		t.Fatalf("the two writes arrived as %d bytes, out of order or cut", len(got))
	}
}

// A held write that fails once released closes the connection, and the next write reports it.
func TestCorkConnReleaseFails(t *testing.T) {
	rec := newWriteRecorder()
	rec.err = errors.New("broken pipe")
	c := newCorkConn(rec)
	c.holdNext()
	c.Write([]byte("held"))
	c.release() // as the timer does; the timer's own call is TestCorkConnReleases'
	rec.mu.Lock()
	closed := rec.closed
	rec.mu.Unlock()
	if !closed {
		t.Fatal("the connection was not closed after its held write failed")
	}
	if _, err := c.Write([]byte("x")); err == nil {
		t.Fatal("a write after the held one failed succeeded")
	}
}

// Over HTTP/2, a request whose body is in memory sends its HEADERS and DATA frames in one
// write; one without a body holds nothing. The exchanges themselves are unchanged.
func TestClientH2JoinsHeadersAndBody(t *testing.T) {
	holdLong(t)
	srv, _ := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, r.Proto+" "+string(b))
	}), true, true)
	c := clientFor(t, srv)
	mustGet(t, c, srv.URL+"/", "HTTP/2.0 ")
	key := connKey{pool: testPool, origin: origin{https: true, addr: srv.Listener.Addr().String()}}
	c.mu.Lock()
	p := c.h2conns[key]
	c.mu.Unlock()
	if p == nil || len(p.conns) != 1 || p.conns[0].cork == nil {
		t.Fatal("the HTTP/2 connection has no corkConn under it")
	}
	cork := p.conns[0].cork
	cork.mu.Lock()
	before := cork.joined
	cork.mu.Unlock()
	mustGet(t, c, srv.URL+"/", "HTTP/2.0 ")
	cork.mu.Lock()
	if cork.joined != before {
		t.Errorf("a GET without a body joined writes (%d, then %d)", before, cork.joined)
	}
	cork.mu.Unlock()
	const posts = 5
	for i := range posts {
		body := strings.Repeat("x", i*1000+1)
		code, got := do(t, c, request(t, http.MethodPost, srv.URL+"/", strings.NewReader(body)))
		if code != 200 || got != "HTTP/2.0 "+body {
			t.Fatalf("POST = %d, %d bytes", code, len(got))
		}
	}
	cork.mu.Lock()
	defer cork.mu.Unlock()
	if cork.joined-before < posts {
		t.Errorf("%d writes joined over %d POSTs, want one each", cork.joined-before, posts)
	}
}
