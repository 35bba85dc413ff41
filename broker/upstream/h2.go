package upstream

// HTTP/2: a host whose TLS handshake negotiates h2 is served over http.ClientConns, pooled by
// pool and origin like HTTP/1.1 connections (never shared across pools), and dialled through
// the same checked Dialer and TLS configuration.

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"time"
)

// dialH2 is the Transport's TLS dialer, for the HTTP/2 connections of every pool: the
// connection dialConn handed over, if there is one (it has carried no request, so any pool may
// claim it), else a new one. A host that now answers http/1.1 is marked so, and the dial fails
// with errNotH2: the request goes over HTTP/1.1.
func (c *Client) dialH2(ctx context.Context, _, addr string) (net.Conn, error) {
	if v, ok := c.handoff.LoadAndDelete(handoffKey(routeName(ctx), addr)); ok {
		h := v.(handedOff)
		if time.Since(h.at) < maxHandoffAge {
			corkOf(ctx, h.Conn)
			viaSlotOf(ctx, h.via, h.inspected)
			return h.Conn, nil
		}
		_ = h.Close() // left over from a Prepare no request followed; the server may have closed it
	}
	raw, err := c.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	tc, inspected, err := c.handshakeVia(ctx, newCorkConn(raw), addr, []string{"h2", "http/1.1"}, viaOf(raw))
	if err != nil {
		return nil, err
	}
	if tc.ConnectionState().NegotiatedProtocol != "h2" {
		c.h2hosts.Delete(addr)
		_ = tc.Close()
		return nil, errNotH2
	}
	corkOf(ctx, tc)
	viaSlotOf(ctx, viaOf(raw), inspected)
	return tc, nil
}

// handoffKey keys the handed-off connections by route too: a connection dialled through one
// proxy never serves a request routed through another.
func handoffKey(route, addr string) string { return route + "\x00" + addr }

// viaSlot is where dialH2 leaves the proxy its connection went through, and whether its
// origin was trusted through the TLS-inspection CA, for dialH2Conn.
type viaSlot struct{}

// way is what a viaSlot holds.
type way struct {
	via       string
	inspected bool
}

func viaSlotOf(ctx context.Context, via string, inspected bool) {
	if slot, _ := ctx.Value(viaSlot{}).(*way); slot != nil {
		*slot = way{via, inspected}
	}
}

// corkSlot is where dialH2 leaves the corkConn under the connection it dialled, for
// dialH2Conn, which passes it in the dial's context.
type corkSlot struct{}

// corkOf puts the corkConn under the TLS connection c, if it has one, in ctx's corkSlot.
func corkOf(ctx context.Context, c net.Conn) {
	slot, _ := ctx.Value(corkSlot{}).(**corkConn)
	if tc, ok := c.(*tls.Conn); ok && slot != nil {
		*slot, _ = tc.NetConn().(*corkConn)
	}
}

// handedOff is an h2 connection waiting for an HTTP/2 dial, since when.
type handedOff struct {
	net.Conn
	at        time.Time
	via       string
	inspected bool
}

// maxHandoffAge is how long a handed-off connection is kept for an HTTP/2 dial. The request
// that dialled it takes it at once; one from a Prepare waits for the agent's first request.
const maxHandoffAge = 5 * time.Second

// h2Conns are one pool's HTTP/2 connections to one host.
type h2Conns struct {
	conns   []*h2Conn
	dialing chan struct{} // closed when the pool's dial under way ends; nil when there is none
}

// h2Conn is one of them. Its fields are guarded by Client.mu.
type h2Conn struct {
	cc      *http.ClientConn
	cork    *corkConn // under its TLS; nil if it has none
	idle    bool      // no request in flight: counted in Client.nidle
	removed bool      // out of the pool (closed, or about to be): not to be reserved
	via     string    // the upstream proxy it goes through
	// inspected: its origin's certificate verified only through the TLS-inspection CA.
	inspected bool
}

// roundTripH2 sends req over HTTP/2, on a connection of pool. It returns errNotH2, with req
// untouched, when the host turned out to speak HTTP/1.1 only.
func (c *Client) roundTripH2(req *http.Request, pool Pool, addr string) (*http.Response, error) {
	e, err := c.reserveH2(req.Context(), connKey{pool: pool, origin: origin{https: true, addr: addr, route: routeName(req.Context())}}, addr)
	if err != nil {
		if !errors.Is(err, errNotH2) {
			closeBody(req)
		}
		return nil, err
	}
	RouteOf(req.Context()).setWay(e.via, e.inspected)
	if e.cork != nil && bodyFollows(req) {
		// Its HEADERS frame is flushed on its own, its DATA at once after: both in one write.
		e.cork.holdNext()
	}
	return e.cc.RoundTrip(req) // consumes the reservation
}

// bodyFollows reports whether req's body is in memory (it can be replayed) and is sent right
// after its header, with no 100-continue to wait for.
func bodyFollows(req *http.Request) bool {
	return req.ContentLength > 0 && req.GetBody != nil && req.Header.Get("Expect") == ""
}

// reserveH2 reserves a stream on one of key's HTTP/2 connections, dialling one when none has
// room. A request that finds another's dial for key under way waits for it rather than dial a
// second connection beside it.
func (c *Client) reserveH2(ctx context.Context, key connKey, addr string) (*h2Conn, error) {
	for {
		c.mu.Lock()
		var buf [4]*h2Conn
		room := buf[:0]
		p := c.h2conns[key]
		if p == nil {
			p = &h2Conns{}
			c.h2conns[key] = p
		}
		for _, e := range p.conns {
			if e.cc.Available() > 0 {
				room = append(room, e)
			}
		}
		dialing := p.dialing
		if len(room) == 0 && dialing == nil {
			p.dialing = make(chan struct{})
		}
		c.mu.Unlock()

		for _, e := range room {
			if c.reserve(e) {
				return e, nil
			}
		}
		if len(room) > 0 {
			continue // each was taken meanwhile: look again
		}
		if dialing != nil {
			select {
			case <-dialing:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		e, err := c.dialH2Conn(ctx, key, p, addr)
		if err != nil {
			return nil, err
		}
		if !c.reserve(e) {
			return nil, errors.New("upstream HTTP/2 connection unusable before its first request")
		}
		return e, nil
	}
}

// dialH2Conn makes a new HTTP/2 connection for key, whose dial p.dialing announces, and adds
// it to p.
func (c *Client) dialH2Conn(ctx context.Context, key connKey, p *h2Conns, addr string) (*h2Conn, error) {
	var cork *corkConn
	var w way
	cc, err := c.h2.NewClientConn(context.WithValue(context.WithValue(ctx, corkSlot{}, &cork), viaSlot{}, &w), "https", addr)
	c.mu.Lock()
	close(p.dialing)
	p.dialing = nil
	var e *h2Conn
	if err == nil {
		e = &h2Conn{cc: cc, cork: cork, via: w.via, inspected: w.inspected}
		p.conns = append(p.conns, e)
	} else if len(p.conns) == 0 && c.h2conns[key] == p {
		delete(c.h2conns, key)
	}
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	cc.SetStateHook(func(*http.ClientConn) { c.h2StateChanged(key, e) })
	return e, nil
}

// reserve reserves a stream on e, unless e has left the pool meanwhile.
func (c *Client) reserve(e *h2Conn) bool {
	if e.cc.Reserve() != nil {
		return false
	}
	c.mu.Lock()
	removed := e.removed
	if !removed && e.idle {
		e.idle = false
		c.nidle--
	}
	c.mu.Unlock()
	if removed {
		e.cc.Release()
		return false
	}
	return true
}

// h2StateChanged is e's state hook: a connection that closed leaves the pool, one that has
// no request in flight counts as idle, or is closed when the idle connections are at maxIdle.
// (The ClientConn closes itself after the idle timeout.)
func (c *Client) h2StateChanged(key connKey, e *h2Conn) {
	c.mu.Lock()
	if e.removed {
		c.mu.Unlock()
		return
	}
	closing := e.cc.Err() != nil
	idle := !closing && e.cc.InFlight() == 0
	if idle && !e.idle && c.nidle >= c.maxIdle {
		closing = true
	}
	switch {
	case closing:
		c.removeH2(key, e)
	case idle != e.idle:
		e.idle = idle
		if idle {
			c.nidle++
		} else {
			c.nidle--
		}
	}
	c.mu.Unlock()
	if closing {
		_ = e.cc.Close()
	}
}

// removeH2 takes e out of key's connections; c.mu is held.
func (c *Client) removeH2(key connKey, e *h2Conn) {
	e.removed = true
	if e.idle {
		e.idle = false
		c.nidle--
	}
	p := c.h2conns[key]
	if p == nil {
		return
	}
	for i, x := range p.conns {
		if x == e {
			p.conns = append(p.conns[:i], p.conns[i+1:]...)
			break
		}
	}
	if len(p.conns) == 0 && p.dialing == nil {
		delete(c.h2conns, key)
	}
}
