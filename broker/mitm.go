package broker

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/capbroker/capbroker/broker/http1"
	"github.com/capbroker/capbroker/broker/http2srv"
	"github.com/capbroker/capbroker/broker/upstream"
	"github.com/capbroker/capbroker/broker/wire"
)

// tlsHandshakeTimeout bounds the agent's TLS handshake inside a tunnel.
const tlsHandshakeTimeout = 10 * time.Second

// intercept serves an allowed, intercepted CONNECT: it answers 200, terminates the agent's TLS
// with a leaf for the CONNECT host (issued only now), and serves the requests inside with
// broker/http2srv when the agent negotiated h2, else broker/http1, so each one gets a
// server's limits and timeouts and a context that ends when the agent goes away. Every
// request, or HTTP/2 stream, is decided again (b.exchange with the tunnel). An HTTP/1.1
// tunnel is parked between requests.
func (b *Broker) intercept(client net.Conn, tun *tunnel, release func()) {
	b.interceptConn(client, tun, release, true)
}

// interceptConn is intercept; greet false leaves out the 200 line (a redirected connection,
// in transparent mode, did not ask for a tunnel).
func (b *Broker) interceptConn(client net.Conn, tun *tunnel, release func(), greet bool) {
	var once sync.Once
	done := func() { once.Do(release) }
	served := false
	defer func() {
		if !served {
			client.Close()
			done()
		}
	}()
	// A host's first certificate is issued while the agent prepares its ClientHello, rather
	// than after it arrives; the handshake below waits on the same issue (single flight). A
	// cached one needs no goroutine (most CONNECTs: one would cost more than the look-up).
	if host := tun.target.host; !b.certs.Cached(host) { // the handshake may change tun.target
		go func() { _, _ = b.certs.Get(host) }()
	}
	// Likewise the host's first upstream connection, when the pool has none: dialled as the
	// agent's ClientHello arrives (see newMitmTLS), not after its first request.
	tun.prepare = true
	if greet {
		if _, err := client.Write(connectEstablished); err != nil {
			return
		}
	}
	_ = client.SetDeadline(time.Now().Add(tlsHandshakeTimeout))
	// Only one byte is peeked, and the reader lives as long as the tunnel: the smallest
	// buffer, not the 4 KiB default. Larger reads bypass it (bufio reads them directly).
	br := bufio.NewReaderSize(client, 16)
	first, err := br.Peek(1)
	if err != nil {
		return
	}
	var conn net.Conn = &peekedConn{Conn: client, r: br, tun: tun}
	if first[0] != 0x16 { // not a TLS handshake record: plain HTTP sent through the tunnel
		tun.target = newTarget("http", tun.target.host, tun.target.port)
	} else { // intercept TLS
		tc := tls.Server(conn, b.mitmTLS)
		if err := tc.Handshake(); err != nil {
			b.log.Debug().Err(err).Str("host", tun.target.host).Msg("agent TLS handshake failed in tunnel")
			return
		}
		conn = tc
	}
	_ = client.SetDeadline(time.Time{})

	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { b.serveTunnel(w, r, tun) })
	var ended shutdowner
	end := func() {
		b.tunnels.Delete(ended)
		done() // the tunnel has ended: the agent's slot is free again
	}
	tc, isTLS := conn.(*tls.Conn)
	if isTLS && tc.ConnectionState().NegotiatedProtocol == "h2" {
		// HTTP/2: served on this goroutine by broker/http2srv, which checks the framing
		// (RFC 9113, with x/net's Framer and hpack); each stream's request runs through
		// serveTunnel on a goroutine of its own.
		s := &http2srv.Server{
			Handler:              handler,
			ReadHeaderTimeout:    readHeaderTimeout,
			IdleTimeout:          idleTimeout,
			PingTimeout:          pingTimeout,
			MaxHeaderBytes:       maxHeaderBytes,
			MaxConcurrentStreams: maxConcurrentStreams,
		}
		hc := s.NewConn(conn, end)
		ended = hc
		if !b.track(hc) {
			return
		}
		served = true
		hc.Serve()
		return
	}
	// HTTP/1.1 (ALPN http/1.1, none, or plain HTTP), served on this goroutine (broker/http1);
	// every byte the parser sees has passed the framing guard. Between requests a quiet
	// tunnel is parked.
	s := &http1.Server{
		Handler:           handler,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		Linger:            parkAfter,
		BaseContext:       http1Context,
	}
	hc := s.NewConn(wire.Guard(conn, framingRejection), end)
	ended = hc
	if !b.track(hc) {
		return
	}
	served = true
	hc.Serve()
}

// http1Context is the parent of the contexts of an HTTP/1.1 tunnel's requests: the upstream
// client sends them over HTTP/1.1 too (upstream.WithHTTP1; see outbound).
var http1Context = upstream.WithHTTP1(context.Background())

// parkAfter is how long an HTTP/1.1 tunnel with no request in it keeps its goroutine and
// buffers before it is parked (http1.Server.Linger). Requests that follow each other more
// closely (a busy client) find it served; a parked tunnel holds its TLS state and one small
// goroutine.
const parkAfter = 100 * time.Millisecond

// openTunnels counts the intercepted tunnels open, for the metrics.
func (b *Broker) openTunnels() (n int) {
	b.tunnels.Range(func(_, _ any) bool { n++; return true })
	return n
}

// shutdowner is a tunnel's server, which a drain shuts down.
type shutdowner interface {
	Shutdown(context.Context) error
}

// track records a tunnel's server for a drain; it reports false, and records nothing, when a
// drain has already begun.
func (b *Broker) track(s shutdowner) bool {
	b.tunnels.Store(s, struct{}{})
	if b.draining.Load() { // a drain began during the handshake: serve nothing more
		b.tunnels.Delete(s)
		return false
	}
	return true
}

// maxConcurrentStreams bounds the requests an agent runs at once on one HTTP/2 tunnel: all of
// them share the tunnel's one connection slot (proxy.max_connections_per_agent).
const maxConcurrentStreams = 100

// pingTimeout is how long an HTTP/2 tunnel whose agent has been silent for idleTimeout waits
// for the answer to a PING before it is closed, like a dead HTTP/1.1 connection is closed by
// its idle timeout. Unencrypted HTTP/2 (h2c) is not served, and extended CONNECT (RFC 8441,
// WebSockets over HTTP/2) is not offered; a CONNECT stream is refused anyway (see
// requestTarget).
const pingTimeout = 15 * time.Second

// newMitmTLS is the agent-facing TLS config of intercepted tunnels, one for all of them: a
// tunnel's certificate is always that of its CONNECT host, found from the connection the
// handshake runs on (a *peekedConn, which knows its tunnel). A ClientHello naming another host
// (SNI) is recorded on the tunnel, and every request in it is then refused with a 403 that the
// audit log explains.
func (b *Broker) newMitmTLS() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// h2 first: a client that offers both gets HTTP/2 (see intercept).
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			pc, ok := hello.Conn.(*peekedConn)
			if !ok {
				return nil, errors.New("TLS handshake outside an intercepted tunnel")
			}
			tun := pc.tun
			if sni := strings.ToLower(strings.TrimSuffix(hello.ServerName, ".")); sni != "" && sni != tun.target.host {
				tun.sniMismatch = hello.ServerName
			}
			// The upstream connection is dialled now (a TCP and TLS handshake only; nothing
			// is sent before a request has been decided), in the protocol the agent will
			// speak: HTTP/1.1 unless it offers h2. Port 80 is left out: what follows there is
			// plain HTTP as a rule.
			if tun.prepare && tun.sniMismatch == "" && tun.target.port != 80 && tun.target.scheme != "http" {
				b.gen.Load().transport.Prepare(tun.target.hostPort(), !slices.Contains(hello.SupportedProtos, "h2"))
			}
			return b.certs.Get(tun.target.host)
		},
	}
}

// serveTunnel answers one request read from an intercepted tunnel.
func (b *Broker) serveTunnel(w http.ResponseWriter, r *http.Request, tun *tunnel) {
	resp := b.exchange(r, tun)
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		b.switchProtocols(w, resp)
		return
	}
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = vs
	}
	if resp.Close && r.ProtoMajor == 1 {
		// Not on HTTP/2: a connection-specific field has no place there (RFC 9113, 8.2.2;
		// broker/http2srv leaves it out), and the connection carries other streams.
		h.Set("Connection", "close")
	}
	for k := range resp.Trailer {
		if httpguts.ValidTrailerHeader(k) {
			h.Add("Trailer", k)
		}
	}
	w.WriteHeader(resp.StatusCode)
	if !copyFlushing(w, resp.Body) {
		// The body was cut short (the upstream failed, or the agent went away): the response
		// must not look whole to the agent, as a chunked one would once ended. The server
		// ends the connection (HTTP/1.1) or resets the stream (HTTP/2) without its end.
		panic(http.ErrAbortHandler)
	}
	// Only after the whole body: the transport fills in trailer values at its end, and
	// respond has scrubbed them by then. Names not announced above are sent too.
	for k, vs := range resp.Trailer {
		if httpguts.ValidTrailerHeader(k) {
			h[http.TrailerPrefix+k] = vs
		}
	}
	// The agent has its response before the exchange's bookkeeping (the audit event, the
	// metrics: resp.Body.Close) runs, where the server can end it early (broker/http1).
	if f, ok := w.(interface{ Finish() error }); ok {
		_ = f.Finish()
	}
}

// copyFlushing streams body to w, flushing after every write so a server-sent event or a
// chunk reaches the agent as soon as upstream produced it. The last bytes (a read that also
// ends the body) are not flushed here: the server sends them with the end of the response,
// in one write. It reports whether body was read to its end and all of it was written to w.
func copyFlushing(w http.ResponseWriter, body io.Reader) bool {
	rc := http.NewResponseController(w)
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return false
			}
			if err == nil && rc.Flush() != nil {
				return false
			}
		}
		if err != nil {
			return err == io.EOF
		}
	}
}

// copyBufs holds copyFlushing's buffers: one per response would be 32 KiB allocated and
// cleared for every request, most of whose bodies are far smaller.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// switchProtocols completes a WebSocket upgrade: the 101 goes to the agent, then bytes are
// copied both ways until either side ends.
func (b *Broker) switchProtocols(w http.ResponseWriter, resp *http.Response) {
	up, ok := resp.Body.(io.ReadWriter)
	if !ok {
		http.Error(w, "upgrade failed", http.StatusBadGateway)
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	head := *resp
	head.Body = nil
	if err := head.Write(brw); err != nil || brw.Flush() != nil {
		return
	}
	if s, ok := conn.(switcher); ok {
		s.Switch() // the tunnel's framing guard: what follows is WebSocket frames
	}
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(up, brw) // agent -> upstream, including bytes already buffered
		if c, ok := up.(io.Closer); ok {
			_ = c.Close()
		}
		close(done)
	}()
	_, _ = io.Copy(conn, up) // upstream -> agent
	_ = conn.Close()
	<-done
}

// peekedConn is a tunnel's conn, whose first bytes were read into r.
type peekedConn struct {
	net.Conn
	r   *bufio.Reader
	tun *tunnel
}

func (c *peekedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
