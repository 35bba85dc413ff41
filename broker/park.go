package broker

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/capbroker/capbroker/broker/wire"
)

// parkingConn is an HTTP/1.1 tunnel's connection as net/http serves it, put aside whenever the
// agent leaves it idle. A net/http connection holds two 4 KiB buffers and a goroutine for as
// long as it lives, and an agent may keep many tunnels open and quiet for minutes. So once a
// response is finished and net/http waits for the next request with nothing of it read yet,
// the wait is refused (the read fails with errParked), net/http ends its connection, and the
// tunnel is parked: one goroutine waits for the next request's first byte on the tunnel's own
// connection, then hands the tunnel to net/http again, that byte first. A parked tunnel holds
// only its TLS connection and the framing guard's state.
//
// Nothing is lost by it: a read is refused only when net/http has finished as many responses
// as the guard has seen whole requests, and every byte the guard has passed belongs to one of
// them (wire.Conn.Between), so net/http holds no byte of a next request. The idle timeout
// still holds: the park reads under the deadline net/http set for the idle wait.
type parkingConn struct {
	*wire.Conn // the tunnel's connection, its framing checked
	srv        *http.Server
	end        func() // called once, when the tunnel has ended

	first    [1]byte // the next request's first byte, read by park
	hasFirst bool    // first is still to be returned to net/http

	linger time.Duration // how long a quiet tunnel stays with net/http before it is parked

	mu           sync.Mutex
	readDeadline time.Time // the last read deadline net/http set
	applied      time.Time // the read deadline the connection below has (see SetReadDeadline)
	reading      bool      // a read of the connection below is under way
	hijacked     bool      // net/http has handed the connection over (a WebSocket)
	// The background read net/http starts with every request (deferRead).
	bgWaiting  bool          // a background read waits, not yet on the connection
	bgAbort    chan struct{} // receives when net/http aborts it
	bgTimer    *time.Timer   // ends its wait
	bgDeferred int           // background reads that ended without touching the connection (tests)
	answered   int64         // responses finished on the tunnel: net/http went idle after each
	idle       bool          // net/http waits for a next request (StateIdle until StateActive)
	state      parkState
	draining   bool
	parks      int // times the tunnel was parked
	closeOnce  sync.Once

	onPark func() // for tests: called as park begins to wait
}

// newParkingConn serves conn with srv from now on, parking it between requests once it has
// been quiet for linger (at once when 0); end is called when the tunnel has ended.
func newParkingConn(conn net.Conn, srv *http.Server, linger time.Duration, end func()) *parkingConn {
	c := &parkingConn{Conn: wire.Guard(conn, framingRejection), srv: srv, linger: linger, end: end}
	srv.ConnState = c.onState
	return c
}

// parkAfter is how long an HTTP/1.1 tunnel with no request in it stays with net/http before
// it is parked. Requests that follow each other more closely (a busy client) keep their
// net/http connection; parking costs a new one, and its goroutine, when the next request
// comes.
const parkAfter = 100 * time.Millisecond

type parkState int

const (
	served    parkState = iota // net/http serves the tunnel
	detaching                  // a read was refused; net/http is ending its connection
	parked                     // park waits for the next request
	closed
)

// errParked is what net/http's idle read gets when the tunnel is put aside.
var errParked = errors.New("tunnel parked between requests")

// onState is srv.ConnState.
func (c *parkingConn) onState(_ net.Conn, s http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch s {
	case http.StateIdle:
		c.answered++
		c.idle = true
	case http.StateActive:
		c.idle = false
	case http.StateHijacked:
		c.hijacked = true
	}
}

// serve hands the tunnel to srv for as long as requests keep coming; srv runs it on its own
// goroutine.
func (c *parkingConn) serve() {
	l := &oneConnListener{conn: c}
	_ = c.srv.Serve(l)
	if !l.accepted() { // shut down before it began
		c.Close()
	}
}

func (c *parkingConn) Read(p []byte) (int, error) {
	if c.hasFirst {
		if len(p) == 0 {
			return 0, nil
		}
		c.hasFirst = false
		p[0] = c.first[0]
		return 1, nil
	}
	c.mu.Lock()
	if !c.idle || c.state != served || c.draining {
		if len(p) == 1 && !c.idle && !c.hijacked && c.state == served && !c.draining {
			return c.deferRead(p) // unlocks
		}
		return c.readLocked(p)
	}
	if requests, between := c.Conn.Between(); !between || requests != c.answered {
		return c.readLocked(p)
	}
	// net/http waits for the next request, and holds nothing of it. The tunnel stays with
	// net/http while requests follow closely; it is parked once it has been quiet for
	// c.linger, or when net/http's own deadline comes first.
	wanted := c.readDeadline
	if c.linger > 0 {
		lingerEnd := time.Now().Add(c.linger)
		if !wanted.IsZero() && wanted.Before(lingerEnd) {
			return c.readLocked(p) // the idle timeout ends it first
		}
		// Read under lingerEnd; the next read applies net/http's own deadline again.
		c.applyLocked(lingerEnd)
		c.reading = true
		c.mu.Unlock()
		n, err := c.Conn.Read(p)
		c.mu.Lock()
		c.reading = false
		if !errors.Is(err, os.ErrDeadlineExceeded) || n > 0 {
			c.mu.Unlock()
			return n, err
		}
	}
	c.state = detaching
	c.mu.Unlock()
	return 0, errParked
}

// readLocked reads the connection below under net/http's read deadline; c.mu is held, and
// released.
func (c *parkingConn) readLocked(p []byte) (int, error) {
	c.applyLocked(c.readDeadline)
	c.reading = true
	c.mu.Unlock()
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	c.reading = false
	c.mu.Unlock()
	return n, err
}

// applyLocked gives the connection below the read deadline t, unless it has it; c.mu is held.
func (c *parkingConn) applyLocked(t time.Time) {
	if !t.Equal(c.applied) {
		_ = c.Conn.SetReadDeadline(t)
		c.applied = t
	}
}

// bgReadDelay is how long net/http's background read waits before it reads the connection.
const bgReadDelay = 5 * time.Millisecond

// deferRead is net/http's background read, the one-byte read it starts once a request has
// been read and aborts (with a read deadline in the past) when its response is done. It is how
// a request learns that its agent went away (the read fails, and the request's context ends),
// and it costs a read that finds nothing, a wake-up and two deadlines on the connection for
// every request. Most responses are done within bgReadDelay: the read waits that long for its
// abort before it reads the connection, and is aborted without touching it. A request that
// takes longer learns that its agent went away bgReadDelay later than it would have. c.mu is
// held, and released.
func (c *parkingConn) deferRead(p []byte) (int, error) {
	if d := c.readDeadline; !d.IsZero() && !d.After(time.Now()) {
		// Aborted before it began (the response was quicker than the read's goroutine): a
		// read would fail at once.
		c.bgDeferred++
		c.mu.Unlock()
		return 0, os.ErrDeadlineExceeded
	}
	c.bgWaiting = true
	if c.bgAbort == nil {
		c.bgAbort = make(chan struct{}, 1)
		c.bgTimer = time.NewTimer(bgReadDelay)
	} else {
		c.bgTimer.Reset(bgReadDelay)
	}
	c.mu.Unlock()
	select {
	case <-c.bgAbort:
		c.bgTimer.Stop()
		c.mu.Lock()
		c.bgDeferred++
		c.mu.Unlock()
		return 0, os.ErrDeadlineExceeded // what net/http expects of an aborted read
	case <-c.bgTimer.C:
	}
	c.mu.Lock()
	c.bgWaiting = false
	select {
	case <-c.bgAbort: // aborted as the wait ended
		c.bgDeferred++
		c.mu.Unlock()
		return 0, os.ErrDeadlineExceeded
	default:
	}
	return c.readLocked(p)
}

// SetReadDeadline is net/http's deadline for reading, kept so that it holds while the tunnel
// lingers or is parked. net/http sets one several times a request (for the header, the body,
// the background read and its abort, the idle wait), mostly with no read between them; each
// would go down through the TLS connection, the framing guard and the socket's timers. It is
// given to the connection below when a read is under way, else by the next read, and only when
// it differs from the one the connection has. An abort of a background read that has not
// touched the connection (deferRead) ends it without reaching the connection at all.
func (c *parkingConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readDeadline = t
	if c.bgWaiting && !t.IsZero() && !t.After(time.Now()) {
		c.bgWaiting = false
		c.bgAbort <- struct{}{}
		return nil
	}
	if c.reading {
		c.applyLocked(t)
	}
	return nil
}

func (c *parkingConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readDeadline, c.applied = t, t
	return c.Conn.SetDeadline(t)
}

// Close is net/http ending its connection: after a refused read, the tunnel is parked;
// otherwise it ends.
func (c *parkingConn) Close() error {
	c.mu.Lock()
	if c.state == detaching && !c.draining {
		c.state = parked
		c.mu.Unlock()
		go c.park()
		return nil
	}
	c.state = closed
	c.mu.Unlock()
	return c.close()
}

// close ends the tunnel: the connection is closed and end called, once.
func (c *parkingConn) close() error {
	var err error
	c.closeOnce.Do(func() {
		err = c.Conn.Close()
		c.end()
	})
	return err
}

// park waits for the next request's first byte, then serves the tunnel again.
func (c *parkingConn) park() {
	c.mu.Lock()
	c.parks++
	wanted := c.readDeadline
	c.mu.Unlock()
	if c.onPark != nil {
		c.onPark()
	}
	c.mu.Lock()
	c.applied = wanted
	c.mu.Unlock()
	n, err := 0, c.Conn.SetReadDeadline(wanted) // the lingering read's deadline has passed
	for n == 0 && err == nil {
		n, err = c.Conn.Read(c.first[:])
	}
	c.mu.Lock()
	if err != nil || c.draining || c.state != parked {
		c.state = closed
		c.mu.Unlock()
		_ = c.close()
		return
	}
	c.state, c.idle, c.hasFirst = served, false, true
	c.mu.Unlock()
	c.serve()
}

// Shutdown ends a parked tunnel at once and lets srv finish a served one.
func (c *parkingConn) Shutdown(ctx context.Context) error {
	c.mu.Lock()
	c.draining = true
	isParked := c.state == parked
	c.mu.Unlock()
	if isParked {
		_ = c.close() // the park's read fails, and it finds the tunnel closed
	}
	return c.srv.Shutdown(ctx)
}
