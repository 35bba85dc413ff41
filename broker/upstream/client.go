package upstream

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/sys/unix"
)

// Pool identifies the requests that may share an upstream connection. The broker makes it
// from the agent's id and the sorted set of credential names granted to the request.
//
// A connection is only as trustworthy as its framing: were the upstream to read a request
// differently from the broker (a body it ignores, taken for the next request), every later
// response on that connection would answer the request before it. Connections are therefore
// never shared across pools: a response that crosses over can only reach the same agent, on a
// request carrying the same credentials, which its scrubber covers. (Within a pool, the
// connections whose framing the broker cannot vouch for are not reused either: see
// framingVouched.)
type Pool string

// Client sends the broker's requests upstream.
//
// HTTP/1.1 exchanges run on the caller's goroutine, over pools of kept-alive connections: the
// request is written, then the response read, with no reader and writer goroutine per
// connection to hand each request and response through (net/http's Transport does that, and
// the handoffs cost about a fifth of the broker's CPU per request). A host whose TLS handshake
// negotiates h2 is served over HTTP/2 from then on, beginning with that connection, except for
// requests marked WithHTTP1, which always go over HTTP/1.1.
//
// Connections, HTTP/1.1 and HTTP/2 alike, are kept per Pool and origin and never cross from
// one Pool to another. The one exception is a connection that has never carried a request
// (Prepare's): it belongs to nobody, and the first request to claim it makes it its pool's.
//
// HTTP/2 connections are net/http ClientConns (Transport.NewClientConn), pooled here rather
// than in an http.Transport, whose single pool per host would multiplex every agent's streams
// on one connection. One Transport per pool would partition them too, but would leave a
// Transport (and its idle connections, until they time out) behind for every agent and
// credential set ever seen; here a pool's entry goes when its last connection closes, and the
// idle connections of all pools, HTTP/1.1 and HTTP/2, count against one limit (maxIdle).
//
// Every connection goes through the checked Dialer, and TLS is always verified (see New).
type Client struct {
	h2               *http.Transport // makes the HTTP/2 ClientConns; it dials through dialH2
	dial             func(ctx context.Context, network, addr string) (net.Conn, error)
	forward          func(ctx context.Context, network, addr string) (net.Conn, error) // plain HTTP; nil: dial
	inspectTLS       *tls.Config                                                       // through a proxy, with tls_inspection_ca; nil: tls
	inspectRoots     []*x509.Certificate                                               // tls_inspection_ca's certificates
	tls              *tls.Config
	handshakeTimeout time.Duration
	headerTimeout    time.Duration
	idleTimeout      time.Duration
	maxIdlePerHost   int // idle HTTP/1.1 connections per pool and origin
	maxIdle          int // idle connections, HTTP/1.1 and HTTP/2, of all pools together

	// prepared, when set, is called once a Prepare dial has gone into the pool, and
	// awaitingPrepared when a request starts to wait for one. Tests only.
	prepared, awaitingPrepared func()

	mu      sync.Mutex
	idle    map[connKey][]*conn  // idle HTTP/1.1 connections, most recently used last
	h2conns map[connKey]*h2Conns // HTTP/2 connections, busy or idle
	nidle   int                  // idle connections in idle and h2conns

	h2hosts   sync.Map // address -> struct{}: its last handshake negotiated h2
	handoff   sync.Map // address -> handedOff: dialled here, negotiated h2, for the next HTTP/2 dial
	preparing sync.Map // origin -> chan struct{}: a Prepare dial in flight, closed when it ends
}

// connKey names the connections a request may use: its pool's to its origin. A connection
// dialled before any request (Prepare's) is kept under its origin with fresh set, until a
// request of some pool claims it.
//
// Connections dialled offering http/1.1 alone (for WithHTTP1 requests) are kept apart, with
// http1 set: the host may offer h2, which a request without WithHTTP1 (gRPC's, say) must get.
// A WithHTTP1 request takes those first, then the pool's others (they negotiated http/1.1).
type connKey struct {
	pool   Pool
	origin origin
	fresh  bool
	http1  bool
}

// origin is a scheme and host:port. Its parts are kept apart rather than joined into one
// string ("https://host:port"), which would be made anew for every request.
type origin struct {
	https bool   // https, else http
	addr  string // host:port, with the scheme's default port when none was given
	route string // the policy's upstream proxy route (see Route): connections never cross routes
}

// maxResponseHeaderBytes bounds an upstream response's header block.
const maxResponseHeaderBytes = 1 << 20

// errNotH2 ends an HTTP/2 dial whose handshake negotiated another protocol (the host no
// longer offers h2): the request goes over HTTP/1.1 instead.
var errNotH2 = errors.New("upstream no longer negotiates h2")

// RoundTrip sends req over a connection of pool and returns the response. The caller must
// close the response body; a connection goes back to its pool when its response body has
// been read to the end, when the exchange left it ready for another (see framingVouched).
//
// A request whose context carries WithHTTP1 goes over HTTP/1.1 even to a host that offers h2.
func (c *Client) RoundTrip(req *http.Request, pool Pool) (*http.Response, error) {
	addr := canonicalAddr(req)
	upgrade := isUpgrade(req)
	h1 := upgrade || IsHTTP1(req.Context())
	if req.URL.Scheme == "https" && !h1 && c.isH2(addr) {
		resp, err := c.roundTripH2(req, pool, addr)
		if !errors.Is(err, errNotH2) {
			return resp, err
		}
	}
	if err := validHeaders(req); err != nil {
		closeBody(req)
		return nil, err
	}
	key := connKey{pool: pool, origin: origin{https: req.URL.Scheme == "https", addr: addr, route: routeName(req.Context())}, http1: h1 && !upgrade && req.URL.Scheme == "https"}
	for attempt := 0; ; attempt++ {
		pc, reused, err := c.get(req.Context(), key, req.URL.Scheme, addr, upgrade, h1)
		if err != nil {
			closeBody(req)
			return nil, err
		}
		if pc == nil { // the handshake negotiated h2: HTTP/2 takes it from here
			return c.roundTripH2(req, pool, addr)
		}
		RouteOf(req.Context()).setWay(pc.via, pc.inspected)
		resp, err := pc.roundTrip(req)
		if err == nil && pc.fwd != nil && isProxyRefusal(resp) {
			// The proxy's own answer to an absolute-form request, not the origin's.
			_ = resp.Body.Close()
			pc.close()
			return nil, refusal(pc.via, resp)
		}
		if err == nil {
			return resp, nil
		}
		// A kept-alive connection the server had closed fails before any response: a
		// request that may be replayed is sent once more, on a fresh connection.
		var nr noResponse
		if attempt > 0 || !reused || !errors.As(err, &nr) || !replayable(req) || req.Context().Err() != nil {
			return nil, err
		}
		if req.GetBody != nil {
			if req.Body, err = req.GetBody(); err != nil {
				return nil, err
			}
		}
	}
}

// Prepare dials a connection to the https address addr (host:port) in the background when
// none is waiting unclaimed, so that a request arriving soon does not wait for the TCP and TLS
// handshakes. The broker calls it when it opens an intercepted tunnel, while the agent does
// its own handshake with the broker, before any request is decided: the connection belongs
// to no pool until a request claims it. With http1, for an agent that speaks HTTP/1.1 (see
// WithHTTP1), it offers only http/1.1, and dials even to a host known to speak h2.
func (c *Client) Prepare(addr string, http1 bool) {
	key := connKey{origin: origin{https: true, addr: addr}, fresh: true, http1: http1}
	if (!http1 && c.isH2(addr)) || c.hasIdle(key) {
		return
	}
	done := make(chan struct{})
	if _, busy := c.preparing.LoadOrStore(key.origin, done); busy {
		return
	}
	go func() {
		defer close(done)
		defer c.preparing.Delete(key.origin)
		ctx, cancel := context.WithTimeout(context.Background(), c.handshakeTimeout)
		defer cancel()
		pc, err := c.dialConn(ctx, key, "https", addr, false, http1)
		if err != nil || pc == nil {
			return // the request will dial again, and report the error
		}
		c.put(pc)
		if c.prepared != nil {
			c.prepared()
		}
	}()
}

// CloseIdleConnections closes every pooled connection that carries no request.
func (c *Client) CloseIdleConnections() {
	c.mu.Lock()
	idle := c.idle
	c.idle = map[connKey][]*conn{}
	for _, list := range idle {
		c.nidle -= len(list)
	}
	var idleH2 []*http.ClientConn
	for key, p := range c.h2conns {
		for _, e := range append([]*h2Conn(nil), p.conns...) {
			if e.cc.InFlight() == 0 {
				c.removeH2(key, e)
				idleH2 = append(idleH2, e.cc)
			}
		}
	}
	c.mu.Unlock()
	for _, list := range idle {
		for _, pc := range list {
			pc.close()
		}
	}
	for _, cc := range idleH2 {
		_ = cc.Close()
	}
	c.handoff.Range(func(k, v any) bool {
		c.handoff.Delete(k)
		_ = v.(handedOff).Close()
		return true
	})
	c.h2.CloseIdleConnections()
}

// Transport is the http.Transport that makes the HTTP/2 connections. It dials through the
// same checked Dialer and TLS configuration; its own pool is never used.
func (c *Client) Transport() *http.Transport { return c.h2 }

func (c *Client) isH2(addr string) bool {
	_, ok := c.h2hosts.Load(addr)
	return ok
}

func (c *Client) hasIdle(key connKey) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.idle[key]) > 0
}

// get returns a pooled connection for key (reused true) or a new one. A connection of key's
// own pool comes first, then one no request has claimed yet (Prepare's), which becomes key's.
// It returns a nil conn when the host turned out to speak h2: HTTP/2 takes the request
// (never with h1, which dials offering http/1.1 alone).
// A request that finds no connection while a Prepare dial for its origin is under way waits
// for that dial rather than start a second handshake beside it.
func (c *Client) get(ctx context.Context, key connKey, scheme, addr string, upgrade, h1 bool) (*conn, bool, error) {
	if upgrade { // an upgrade gets a connection of its own, never returned to the pool
		pc, err := c.dialConn(ctx, key, scheme, addr, upgrade, true)
		return pc, false, err
	}
	if pc := c.takeAny(key); pc != nil {
		return pc, true, nil
	}
	if pc := c.claim(key); pc != nil {
		return pc, true, nil
	}
	if v, ok := c.preparing.Load(key.origin); ok {
		if c.awaitingPrepared != nil {
			c.awaitingPrepared()
		}
		select {
		case <-v.(chan struct{}):
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
		if !h1 && c.isH2(addr) {
			return nil, false, nil
		}
		if pc := c.claim(key); pc != nil {
			return pc, false, nil // just dialled: a failure on it is not a stale keep-alive
		}
	}
	pc, err := c.dialConn(ctx, key, scheme, addr, upgrade, h1)
	return pc, false, err
}

// claim takes a live connection that no request has used yet for key's origin, and makes it
// key's (one dialled offering http/1.1 alone stays apart: see connKey).
func (c *Client) claim(key connKey) *conn {
	pc := c.takeAny(connKey{origin: key.origin, fresh: true, http1: key.http1})
	if pc != nil {
		pc.key.pool, pc.key.fresh = key.pool, false
	}
	return pc
}

// takeAny is takeLive(key), and for an http1 key the connections of the same pool that
// negotiated http/1.1 next.
func (c *Client) takeAny(key connKey) *conn {
	pc := c.takeLive(key)
	if pc == nil && key.http1 {
		key.http1 = false
		pc = c.takeLive(key)
	}
	return pc
}

// takeLive takes the most recently used idle connection for key that the server has not
// closed, nor written to since, closing those it has. Every take is checked: a connection
// returned a moment ago may already hold bytes that answer no request.
func (c *Client) takeLive(key connKey) *conn {
	for {
		pc := c.take(key)
		if pc == nil || pc.alive() {
			return pc
		}
		pc.close()
	}
}

// take removes the most recently used idle connection for key from the pool.
func (c *Client) take(key connKey) *conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	list := c.idle[key]
	if len(list) == 0 {
		return nil
	}
	pc := list[len(list)-1]
	list[len(list)-1] = nil
	if len(list) == 1 {
		delete(c.idle, key) // a pool and host seen once do not keep an entry
	} else {
		c.idle[key] = list[:len(list)-1]
	}
	c.nidle--
	pc.timer.Stop()
	return pc
}

// put returns pc to its pool, or closes it when the pool is full.
func (c *Client) put(pc *conn) {
	c.mu.Lock()
	if c.nidle >= c.maxIdle || len(c.idle[pc.key]) >= c.maxIdlePerHost {
		c.mu.Unlock()
		pc.close()
		return
	}
	list := c.idle[pc.key]
	if list == nil {
		// A pool's only idle connection, the common case, needs no array of its own: take
		// deletes the entry when it empties it, and put would make a new one each time.
		list = pc.alone[:0:1]
	}
	c.idle[pc.key] = append(list, pc)
	c.nidle++
	if pc.timer == nil {
		pc.timer = time.AfterFunc(c.idleTimeout, pc.expire)
	} else {
		pc.timer.Reset(c.idleTimeout)
	}
	c.mu.Unlock()
}

// remove takes pc out of the pool if it is there, and reports whether it was.
func (c *Client) remove(pc *conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	list := c.idle[pc.key]
	for i, x := range list {
		if x == pc {
			c.idle[pc.key] = append(list[:i], list[i+1:]...)
			c.nidle--
			if len(c.idle[pc.key]) == 0 {
				delete(c.idle, pc.key)
			}
			return true
		}
	}
	return false
}

// dialConn dials addr, with TLS for https, offering h2 and http/1.1 in ALPN, or http/1.1 alone
// with h1. A TLS connection that negotiates h2 is handed over to the next HTTP/2 dial (see
// dialH2) and dialConn returns nil.
func (c *Client) dialConn(ctx context.Context, key connKey, scheme, addr string, upgrade, h1 bool) (*conn, error) {
	dial := c.dial
	if scheme == "http" && c.forward != nil && !upgrade {
		// Through a proxy: absolute-form requests, no CONNECT. An upgrade (WebSocket) takes a
		// CONNECT tunnel: forward proxies drop Upgrade from absolute-form requests.
		dial = c.forward
	}
	raw, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	via := viaOf(raw)
	nc := raw
	inspected := false
	var probe *probeConn
	if scheme == "https" {
		alpn := []string{"h2", "http/1.1"}
		if h1 {
			alpn = []string{"http/1.1"}
		}
		probe = &probeConn{Conn: raw}
		var under net.Conn = probe
		if !h1 { // it may negotiate h2 (see corkConn)
			under = newCorkConn(probe)
		}
		tc, insp, err := c.handshakeVia(ctx, under, addr, alpn, via)
		if err != nil {
			return nil, err
		}
		inspected = insp
		if tc.ConnectionState().NegotiatedProtocol == "h2" {
			c.h2hosts.Store(addr, struct{}{})
			if old, loaded := c.handoff.Swap(handoffKey(key.origin.route, addr), handedOff{tc, time.Now(), via, inspected}); loaded {
				_ = old.(handedOff).Close()
			}
			return nil, nil
		}
		nc = tc
	}
	pc := &conn{c: c, key: key, Conn: nc, probe: probe, via: via, inspected: inspected}
	if p, ok := raw.(*proxiedConn); ok {
		pc.fwd = p.fwd
	}
	if sc, ok := raw.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			pc.raw, pc.peekFn = rc, pc.peek
		}
	}
	pc.closeFn = pc.close
	pc.lr = limitedReader{r: nc, n: -1}
	pc.br = bufio.NewReader(&pc.lr)
	return pc, nil
}

// handshakeVia is handshake, for a connection that went through via: one through a proxy
// also trusts the TLS-inspection CA, when the operator configured one. inspected reports
// whether the origin's certificate verified only through that CA (every chain verified ends
// at one of its certificates): the proxy re-signed it. Configured is not enough.
func (c *Client) handshakeVia(ctx context.Context, raw net.Conn, addr string, alpn []string, via string) (tc *tls.Conn, inspected bool, err error) {
	if via == Direct || c.inspectTLS == nil {
		tc, err = c.handshake(ctx, raw, addr, alpn)
		return tc, false, err
	}
	if tc, err = c.handshakeWith(ctx, c.inspectTLS, raw, addr, alpn); err != nil {
		return nil, false, err
	}
	return tc, c.inspectedChains(tc.ConnectionState().VerifiedChains), nil
}

// inspectedChains reports whether every verified chain ends at a TLS-inspection CA.
func (c *Client) inspectedChains(chains [][]*x509.Certificate) bool {
	if len(chains) == 0 {
		return false
	}
	for _, chain := range chains {
		root := chain[len(chain)-1]
		if !slices.ContainsFunc(c.inspectRoots, root.Equal) {
			return false
		}
	}
	return true
}

// handshake runs the TLS handshake on raw, verifying the server for addr's host.
func (c *Client) handshake(ctx context.Context, raw net.Conn, addr string, alpn []string) (*tls.Conn, error) {
	return c.handshakeWith(ctx, c.tls, raw, addr, alpn)
}

func (c *Client) handshakeWith(ctx context.Context, base *tls.Config, raw net.Conn, addr string, alpn []string) (*tls.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		raw.Close()
		return nil, err
	}
	cfg := base.Clone()
	cfg.ServerName = host
	cfg.NextProtos = alpn
	tc := tls.Client(raw, cfg)
	hctx, cancel := context.WithTimeout(ctx, c.handshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		raw.Close()
		return nil, err
	}
	return tc, nil
}

// conn is one pooled HTTP/1.1 connection.
type conn struct {
	c   *Client
	key connKey // its pool and origin; fresh until a request claims it
	net.Conn
	raw    syscall.RawConn  // the TCP connection under TLS, for the liveness peek; nil: none
	probe  *probeConn       // the TCP connection under TLS, for unread; nil without TLS
	peekFn func(fd uintptr) // pc.peek, bound once: a take allocates nothing for it
	live   bool             // peek's answer
	lr     limitedReader
	br     *bufio.Reader
	timer  *time.Timer
	served bool // a response has been read on it (see alive)
	// alone backs the pool's list of idle connections when pc is the only one (see put). A
	// list of capacity 1 only ever holds the connection whose array it is.
	alone   [1]*conn
	closeFn func()   // pc.close, bound once: an exchange's watch on its context allocates nothing for it
	via     string   // the upstream proxy it goes through, Direct when none
	fwd     *forward // set: requests go to the proxy in absolute form
	// inspected: the origin's certificate verified only through the TLS-inspection CA.
	inspected bool
}

func (pc *conn) close() { _ = pc.Conn.Close() }

// expire closes pc when it has sat idle in the pool for the idle timeout.
func (pc *conn) expire() {
	if pc.c.remove(pc) {
		pc.close()
	}
}

// alive reports whether pc may carry a request: nothing that answers no request waits on it
// (see unread), and the server has not closed it (a non-blocking peek at the socket finds no
// EOF).
func (pc *conn) alive() bool {
	if pc.unread() {
		return false
	}
	if pc.raw == nil {
		return true
	}
	pc.live = false
	// Control, not Read: RawConn.Read fails without peeking once a read deadline has passed,
	// and the header timeout's may still be on the connection (see probeConn.clear).
	_ = pc.raw.Control(pc.peekFn)
	return pc.live
}

// peek looks at the socket without reading from it, nor waiting.
func (pc *conn) peek(fd uintptr) {
	n, err := peekSocket(fd)
	// Nothing to read (EAGAIN) is a live, quiet connection. A close reads as 0 bytes, a
	// reset as an error. Bytes waiting (n > 0) may be TLS 1.3 session tickets on a
	// connection that has not read a response yet (a prepared one), unless the server has
	// closed it behind them (peerClosed); on one that has served a response, they are a TLS
	// close_notify alert (a TLS server's close reads as bytes, not as 0) or data that answers
	// no request: either way the connection cannot be used.
	pc.live = (n > 0 && !pc.served && !peerClosed(fd)) || errors.Is(err, unix.EAGAIN)
}

// unread reports whether bytes have come in on pc that it has not read: in its bufio.Reader,
// or in the tls.Conn under it, which may have read whole TLS records past the last response
// (the socket peek cannot see those). The tls.Conn is read with its connection probing (see
// probeConn): it takes what it holds, and fails at once, as a read past its deadline does,
// where it would have read the socket; that failure leaves the tls.Conn usable. A server's
// close (close_notify) reads as an error too, and TLS 1.3 session tickets on a prepared
// connection are taken without counting as data.
func (pc *conn) unread() bool {
	if pc.br.Buffered() > 0 {
		return true
	}
	if pc.probe == nil {
		return false
	}
	pc.probe.probing = true
	_, err := pc.br.Peek(1)
	pc.probe.probing = false
	_, probed := err.(probeError) // as the tls.Conn returns it: not wrapped
	return !probed
}

// probeConn is the TCP connection under an upstream TLS connection. While probing, its reads
// fail at once with probeError, without a system call: unread learns whether the tls.Conn
// holds anything without setting a read deadline in the past, then clearing it, on every
// take (two changes to the runtime's poller, and the timed-out read's error, allocated).
//
// It also takes the header timeout's read deadline off the connection before the first read of
// the socket after the response head (clear, see readResponse): never when the whole response
// came with its head. A deadline left on a connection after that (it may pass while the
// connection waits in the pool) affects no read: the next exchange sets its own before it
// reads, and a probe does not read the socket.
//
// Only the goroutine that holds the connection sets probing and clear, and reads them.
type probeConn struct {
	net.Conn
	probing bool
	clear   bool // take the read deadline off before reading the socket
}

func (p *probeConn) Read(b []byte) (int, error) {
	if p.probing {
		return 0, probeError{}
	}
	if p.clear {
		p.clear = false
		_ = p.Conn.SetReadDeadline(time.Time{})
	}
	return p.Conn.Read(b)
}

// probeError is a probing probeConn's read. It is a temporary timeout, as a read past its
// deadline is: crypto/tls returns it as it is, and does not take it for the connection's end.
type probeError struct{}

func (probeError) Error() string   { return "upstream connection probed" }
func (probeError) Timeout() bool   { return true }
func (probeError) Temporary() bool { return true }

// noResponse wraps an error that ended an exchange before any response header arrived.
type noResponse struct{ error }

func (e noResponse) Unwrap() error { return e.error }

// roundTrip writes req on pc and reads the response. A request body that is not in memory is
// written by a goroutine of its own while the response is awaited, so that a server may answer
// (an early 413, say) before it has read the whole body.
func (pc *conn) roundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	vouched := framingVouched(req)
	sent := onWire(req, vouched)
	stop := context.AfterFunc(ctx, pc.closeFn) // the agent went away: abandon the exchange
	var wrote chan error
	if streaming(sent) {
		wrote = make(chan error, 1)
		go func() {
			err := pc.write(sent)
			wrote <- err
			if err != nil {
				pc.close() // so the response read below ends too
			}
		}()
	} else if err := pc.write(sent); err != nil {
		stop()
		pc.close()
		return nil, noResponse{orContext(ctx, err)}
	}
	resp, err := pc.readResponse(sent)
	if err == nil && ctx.Err() != nil {
		// The context ended as the response arrived: the exchange is abandoned all the same.
		// The response may even be the server's answer to the abandoning close (a handler that
		// stops when its client goes away sends an empty 200).
		err = ctx.Err()
	}
	if err != nil {
		stop()
		pc.close()
		if wrote != nil {
			// The writer's error, if it has failed (its failure may be what ended the read: it
			// sends its error before closing the connection). It is not waited for: it may be
			// blocked reading a request body that stalls, and would hold the caller there.
			select {
			case werr := <-wrote:
				if werr != nil && ctx.Err() == nil {
					err = fmt.Errorf("%w (writing the request: %v)", err, werr) // keeps a noResponse
				}
			default:
			}
		}
		return nil, orContext(ctx, err)
	}
	pc.served = true
	resp.Request = req
	keep := vouched && !sent.Close && !resp.Close && !isUpgrade(req) && !refusedBody(req, resp)
	b := &body{pc: pc, rc: resp.Body, stop: stop, wrote: wrote, keep: keep}
	switch {
	case resp.StatusCode == http.StatusSwitchingProtocols:
		resp.Body = &upgraded{body: b}
	case resp.Body == http.NoBody: // HEAD, 204, 304, Content-Length: 0: the exchange is over
		b.finish(true)
	default:
		resp.Body = b
	}
	return resp, nil
}

func (pc *conn) write(req *http.Request) error {
	// Request.Write sends the body's framing and closes it; the headers and an in-memory
	// body leave in one write. A request without a body, or with one in memory, is written
	// without its allocations, to the same bytes (see writeSimple).
	bw := writers.Get().(*bufio.Writer)
	bw.Reset(pc.Conn)
	defer func() {
		bw.Reset(nil)
		writers.Put(bw)
	}()
	if pc.fwd != nil {
		if err := pc.fwd.write(bw, req); err != nil {
			return err
		}
		return bw.Flush()
	}
	if !writeSimple(bw, req) {
		if err := req.Write(bw); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// writers are the buffers requests are written through: one TLS record's plaintext each, so
// that a streamed body goes upstream in full records (with bufio's default 4 KiB, an upload
// left in four times the records, and writes, it needs). A connection holds one only while it
// writes a request.
var writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 16<<10) }}

// readResponse reads the response to req, skipping informational (1xx) responses other than
// 101, with the header timeout and size limit. An error before the response's first byte that
// is not the timeout (the connection was closed or reset) is a noResponse; any other error
// is not: the server got the request, and may be acting on it.
//
// The header timeout's deadline goes when readResponse returns; over TLS only once the
// connection is next read (see probeConn.clear): a response whose body came with its head, the
// common case, never reads the socket again, and the next exchange sets a deadline of its own.
func (pc *conn) readResponse(req *http.Request) (*http.Response, error) {
	if pc.probe != nil {
		pc.probe.clear = false // the deadline set here holds until the head has been read
	}
	_ = pc.SetReadDeadline(time.Now().Add(pc.c.headerTimeout))
	defer pc.clearDeadline()
	for i := range 10 {
		pc.lr.n = maxResponseHeaderBytes
		if i == 0 {
			if _, err := pc.br.Peek(1); err != nil {
				if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
					return nil, err
				}
				return nil, noResponse{err}
			}
		}
		resp, err := http.ReadResponse(pc.br, req)
		pc.lr.n = -1
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, nil
		}
	}
	return nil, errors.New("upstream sent too many informational (1xx) responses")
}

// clearDeadline takes the read deadline off pc: at once without TLS, before the next read of
// the socket under TLS.
func (pc *conn) clearDeadline() {
	if pc.probe != nil {
		pc.probe.clear = true
		return
	}
	_ = pc.SetReadDeadline(time.Time{})
}

// onWire is req as it is written: with Connection: close when its framing cannot be vouched
// for, so that the upstream does not read what follows the request head (a body it ignores,
// say) as a next request; and without a Body when its ContentLength is 0 (see hasBody), which
// Request.Write would otherwise probe, and send chunked if it found bytes in it. What is sent
// is then what was decided on.
func onWire(req *http.Request, vouched bool) *http.Request {
	empty := req.ContentLength == 0 && req.Body != nil && req.Body != http.NoBody
	if !empty && (vouched || req.Close) {
		return req
	}
	cp := *req
	if empty {
		_ = req.Body.Close()
		cp.Body = http.NoBody
	}
	cp.Close = cp.Close || !vouched
	return &cp
}

// framingVouched reports whether the broker can vouch that the upstream reads req as it was
// written, and so that the connection is ready for another request after the response. It
// cannot when req has:
//   - a body, on a method for which a body has no defined meaning (RFC 9110 section 9.3):
//     GET, HEAD, DELETE, TRACE, CONNECT, OPTIONS. Servers may ignore it and read it as the
//     next request (Python's http.server does). OPTIONS is in, Content-Type or not: a server
//     that ignores the body does not look at its type either.
//   - Expect: the body follows at once (the client does not wait for 100 Continue), and a
//     server that answers early may not read it.
//
// Such a request is sent with Connection: close, and its connection is not reused.
func framingVouched(req *http.Request) bool {
	if req.Header.Get("Expect") != "" {
		return false
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodDelete, http.MethodTrace, http.MethodConnect, http.MethodOptions:
		return !hasBody(req)
	}
	return true
}

// refusedBody reports whether resp refuses a request that had a body: a server that refuses
// a request (an unknown method, a missing route, a rate limit) often answers without reading
// its body, which would then be read as the next request. Its connection is not reused.
func refusedBody(req *http.Request, resp *http.Response) bool {
	return resp.StatusCode >= 400 && hasBody(req)
}

// hasBody reports whether req carries a body: a length, or a body of unknown length (-1), sent
// chunked. A ContentLength of 0 is no body, whatever Body is (onWire sends none), as net/http's
// server, where the requests the broker forwards come from, means it: an HTTP/2 request without
// a body has a Body that reads EOF at once.
func hasBody(req *http.Request) bool {
	return req.ContentLength > 0 || (req.ContentLength < 0 && req.Body != nil && req.Body != http.NoBody)
}

// body is an HTTP/1.1 response body. Read to its end, it returns the connection to the pool
// (when keep); closed before that, it closes the connection (reading the rest could take
// forever).
type body struct {
	pc    *conn
	rc    io.ReadCloser
	stop  func() bool
	wrote chan error // the request body's writer, when one runs
	keep  bool       // the framing was vouched for, and neither side asked to close
	once  sync.Once
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil {
		b.finish(err == io.EOF)
	}
	return n, err
}

func (b *body) Close() error {
	b.finish(false)
	return nil
}

func (b *body) finish(eof bool) {
	b.once.Do(func() {
		live := b.stop() // false: the agent went away and the connection was closed
		if b.wrote != nil {
			select {
			case err := <-b.wrote:
				live = live && err == nil
			default:
				live = false // the server answered before reading the whole request body
			}
		}
		if eof && live && b.keep && b.pc.br.Buffered() == 0 {
			b.pc.c.put(b.pc)
			return
		}
		b.pc.close()
	})
}

// upgraded is the body of a 101 response: the connection itself, after the response head.
// Reads take the bytes already buffered first; writes go to the connection.
type upgraded struct{ *body }

func (u *upgraded) Read(p []byte) (int, error) { return u.pc.br.Read(p) }

func (u *upgraded) Write(p []byte) (int, error) { return u.pc.Conn.Write(p) }

// limitedReader reads at most n bytes from r while n >= 0, then fails; n < 0 is no limit.
type limitedReader struct {
	r io.Reader
	n int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n < 0 {
		return l.r.Read(p)
	}
	if l.n == 0 {
		return 0, fmt.Errorf("upstream response header larger than %d bytes", maxResponseHeaderBytes)
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

// http1Key is the context key of WithHTTP1.
type http1Key struct{}

// WithHTTP1 returns a context whose requests RoundTrip sends over HTTP/1.1, offering only
// http/1.1 in ALPN, even to a host that offers h2. The broker sets it on the requests of an
// agent that spoke HTTP/1.1 to it: the upstream gets the protocol the agent chose, and the
// broker keeps to its own HTTP/1.1 exchanges, which cost less CPU than HTTP/2's.
func WithHTTP1(ctx context.Context) context.Context {
	return context.WithValue(ctx, http1Key{}, true)
}

// IsHTTP1 reports whether ctx is, or derives from, one WithHTTP1 returned.
func IsHTTP1(ctx context.Context) bool {
	v, _ := ctx.Value(http1Key{}).(bool)
	return v
}

// canonicalAddr is req's host:port, with the scheme's default port when none is given.
func canonicalAddr(req *http.Request) string {
	if port := req.URL.Port(); port != "" {
		return req.URL.Host
	}
	port := "80"
	if req.URL.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(req.URL.Hostname(), port)
}

func isUpgrade(req *http.Request) bool {
	return req.Header.Get("Upgrade") != "" && httpguts.HeaderValuesContainsToken(req.Header["Connection"], "upgrade")
}

// streaming reports whether req has a body that is not in memory (it can be replayed, through
// GetBody, when it is).
func streaming(req *http.Request) bool {
	return hasBody(req) && req.GetBody == nil
}

// replayable reports whether req may be sent again after a failure on a kept-alive connection:
// its body can be replayed and the method is idempotent (net/http's rule).
func replayable(req *http.Request) bool {
	if streaming(req) {
		return false
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return req.Header.Get("Idempotency-Key") != "" || req.Header.Get("X-Idempotency-Key") != ""
}

// validHeaders refuses header names and values that would change the message's framing (a
// value with a line break, say): Request.Write would only replace the line breaks.
func validHeaders(req *http.Request) error {
	for _, h := range []http.Header{req.Header, req.Trailer} {
		for k, vs := range h {
			if !httpguts.ValidHeaderFieldName(k) {
				return fmt.Errorf("invalid header field name %q", k)
			}
			for _, v := range vs {
				if !httpguts.ValidHeaderFieldValue(v) {
					return fmt.Errorf("invalid header field value for %q", k) // the value may be a secret
				}
			}
		}
	}
	return nil
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// orContext is ctx's error when ctx has ended (the exchange was abandoned), else err.
func orContext(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	return err
}
