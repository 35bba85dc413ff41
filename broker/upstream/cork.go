package upstream

import (
	"net"
	"sync"
	"time"
)

// corkConn is the TCP connection under an upstream TLS connection that may carry HTTP/2. It
// can hold one write back until the next one, so that both leave in one system call.
//
// net/http's HTTP/2 client flushes a request's HEADERS frame on its own, then its DATA: two
// TLS records, each in a write of its own, where an HTTP/1.1 request with a small body leaves
// in one. On a machine where a system call is dear that second write is a good part of what an
// HTTP/2 upstream costs more per request. The broker knows when a request's body is in memory
// and follows at once; it then holds the connection's next write (holdNext), which the next
// write, or maxHold, releases. Writes stay in order and whole: what is held goes out first,
// with or before whatever is written next. A write held and then failing in the timer's hands
// closes the connection, and the next write reports the error.
type corkConn struct {
	net.Conn
	mu    sync.Mutex
	hold  bool   // hold the next write
	held  []byte // a write held back, sent before the next one
	timer *time.Timer
	wait  time.Duration // maxHold when it was made
	err   error         // a held write that failed
	// joined counts the writes that left with a held one (tests).
	joined int
}

// maxHold bounds how long a write is held: it goes when no other write has come by then (a
// body whose bytes are late, a stream waiting for flow control). A variable for tests, which
// make it long where a loaded machine could otherwise let it pass between two writes.
var maxHold = 200 * time.Microsecond

func newCorkConn(c net.Conn) *corkConn {
	cc := &corkConn{Conn: c, wait: maxHold}
	cc.timer = time.AfterFunc(time.Hour, cc.release)
	cc.timer.Stop()
	return cc
}

// holdNext makes the next write wait for the one after it, for up to maxHold.
func (c *corkConn) holdNext() {
	c.mu.Lock()
	c.hold = true
	c.mu.Unlock()
}

func (c *corkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if c.hold && c.held == nil {
		c.hold = false
		c.held = append(make([]byte, 0, len(p)+512), p...) // room for a DATA record behind
		c.timer.Reset(c.wait)
		return len(p), nil
	}
	if c.held == nil {
		return c.Conn.Write(p)
	}
	c.timer.Stop()
	held := c.held
	c.held = nil
	c.joined++
	if len(held)+len(p) <= cap(held) {
		_, err := c.Conn.Write(append(held, p...))
		if err != nil {
			return 0, err
		}
		return len(p), nil
	}
	bufs := net.Buffers{held, p}
	n, err := bufs.WriteTo(c.Conn)
	return max(int(n)-len(held), 0), err
}

// release sends a held write that nothing followed in time.
func (c *corkConn) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held == nil {
		return
	}
	held := c.held
	c.held = nil
	if _, err := c.Conn.Write(held); err != nil {
		c.err = err
		_ = c.Conn.Close()
	}
}

func (c *corkConn) Close() error {
	c.timer.Stop()
	return c.Conn.Close()
}
