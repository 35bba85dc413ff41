// Package http1 serves HTTP/1.1 on one connection the broker has intercepted, the way the
// bench's relay does: each request is read, handled and answered on the connection's own
// goroutine, with nothing handed to another goroutine on the way.
//
// net/http's server does more per request than a tunnel needs, and pays for it on every one:
// a background read goroutine started with each request to learn whether the client went away
// (a goroutine, a timer and a wake-up; with the read deadlines that start and abort it), a
// context chain per connection and request, and a connection object that holds two buffers
// and a goroutine for as long as the connection lives. An agent's tunnel carries one client's
// requests to one host, behind the framing guard (broker/wire): this package keeps what a
// tunnel needs of net/http's server and no more.
//
//   - Requests are parsed by net/http (http.ReadRequest) and checked as net/http's server
//     checks them (one valid Host, valid header names and values, Expect), with its limits
//     (ReadHeaderTimeout, IdleTimeout, MaxHeaderBytes) and its answers to what fails them
//     (400, 431, 417, 505).
//   - Responses are framed as net/http's server frames them: a Content-Length the handler set,
//     else one computed for a short body written at once, else chunked (close-delimited for
//     HTTP/1.0), trailers after a chunked body, no body for HEAD, 1xx, 204 and 304, a Date.
//   - A request's context ends when the agent goes away, as with net/http, but the read that
//     notices is started only for a request that is still being handled after watchDelay:
//     almost every response is finished sooner, and costs a timer reset and stop.
//   - A connection's requests share one context while none is cancelled, rather than one
//     made and cancelled per request: it is cancelled, and replaced for the next request, when
//     the agent goes away, and when the connection ends, is parked or hijacked. A handler
//     must stop what it registered on it before it returns (see requestContext).
//   - A connection's responses reuse one response and its header map, reset for each request;
//     a handler's writer and request body fail once its request is over (net/http: a
//     ResponseWriter may not be used after the handler has returned), rather than reach the
//     next request's response.
//   - Between requests a quiet connection is parked: after Linger with nothing of the next
//     request read, its goroutine ends and its buffers go back to a pool; one small goroutine
//     waits for the next request's first byte and serves it with fresh ones.
//   - Hijack hands the connection over (a WebSocket); Shutdown ends an idle or parked
//     connection at once and lets a busy one finish its response.
package http1

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Server holds the settings of the connections it serves.
type Server struct {
	Handler           http.Handler
	ReadHeaderTimeout time.Duration // from a request's first byte to the end of its head
	IdleTimeout       time.Duration // how long a connection waits for its next request
	MaxHeaderBytes    int           // the request line and header fields, at most
	// Linger is how long a connection with no request in it keeps its goroutine and buffers
	// before it is parked; 0 parks it as soon as a response is done.
	Linger time.Duration
	// BaseContext, when set, is the parent of the requests' contexts (context.Background
	// otherwise): what it carries, every request of the connection carries.
	BaseContext context.Context

	onWatch func() // tests: called as the watch begins to read (see watchAgent)
}

// maxDrain bounds what is read of a request body the handler left unread, to keep the
// connection for the next request (as net/http's server does, 256 KiB); with more, the
// connection is closed after the response.
const maxDrain = 256 << 10

// errHeaderTooLarge is the head read failing on MaxHeaderBytes.
var errHeaderTooLarge = errors.New("http1: request header too large")

// Conn is one connection served by a Server.
type Conn struct {
	s      *Server
	raw    net.Conn // the connection, as the caller gave it (the framing guard's)
	end    func()   // called once, when the connection has ended
	remote string   // raw's RemoteAddr, for each request

	src source
	br  *bufio.Reader // nil while parked
	bw  *bufio.Writer // nil while parked
	// ctx is the context of the connection's requests (see requestContext), or nil; only
	// the serving goroutine reads and sets it.
	ctx context.Context
	// resp is the response to the connection's requests, reset for each (see newWriter), or
	// nil; only the serving goroutine sets it.
	resp *response

	// The watch for an agent that went away during a long request (see watch.go).
	watchFrom  atomic.Int64 // when the request could be watched (read whole), or 0: not watchable
	watchEnded chan struct{}
	watchFn    func() // c.watchAgent

	mu         sync.Mutex
	idle       bool // waiting for the next request (or parked)
	draining   bool
	watchOn    bool // the watch was started for this request
	hijacked   bool
	watchRead  bool               // the watch is reading the connection
	abortWatch bool               // the request is done: the watch must end
	cancel     context.CancelFunc // ctx's
	parks      int
	closeOnce  sync.Once
	done       chan struct{} // closed when the connection has ended
	onPark     func()        // tests: called as a park begins to wait
}

// NewConn returns c served by s once Serve is called; end is called once, when it has ended
// (closed, or closed by whoever hijacked it).
func (s *Server) NewConn(c net.Conn, end func()) *Conn {
	conn := &Conn{s: s, raw: c, end: end, done: make(chan struct{}), watchEnded: make(chan struct{}, 1)}
	conn.src.conn = c
	conn.src.limit = -1
	conn.watchFn = conn.watchAgent
	return conn
}

// Serve serves requests until the connection ends, is hijacked, or is parked (then it returns
// at once, and the connection is served again, on a goroutine of its own, when its next
// request begins).
func (c *Conn) Serve() {
	if c.br == nil {
		c.br, c.bw = getBuffers(&c.src, c.raw)
	}
	watched.add(c)
	defer watched.remove(c)
	for {
		o := c.serveOne()
		if o != next {
			c.endContext() // nothing of the last request runs on
		}
		switch o {
		case next:
			continue
		case park:
			c.park()
			return
		case hijacked:
			c.putBuffers()
			return
		default:
			c.putBuffers()
			c.close()
			return
		}
	}
}

type outcome int

const (
	next     outcome = iota // keep serving
	park                    // nothing of the next request arrived within Linger
	hijacked                // the handler took the connection
	closing                 // the connection ends
)

// serveOne waits for a request, serves it, and says what comes next.
func (c *Conn) serveOne() outcome {
	if !c.goIdle() {
		return closing
	}
	c.releaseWriter()
	if o := c.waitRequest(); o != next {
		return o
	}
	c.takeWriter()
	c.src.setDeadline(time.Now().Add(c.s.ReadHeaderTimeout))
	c.src.limit = int64(c.s.MaxHeaderBytes) + 4096 // net/http's allowance beyond the limit
	req, err := http.ReadRequest(c.br)
	tooLarge := c.src.limit == 0
	c.src.limit = -1
	c.src.setDeadline(time.Time{})
	if err != nil {
		switch {
		case tooLarge:
			c.reject(http.StatusRequestHeaderFieldsTooLarge, "431 Request Header Fields Too Large")
		case errors.Is(err, io.EOF) || isTimeout(c.src.err) || errors.Is(c.src.err, net.ErrClosed):
			// the agent left, or stopped half way through a head (net/http may then see
			// the part it read as a malformed head: the read's own error says which)
		default:
			c.reject(http.StatusBadRequest, "400 Bad Request")
		}
		return closing
	}
	c.setIdle(false)
	if status, text := check(req); status != 0 {
		c.reject(status, text)
		return closing
	}
	return c.handle(req)
}

// goIdle marks the connection as waiting for a request, which a drain ends at once (see
// Shutdown); it reports false when a drain has begun.
func (c *Conn) goIdle() bool {
	c.mu.Lock()
	draining := c.draining
	c.idle = true
	c.mu.Unlock()
	return !draining
}

// waitRequest waits for the next request's first byte for up to Linger (or the idle timeout,
// when that comes first): next when it is there, park when Linger passed without it, closing
// when the connection ended or the idle timeout passed.
func (c *Conn) waitRequest() outcome {
	if c.br.Buffered() > 0 || c.src.hasByte { // pipelined, or put back by a park or the watch
		return next
	}
	now := time.Now()
	idleEnd := now.Add(c.s.IdleTimeout)
	lingerEnd := now.Add(c.s.Linger)
	switch {
	case c.s.Linger <= 0:
	case !lingerEnd.Before(idleEnd): // the idle timeout ends the wait first
		c.src.setDeadline(idleEnd)
		if _, err := c.br.Peek(1); err != nil {
			return closing
		}
		return next
	default:
		// A deadline set for an earlier wait serves when it ends at least half a Linger
		// from now: a busy connection then sets one every Linger/2, not one per request
		// (each a change to the socket's timer, and on a quiet machine a wake-up of the
		// network poller).
		if a := c.src.applied; a.After(now.Add(c.s.Linger/2)) && !a.After(lingerEnd) {
			lingerEnd = a
		}
		c.src.setDeadline(lingerEnd)
		_, err := c.br.Peek(1)
		if err == nil {
			return next
		}
		if !isTimeout(err) {
			return closing
		}
	}
	c.src.setDeadline(idleEnd) // the park's read
	return park
}

// park gives the buffers back and waits, on a small goroutine of its own, for the next
// request's first byte; then the connection is served again.
func (c *Conn) park() {
	c.putBuffers()
	c.resp = nil // a parked connection holds little
	c.mu.Lock()
	c.parks++
	draining := c.draining
	c.mu.Unlock()
	if draining {
		c.close()
		return
	}
	go func() {
		if c.onPark != nil {
			c.onPark()
		}
		var first [1]byte
		n, err := 0, error(nil)
		for n == 0 && err == nil {
			n, err = c.src.Read(first[:])
		}
		c.mu.Lock()
		draining := c.draining
		c.mu.Unlock()
		if err != nil || draining {
			c.close()
			return
		}
		c.src.unread(first[0])
		c.Serve()
	}()
}

func (c *Conn) setIdle(idle bool) {
	c.mu.Lock()
	c.idle = idle
	c.mu.Unlock()
}

// Shutdown ends the connection at once when it waits for a request, or after the response it
// is writing; it returns when the connection has ended, or with ctx's error.
func (c *Conn) Shutdown(ctx context.Context) error {
	c.mu.Lock()
	c.draining = true
	idle := c.idle
	c.mu.Unlock()
	if idle {
		c.close()
	}
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Parks reports how many times the connection was parked.
func (c *Conn) Parks() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.parks
}

// close ends the connection: closed, end called, Shutdown released; once.
func (c *Conn) close() {
	c.closeOnce.Do(func() {
		_ = c.raw.Close()
		c.end()
		close(c.done)
	})
}

// reject answers a request that could not be read or was refused before any handler saw it,
// and the connection ends.
func (c *Conn) reject(status int, text string) {
	_ = c.raw.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = io.WriteString(c.bw, "HTTP/1.1 "+text+"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"+text)
	if c.bw.Flush() != nil {
		return
	}
	// What the agent sent after is read (for a while, up to a bound) before the connection
	// is closed: closing it with bytes unread would reset it, and the agent could lose the
	// answer before reading it (net/http's server waits likewise).
	if cw, ok := c.raw.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	c.src.setDeadline(time.Now().Add(rejectLinger))
	_, _ = io.Copy(io.Discard, io.LimitReader(c.br, maxDrain))
}

// rejectLinger is how long a refused request's connection is read before it is closed.
const rejectLinger = 500 * time.Millisecond

var (
	readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4<<10) }}
	writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, recordSize) }}
)

// recordSize is the writer's size: the most plaintext one TLS record carries. A chunk of a
// streamed body is written with its framing into it and flushed, so that the framing leaves in
// the record of the data it frames (with a 4 KiB writer, a 16 KiB chunk left as three records:
// 4 KiB with its size line, the rest, and its closing CRLF), and what the writer hands the
// TLS connection between flushes is whole records. A parked connection holds no writer.
const recordSize = 16 << 10

func getBuffers(r io.Reader, w io.Writer) (*bufio.Reader, *bufio.Writer) {
	br, bw := readers.Get().(*bufio.Reader), writers.Get().(*bufio.Writer)
	br.Reset(r)
	bw.Reset(w)
	return br, bw
}

func (c *Conn) putBuffers() {
	if c.br == nil {
		return
	}
	c.br.Reset(nil)
	readers.Put(c.br)
	c.br = nil
	c.releaseWriter()
}

// releaseWriter gives the writer back while the connection waits for a request: it is a
// record's size, and a connection kept alive between requests needs none (takeWriter).
func (c *Conn) releaseWriter() {
	if c.bw == nil {
		return
	}
	c.bw.Reset(nil)
	writers.Put(c.bw)
	c.bw = nil
}

// takeWriter gives the connection a writer for the request that has begun.
func (c *Conn) takeWriter() {
	if c.bw == nil {
		c.bw = writers.Get().(*bufio.Writer)
		c.bw.Reset(c.raw)
	}
}

// source is what the connection's reader reads: the connection, with a byte put back by a
// park, a limit for the head, and read deadlines that reach the connection only when a read
// needs them. A request sets several (the head's, none for the body, the wait for the next
// one) and most are never read under: each would go down through TLS, the framing guard and
// the socket's timers.
type source struct {
	conn    net.Conn
	want    time.Time // the deadline the next read is to have
	applied time.Time // the deadline the connection has
	limit   int64     // bytes that may still be read, or -1
	pending byte
	hasByte bool
	err     error // the last read's
}

func (s *source) setDeadline(t time.Time) { s.want = t }

// unread puts b back, to be read first.
func (s *source) unread(b byte) { s.pending, s.hasByte = b, true }

func (s *source) Read(p []byte) (int, error) {
	if s.limit == 0 {
		return 0, io.EOF
	}
	if s.limit > 0 && int64(len(p)) > s.limit {
		p = p[:s.limit]
	}
	if s.hasByte && len(p) > 0 {
		s.hasByte = false
		p[0] = s.pending
		s.count(1)
		return 1, nil
	}
	if !s.want.Equal(s.applied) {
		if err := s.conn.SetReadDeadline(s.want); err != nil {
			return 0, err
		}
		s.applied = s.want
	}
	n, err := s.conn.Read(p)
	s.count(n)
	s.err = err
	return n, err
}

func (s *source) count(n int) {
	if s.limit > 0 {
		s.limit -= int64(n)
	}
}

func isTimeout(err error) bool {
	ne, ok := errors.AsType[net.Error](err) // no allocation, where errors.As's target escapes
	return ok && ne.Timeout()
}
