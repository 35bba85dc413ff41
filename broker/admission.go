package broker

import (
	"context"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/capbroker/capbroker/broker/wire"
)

// admission decides which agent connections the broker holds, so that no agent can take from
// the others what it needs to be served (one agent must never lock the rest out).
//
//   - Every connection is charged to one agent from its first request on (claim), for as long
//     as it stays open: tunnels and idle keep-alive connections alike. One agent holds at most
//     perAgent of them; beyond that its connection is answered 429 and closed.
//   - Before its first request a connection is charged to its source address: at most
//     perAgent such connections per address, each for at most readHeaderTimeout.
//   - Every request, an HTTP/2 stream among them, is charged to its agent while it runs: at
//     most perAgentRequests at once (429 beyond), so that one agent's tunnels times the
//     streams each allows do not become thousands of upstream requests.
//   - A connection over any cap, or over max in total, is answered and closed at once: it is
//     never left waiting in the listener's backlog.
type admission struct {
	max, perAgent, perAgentRequests int

	mu       sync.Mutex
	open     int                // connections held
	pending  map[netip.Addr]int // connections not yet claimed, by source address
	agents   map[string]int     // connections claimed, by agent
	requests map[string]int     // requests running, by agent
}

func newAdmission(max, perAgent, perAgentRequests int) *admission {
	return &admission{
		max: max, perAgent: perAgent, perAgentRequests: perAgentRequests,
		pending: map[netip.Addr]int{}, agents: map[string]int{}, requests: map[string]int{},
	}
}

// admit takes a connection slot for a new connection from src. It returns nil when the broker
// is full, or src already has as many connections waiting for their first request as an agent
// may hold.
func (a *admission) admit(c net.Conn, src netip.Addr) *admittedConn {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.open >= a.max || a.pending[src] >= a.perAgent {
		return nil
	}
	a.open++
	a.pending[src]++
	return &admittedConn{Conn: c, a: a, src: src}
}

// request takes a running-request slot for agent; each success needs one requestDone.
func (a *admission) request(agent string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.requests[agent] >= a.perAgentRequests {
		return errTooManyRequests
	}
	a.requests[agent]++
	return nil
}

func (a *admission) requestDone(agent string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.requests[agent]--; a.requests[agent] <= 0 {
		delete(a.requests, agent)
	}
}

// admittedConn is an agent connection holding its slot: its source address's until claim
// charges it to an agent, that agent's after. Closing it, or release, gives the slot back.
type admittedConn struct {
	net.Conn
	a   *admission
	src netip.Addr

	mu       sync.Mutex
	agent    string // "" until claimed
	released bool
}

// claim charges c to agent. A connection carries one agent's requests: a later request on it
// from another agent is refused (the connection is then closed with the refusal).
func (c *admittedConn) claim(agent string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.released:
		return errTooMany
	case c.agent == agent:
		return nil
	case c.agent != "":
		return errOtherAgent
	}
	a := c.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.agents[agent] >= a.perAgent {
		return errTooMany
	}
	a.agents[agent]++
	a.unpend(c.src)
	c.agent = agent
	return nil
}

// release gives c's slot back; later calls do nothing. The tunnel served on c calls it when it
// ends, so that the slot is free before the connection's last bytes are flushed.
func (c *admittedConn) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return
	}
	c.released = true
	a := c.a
	a.mu.Lock()
	defer a.mu.Unlock()
	a.open--
	if c.agent == "" {
		a.unpend(c.src)
	} else if a.agents[c.agent]--; a.agents[c.agent] <= 0 {
		delete(a.agents, c.agent)
	}
}

func (a *admission) unpend(src netip.Addr) {
	if a.pending[src]--; a.pending[src] <= 0 {
		delete(a.pending, src)
	}
}

func (c *admittedConn) Close() error {
	c.release()
	return c.Conn.Close()
}

// admittedKey finds a request's connection in its context (http.Server.ConnContext).
type admittedKey struct{}

func withAdmitted(ctx context.Context, c net.Conn) context.Context {
	if ac, ok := c.(*admittedConn); ok {
		return context.WithValue(ctx, admittedKey{}, ac)
	}
	return ctx
}

// claimConn charges the connection a request came on to agent. A request without an admitted
// connection (one the broker's listener did not accept) is refused: fail closed.
func claimConn(ctx context.Context, agent string) (*admittedConn, error) {
	ac, ok := ctx.Value(admittedKey{}).(*admittedConn)
	if !ok {
		return nil, errInternal
	}
	return ac, ac.claim(agent)
}

// admittingListener admits the connections it accepts (see admission), answering and closing
// those it refuses, and checks the framing of the rest (see package wire).
type admittingListener struct {
	net.Listener
	a *admission
}

func (l admittingListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := netip.Addr{}
		if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
			src = ap.Addr().Unmap()
		}
		if ac := l.a.admit(wire.Guard(c, framingRejection), src); ac != nil {
			return ac, nil
		}
		go refuseBusy(c)
	}
}

// refuseBusy answers a connection the broker will not hold, and closes it. The answer is
// written without reading the request: the connection's slot is what the broker lacks.
// Closing at once could reset the connection before the client has read the answer (the
// request it sent is unread), so the write side is shut first and what the client sends is
// discarded for a moment.
func refuseBusy(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(busyLinger))
	if _, err := c.Write(busyRejection); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		_, _ = io.Copy(io.Discard, io.LimitReader(c, maxHeaderBytes))
	}
}

// busyLinger bounds how long a refused connection is held to deliver its refusal.
const busyLinger = time.Second
