package broker

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/capbroker/capbroker/broker/budget"
	"github.com/capbroker/capbroker/broker/wire"
)

// admission decides which agent connections the broker holds, so that no agent can take from
// the others what it needs to be served (one agent must never lock the rest out).
//
//   - Every connection is charged to one agent from its first request on (claim), for as long
//     as it stays open: tunnels and idle keep-alive connections alike. One agent holds at most
//     perAgent of them; beyond that its connection is answered 429 and closed.
//   - Before its first request a connection is charged to its source address: at most
//     perAgent such connections per address, each for at most readHeaderTimeout. A new
//     connection from an address at that bound, or arriving when the broker is full, takes
//     the place of the address's oldest such connection, which is closed: connections that
//     never send a request cannot keep the address's next client out, which sends its
//     request at once.
//   - Every request, an HTTP/2 stream among them, is charged to its agent while it runs: at
//     most perAgentRequests at once (429 beyond), so that one agent's tunnels times the
//     streams each allows do not become thousands of upstream requests.
//   - A connection over any cap, or over max in total, is answered and closed at once: it is
//     never left waiting in the listener's backlog.
type admission struct {
	max, perAgent, perAgentRequests int
	// fleet, when set, caps each agent across a fleet of brokers too (budget.Caps).
	fleet fleetCaps

	mu       sync.Mutex
	open     int                            // connections held
	pending  map[netip.Addr][]*admittedConn // connections not yet claimed, by source address, oldest first
	agents   map[string]int                 // connections claimed, by agent
	requests map[string]int                 // requests running, by agent
}

// fleetCaps are per-agent caps a fleet of brokers shares (budget.Caps). They answer from
// memory: they never wait on the store.
type fleetCaps interface {
	Request(agent string) error
	Claim(agent string) error
	Release(agent string)
}

func newAdmission(max, perAgent, perAgentRequests int) *admission {
	return &admission{
		max: max, perAgent: perAgent, perAgentRequests: perAgentRequests,
		pending: map[netip.Addr][]*admittedConn{}, agents: map[string]int{}, requests: map[string]int{},
	}
}

// setLimits applies new limits (a config reload). Connections and requests already held are
// kept; an agent over a lowered limit gets no new slot until it is back under it.
func (a *admission) setLimits(max, perAgent, perAgentRequests int) {
	a.mu.Lock()
	a.max, a.perAgent, a.perAgentRequests = max, perAgent, perAgentRequests
	a.mu.Unlock()
}

// admit takes a connection slot for a new connection from src, in place of src's oldest
// connection still waiting for its first request when there is no other room (that one is
// closed). It returns nil when the broker is full and src has no such connection.
func (a *admission) admit(c net.Conn, src netip.Addr) *admittedConn {
	a.mu.Lock()
	waiting := a.pending[src]
	var evicted *admittedConn
	if a.open >= a.max || len(waiting) >= a.perAgent {
		if len(waiting) == 0 {
			a.mu.Unlock()
			return nil
		}
		evicted = waiting[0]
		a.drop(evicted)
	}
	ac := &admittedConn{Conn: c, a: a, src: src}
	a.open++
	a.pending[src] = append(a.pending[src], ac)
	a.mu.Unlock()
	if evicted != nil {
		_ = evicted.Conn.Close() // its slot is already ac's
	}
	return ac
}

// request takes a running-request slot for agent; each success needs one requestDone.
func (a *admission) request(agent string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.requests[agent] >= a.perAgentRequests {
		return errTooManyRequests
	}
	if a.fleet != nil {
		if err := a.fleet.Request(agent); err != nil {
			return err
		}
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
// Its state is guarded by its admission's mutex.
type admittedConn struct {
	net.Conn
	a   *admission
	src netip.Addr

	agent string // "" until claimed
	gone  bool   // its slot was given back (released, or taken by a newer connection)
}

// claim charges c to agent. A connection carries one agent's requests: a later request on it
// from another agent is refused (the connection is then closed with the refusal).
func (c *admittedConn) claim(agent string) error {
	a := c.a
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case c.gone:
		return errTooMany
	case c.agent == agent:
		return nil
	case c.agent != "":
		return errOtherAgent
	case a.agents[agent] >= a.perAgent:
		return errTooMany
	}
	if a.fleet != nil {
		if err := a.fleet.Claim(agent); errors.Is(err, budget.ErrCapsUnusable) {
			return err // the store is down: not the agent's connections' fault
		} else if err != nil {
			return errTooMany
		}
	}
	a.unpend(c)
	a.agents[agent]++
	c.agent = agent
	return nil
}

// release gives c's slot back; later calls do nothing. The tunnel served on c calls it when it
// ends, so that the slot is free before the connection's last bytes are flushed.
func (c *admittedConn) release() {
	c.a.mu.Lock()
	defer c.a.mu.Unlock()
	c.a.drop(c)
}

// drop gives c's slot back, once. a.mu must be held.
func (a *admission) drop(c *admittedConn) {
	if c.gone {
		return
	}
	c.gone = true
	a.open--
	if c.agent == "" {
		a.unpend(c)
	} else {
		if a.agents[c.agent]--; a.agents[c.agent] <= 0 {
			delete(a.agents, c.agent)
		}
		if a.fleet != nil {
			a.fleet.Release(c.agent)
		}
	}
}

// unpend removes c from its address's waiting connections. a.mu must be held.
func (a *admission) unpend(c *admittedConn) {
	list := a.pending[c.src]
	for i, w := range list {
		if w == c {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(a.pending, c.src)
	} else {
		a.pending[c.src] = list
	}
}

func (c *admittedConn) Close() error {
	c.release()
	return c.Conn.Close()
}

// admittedKey finds a request's connection in its context (http.Server.ConnContext).
type admittedKey struct{}

func withAdmitted(ctx context.Context, c net.Conn) context.Context {
	if rc, ok := c.(*replayedConn); ok { // handed on by the front (front.go)
		c = rc.admittedConn
	}
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
		if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			src = ta.AddrPort().Addr().Unmap()
		} else if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
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
