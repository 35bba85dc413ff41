package broker

import (
	"net"
	"sync/atomic"
	"time"

	"github.com/capbroker/capbroker/broker/wire"
)

// tunnelIdleTimeout ends an opaque tunnel in which neither side sent anything for this long.
const tunnelIdleTimeout = 5 * time.Minute

// idleClock is an opaque tunnel's last activity, shared by its two directions: the tunnel
// ends when neither moved a byte for idle. Reads only stamp it (a clock read and an atomic
// store); each direction's read deadline is set when the direction starts and again only when
// it fires, to when the tunnel would then be idle. Resetting the deadline on every read, as
// the copy once did, costs each read a runtime timer update (the descriptor's lock and its
// timer's); paired against it, the tunnel carried about 3% more requests.
type idleClock struct {
	idle time.Duration
	last atomic.Int64 // monotonic nanoseconds since epoch of the last read that moved bytes
}

// epoch makes the clock's stamps monotonic (time.Since reads the monotonic clock): a wall
// clock stepped back cannot make the tunnel look busy, nor a stepped-forward one idle.
var epoch = time.Now()

func newIdleClock(idle time.Duration) *idleClock {
	c := &idleClock{idle: idle}
	c.touch()
	return c
}

func (c *idleClock) touch() { c.last.Store(int64(time.Since(epoch))) }

// remaining is how long until the tunnel is idle, if nothing moves meanwhile: <= 0 if it is.
func (c *idleClock) remaining() time.Duration {
	return c.idle - (time.Since(epoch) - time.Duration(c.last.Load()))
}

// copyHalf copies src to dst, counting the bytes in n, then half-closes dst so the other side
// sees EOF. It stops when the tunnel is idle (see idleClock): when its read deadline fires,
// the other direction's activity since moves the deadline on (a long download with a quiet
// client is not ended).
func copyHalf(dst, src net.Conn, n *atomic.Int64, clock *idleClock) {
	buf := make([]byte, 32<<10)
	_ = src.SetReadDeadline(time.Now().Add(clock.remaining()))
	for {
		k, err := src.Read(buf)
		if k > 0 {
			clock.touch()
			n.Add(int64(k))
			if _, werr := dst.Write(buf[:k]); werr != nil {
				break
			}
		}
		if isTimeout(err) {
			if left := clock.remaining(); left > 0 {
				_ = src.SetReadDeadline(time.Now().Add(left))
				continue
			}
		}
		if err != nil {
			break
		}
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	} else {
		_ = dst.Close()
	}
}

// tunnelSide is the agent's connection as an opaque tunnel reads and writes it: the socket
// below the admission's and the framing guard's wrappers, which have nothing to do once a
// tunnel is open (the guard passes a stream through after a CONNECT), so that a request's
// bytes do not pass three layers each way. Closing it closes the wrappers as before (the
// admission's slot is given back); it has no CloseWrite, as the wrappers have none.
func tunnelSide(c net.Conn) net.Conn {
	inner := c
	if ac, ok := inner.(*admittedConn); ok {
		inner = ac.Conn
	}
	if g, ok := inner.(*wire.Conn); ok {
		inner = g.Conn
	}
	if inner == c {
		return c
	}
	return bareConn{Conn: inner, outer: c}
}

type bareConn struct {
	net.Conn
	outer net.Conn
}

func (b bareConn) Close() error { return b.outer.Close() }
