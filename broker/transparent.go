package broker

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/broker/transparent"
)

// peekTimeout bounds how long a redirected connection may take to send the first bytes that
// name its host (a TLS ClientHello, an HTTP request head).
const peekTimeout = 5 * time.Second

// ServeTransparent serves the connections the sandbox's rules redirect to ln (transparent
// mode, docs/transparent.md) until ctx ends. Each is served like a CONNECT to its original
// destination, named by its TLS server name or HTTP Host header: identity by source address,
// the connect-phase decision (input.source.mode "transparent"), then the tunnel intercepted
// or piped as for a CONNECT, without the "200 Connection established" line. Tunnels it opens
// are drained by Serve, with the explicit proxy's, when the same ctx ends.
func (b *Broker) ServeTransparent(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of file descriptors and the like: wait and accept again, as net/http does.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			time.Sleep(delay)
			continue
		}
		delay = 0
		go b.serveRedirected(ctx, c)
	}
}

// addrPort is a's address and port, an IPv4-mapped address unmapped.
func addrPort(a net.Addr) netip.AddrPort {
	ap, _ := netip.ParseAddrPort(a.String())
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// originalDst is where c was going before the sandbox's rules redirected it.
func (b *Broker) originalDst(c net.Conn) (netip.AddrPort, error) {
	if b.origDst != nil {
		return b.origDst(c)
	}
	return transparent.OriginalDst(c)
}

// serveRedirected serves one redirected connection.
func (b *Broker) serveRedirected(ctx context.Context, c net.Conn) {
	src, local := addrPort(c.RemoteAddr()), addrPort(c.LocalAddr())
	flow := Flow{Proto: "tcp", Source: src, Dest: local}
	dst, err := b.originalDst(c)
	if err != nil || dst == local {
		b.RefuseFlow(flow, "not redirected: the transparent listener serves only connections the sandbox's rules redirect to it")
		_ = c.Close()
		return
	}
	flow.Dest = dst
	if host, ok := b.names.Name(dst.Addr()); ok {
		flow.Host = host
	}
	if b.handOff(c, dst) {
		return
	}
	if slices.Contains(b.self, dst) {
		// The broker's own services are reached directly (the rules leave the explicit
		// proxy's port alone), never through a redirect.
		b.RefuseFlow(flow, "the broker's own service is not reached through the transparent listener")
		_ = c.Close()
		return
	}
	g := b.gen.Load()
	agent, err := g.agents.Identify("", src.Addr())
	if err != nil {
		b.RefuseFlow(flow, "no agent is configured with source address "+src.Addr().String())
		_ = c.Close()
		return
	}
	port := int(dst.Port())
	if !slices.Contains(g.transparentPorts, port) {
		b.RefuseFlow(flow, fmt.Sprintf("port %d is not served (transparent.ports)", port))
		reset(c)
		return
	}
	ac := b.admission.admit(c, src.Addr())
	if ac == nil {
		b.RefuseFlow(flow, errTooMany.Error())
		reset(c)
		return
	}
	if err := ac.claim(agent.ID); err != nil {
		b.RefuseFlow(flow, err.Error())
		reset(ac)
		return
	}
	if door := b.sshFor(flow.Host, port); door != nil { // git over SSH (broker/transparent_ssh.go)
		defer ac.release()
		door.ServeRedirected(ctx, ac, agent, flow.Host, port)
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(peekTimeout))
	hello, peeked, err := transparent.Peek(c, transparent.MaxPeek)
	if err != nil {
		b.RefuseFlow(flow, "not TLS or HTTP: "+peekError(err))
		_ = ac.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	conn := &replayConn{Conn: ac, pending: peeked}

	name := hello.Host
	if name == "" {
		if name = flow.Host; name == "" {
			b.RefuseFlow(flow, "the TLS ClientHello names no server (SNI), and the address is not one the sandbox's resolver answered")
			_ = ac.Close()
			return
		}
	}
	host, _, err := splitHost(net.JoinHostPort(name, strconv.Itoa(port)), port)
	if err != nil {
		b.RefuseFlow(flow, "bad host name")
		_ = ac.Close()
		return
	}
	hp := net.JoinHostPort(host, strconv.Itoa(port))
	r := (&http.Request{
		Method: http.MethodConnect, URL: &url.URL{Host: hp}, Host: hp, Header: http.Header{},
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, RemoteAddr: src.String(),
	}).WithContext(ctx)
	x := b.begin(policy.PhaseConnect, r)
	x.ev.Mode = audit.ModeTransparent
	x.identify(agent)
	x.ev.Host, x.ev.Port = host, port
	if err := b.checkFronting(ctx, host, hostSource(hello), dst); err != nil {
		b.refuseRedirected(x, conn, hello.Proto, host, port, err, false)
		return
	}
	d, err := b.connectDecision(x, r, agent, host, port)
	if err != nil {
		b.refuseRedirected(x, conn, hello.Proto, host, port, err, true)
		return
	}
	scheme := "https"
	if hello.Proto == transparent.ProtoHTTP {
		scheme = "http"
	}
	t := newTarget(scheme, host, port)
	if d.Intercept || x.ev.WouldDeny {
		if err := b.checkCA(); err != nil && scheme == "https" {
			b.refuseRedirected(x, conn, hello.Proto, host, port, err, false)
			return
		}
		x.ev.Status = http.StatusOK
		x.finish()
		tun := &tunnel{agent: agent, target: t, gen: x.g, source: src.Addr(), mode: audit.ModeTransparent}
		b.interceptConn(conn, tun, ac.release, false)
		return
	}
	defer ac.release()
	b.pipeConn(x, r, conn, t, false)
}

// hostSource names where a redirected connection's host came from, for a refusal's reason:
// the TLS server name, the plain-HTTP Host header, or (neither given) the name the sandbox's
// resolver answered for the address.
func hostSource(hello transparent.Hello) string {
	switch {
	case hello.Host == "":
		return "host (from the sandbox's resolver)"
	case hello.Proto == transparent.ProtoHTTP:
		return "HTTP Host"
	}
	return "TLS server name"
}

// checkFronting refuses a connection whose host (named by what: hostSource) does not belong
// to the address it was sent to: a pool address must be the one the sandbox's resolver answers
// for the host; another address (a client that dialled a literal one) must be one the host
// resolves to here. Without it, a client could send a ClientHello for an allowed host to any
// address.
func (b *Broker) checkFronting(ctx context.Context, host, what string, dst netip.AddrPort) error {
	a := dst.Addr()
	if b.names.InPool(a) {
		if b.names.Matches(host, a) {
			return nil
		}
		return denial{fmt.Sprintf("%s %q does not belong to the address %s the connection was sent to (domain fronting)", what, host, a)}
	}
	lookup := b.lookup
	if lookup == nil {
		lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := lookup(lctx, host)
	if err != nil {
		return denial{fmt.Sprintf("%s %q does not resolve here, so it cannot be checked against the address %s the connection was sent to", what, host, a)}
	}
	for _, x := range addrs {
		if x.Unmap() == a {
			return nil
		}
	}
	return denial{fmt.Sprintf("%s %q does not resolve to the address %s the connection was sent to (domain fronting)", what, host, a)}
}

// refuseRedirected answers a refused redirected connection the way its client can report:
// plain HTTP gets the 403 JSON body; TLS gets it inside a TLS session with the broker's CA
// (handshake true) or is closed (a name the broker will not issue a certificate for).
func (b *Broker) refuseRedirected(x *exchange, conn *replayConn, proto, host string, port int, err error, handshake bool) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(tlsHandshakeTimeout))
	var rw net.Conn = conn
	if proto == transparent.ProtoTLS {
		if !handshake {
			x.fail(nil, err)
			return
		}
		cfg := b.mitmTLS.Clone()
		cfg.NextProtos = []string{"http/1.1"} // the refusal is one HTTP/1.1 response
		pc := &peekedConn{Conn: conn, r: bufio.NewReaderSize(conn, 16), tun: &tunnel{target: newTarget("https", host, port)}}
		tc := tls.Server(pc, cfg)
		if herr := tc.Handshake(); herr != nil {
			x.fail(nil, err)
			return
		}
		rw = tc
	}
	req, rerr := http.ReadRequest(bufio.NewReader(rw))
	if rerr != nil {
		req = nil
	} else {
		// The body is not read; the connection is closed after the answer.
		req.Close = true
	}
	resp := x.fail(req, err)
	resp.Close = true
	_ = resp.Write(rw)
	if tc, ok := rw.(*tls.Conn); ok {
		_ = tc.CloseWrite()
	}
}

// peekError says why no host was found, without the bytes the agent sent.
func peekError(err error) string {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return "nothing that names a host within " + peekTimeout.String()
	case errors.Is(err, transparent.ErrNotTLSOrHTTP):
		return err.Error()[len(transparent.ErrNotTLSOrHTTP.Error())+1:]
	}
	return "the connection ended before naming a host"
}

// reset closes c with a TCP RST, so that its client fails at once rather than wait.
func reset(c net.Conn) {
	if ac, ok := c.(*admittedConn); ok {
		ac.release()
		c = ac.Conn
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// replayConn is a redirected connection whose first bytes, read to find its host, are read
// again first.
type replayConn struct {
	net.Conn
	pending []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		if len(c.pending) == 0 {
			c.pending = nil // the peek buffer is not kept for the tunnel's life
		}
		return n, nil
	}
	return c.Conn.Read(p)
}

// CloseWrite half-closes the connection (an opaque tunnel's end in one direction).
func (c *replayConn) CloseWrite() error {
	inner := c.Conn
	if ac, ok := inner.(*admittedConn); ok {
		inner = ac.Conn
	}
	if cw, ok := inner.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// acceptHandoffs returns ln, which also accepts the connections the transparent listener
// hands over (handOff), for the explicit proxy's server.
func (b *Broker) acceptHandoffs(ln net.Listener) net.Listener {
	h := &handoffListener{Listener: ln, addr: addrPort(ln.Addr()), conns: make(chan net.Conn), accepted: make(chan acceptResult), done: make(chan struct{})}
	go h.pump()
	b.explicit.Store(h)
	return h
}

// handOff gives c to the explicit proxy when c was sent to the proxy's own address (a rules
// variant that redirects it too cannot break explicit clients), and reports whether it did.
// A proxy on a wildcard address (0.0.0.0:8080) owns its port on every local address.
func (b *Broker) handOff(c net.Conn, dst netip.AddrPort) bool {
	h := b.explicit.Load()
	if h == nil || (dst != h.addr && !(h.addr.Addr().IsUnspecified() && dst.Port() == h.addr.Port() && isLocalAddr(dst.Addr()))) {
		return false
	}
	select {
	case h.conns <- c:
	case <-h.done:
		_ = c.Close()
	}
	return true
}

// isLocalAddr reports whether a is an address of one of this host's interfaces.
func isLocalAddr(a netip.Addr) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, ia := range addrs {
		if n, ok := ia.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == a.Unmap() {
				return true
			}
		}
	}
	return false
}

// handoffListener is the explicit proxy's listener, with the connections handed over.
type handoffListener struct {
	net.Listener
	addr      netip.AddrPort
	conns     chan net.Conn
	accepted  chan acceptResult
	done      chan struct{}
	closeOnce sync.Once
}

type acceptResult struct {
	c   net.Conn
	err error
}

// pump accepts from the real listener until it fails.
func (h *handoffListener) pump() {
	for {
		c, err := h.Listener.Accept()
		select {
		case h.accepted <- acceptResult{c, err}:
		case <-h.done:
			if c != nil {
				_ = c.Close()
			}
			return
		}
		if err != nil && errors.Is(err, net.ErrClosed) {
			return
		}
	}
}

func (h *handoffListener) Accept() (net.Conn, error) {
	select {
	case r := <-h.accepted:
		return r.c, r.err
	case c := <-h.conns:
		return c, nil
	case <-h.done:
		return nil, net.ErrClosed
	}
}

func (h *handoffListener) Close() error {
	h.closeOnce.Do(func() { close(h.done) })
	return h.Listener.Close()
}
