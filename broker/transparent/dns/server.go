// Package dns is the sandbox's resolver in transparent mode (docs/transparent.md): it answers
// a name the policy could allow with an address from the broker's pool (transparent.Names),
// which the sandbox routes to the broker's transparent listener, and refuses every other
// query with an audit event. It never forwards a query anywhere: the only data a query can
// carry out of the sandbox ends in the broker's audit log, at a bounded rate.
//
// Messages are parsed and built with github.com/miekg/dns; the sockets are served here, so
// that each message's size on the wire is checked before it is parsed.
package dns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker/transparent"
)

// Query is one question the resolver was asked.
type Query struct {
	Source netip.Addr
	// Name is the name asked about, canonical (lower case, no trailing dot); for a PTR query
	// of a pool address, the name the address was answered for. "" when the message had no
	// question the resolver could read.
	Name string
	// Type is the query type ("A", "AAAA", "TXT", "TYPE65432"...), "" with no question.
	Type  string
	Proto string // "udp" or "tcp"
}

// Verdict is the policy's answer about a name for the agent at a source address.
type Verdict struct {
	// Agent is the agent the source address identifies, "" for none.
	Agent string
	// Allow: some connection to the name could be allowed (an allow or an ask).
	Allow bool
	// WouldDeny: the policy denied, and policy.mode monitor answers the name anyway.
	WouldDeny bool
	// Reason is the policy's (or the resolver's) reason, shown in a refusal's EDE text.
	Reason string
	// Revision and DecisionID identify the decision, for the audit event.
	Revision, DecisionID string
}

// Event is what the resolver asks Policy to audit: a refusal, or an answer.
type Event struct {
	Query
	Verdict
	// Count is how many queries the event stands for: more than 1 for the summary of the
	// queries a source sent over its rate bound.
	Count int
}

// Policy decides and audits the resolver's queries; the broker implements it.
type Policy interface {
	// Decide says whether q.Name may be answered for the agent at q.Source.
	Decide(ctx context.Context, q Query) Verdict
	// Audit writes one audit event. Events with no agent name the source alone: the
	// implementation may identify the agent itself.
	Audit(e Event)
}

// Options configure a Server.
type Options struct {
	Policy Policy
	Names  *transparent.Names
	// TTL of the answers; an allowed name is audited once per agent per TTL.
	TTL time.Duration
	// QueriesPerSecond bounds each source address's queries, with bursts of twice as many.
	QueriesPerSecond int
	// HostNames are the sandbox's own host names (canonical): with single-label names and
	// localhost, the names a sandbox looks up about itself (ownName).
	HostNames []string
	Log       zerolog.Logger
	// Now is the clock (nil: time.Now), for tests.
	Now func() time.Time
}

// Bounds of the resolver.
const (
	// maxMessage is the largest DNS message served, UDP or TCP; a larger one is refused.
	maxMessage = 4096
	// maxPlainUDP is the largest UDP query without EDNS (RFC 1035's 512 bytes).
	maxPlainUDP = 512
	// maxUDPHandlers bounds the UDP queries being answered at once; the socket's reader
	// waits for a free one (the kernel's buffer absorbs, then drops, the excess).
	maxUDPHandlers = 64
	// maxTCPConns bounds the TCP connections served at once, and maxTCPPerSource those of
	// one source address; more are closed at once.
	maxTCPConns     = 256
	maxTCPPerSource = 16
	// tcpIdle ends a TCP connection that sends no query for this long.
	tcpIdle = 10 * time.Second
	// decideTimeout bounds one query's policy decision.
	decideTimeout = 5 * time.Second
)

// Listener holds the resolver's sockets: UDP and TCP on the same address and port.
type Listener struct {
	udp *net.UDPConn
	tcp *net.TCPListener
}

// Listen binds UDP and TCP on addr (host:port). Port 0 takes a free port for both.
func Listen(addr string) (*Listener, error) {
	// With port 0 the TCP port is the one the kernel gave UDP, which another socket may
	// hold for TCP: try a few times.
	var lastErr error
	for range 10 {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return nil, err
		}
		udp := pc.(*net.UDPConn)
		taddr := udp.LocalAddr().(*net.UDPAddr)
		host, _, _ := net.SplitHostPort(addr)
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(taddr.Port)))
		if err == nil {
			return &Listener{udp: udp, tcp: ln.(*net.TCPListener)}, nil
		}
		udp.Close()
		lastErr = err
		if _, port, _ := net.SplitHostPort(addr); port != "0" {
			break
		}
	}
	return nil, lastErr
}

// Addr is the address the resolver listens on (UDP and TCP).
func (l *Listener) Addr() net.Addr { return l.tcp.Addr() }

// Close closes both sockets.
func (l *Listener) Close() error {
	return errors.Join(l.udp.Close(), l.tcp.Close())
}

// Server answers queries on a Listener's sockets.
type Server struct {
	l      *Listener
	o      Options
	ctx    context.Context
	cancel context.CancelFunc
	rate   *rateBound
	seen   *answered
	wg     sync.WaitGroup
	udpSem chan struct{}
	tcpSem chan struct{}
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	perSrc map[netip.Addr]int // TCP connections by source
	closed bool
}

// Serve starts answering queries on l's sockets, until Close.
func Serve(l *Listener, o Options) *Server {
	if o.Now == nil {
		o.Now = time.Now
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		l: l, o: o, ctx: ctx, cancel: cancel,
		seen:   newAnswered(),
		udpSem: make(chan struct{}, maxUDPHandlers),
		tcpSem: make(chan struct{}, maxTCPConns),
		conns:  map[net.Conn]struct{}{},
		perSrc: map[netip.Addr]int{},
	}
	s.rate = newRateBound(o.QueriesPerSecond, o.Now, o.Policy.Audit)
	s.wg.Add(2)
	go s.serveUDP()
	go s.serveTCP()
	return s
}

// Close stops the server: the sockets and TCP connections are closed, the queries being
// answered finish, and the pending summaries of over-rate queries are audited.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	err := s.l.Close()
	s.cancel()
	s.wg.Wait()
	s.rate.flushAll()
	return err
}

func (s *Server) serveUDP() {
	defer s.wg.Done()
	for {
		buf := make([]byte, maxMessage+1) // one byte more: a larger message is seen as such
		n, from, err := s.l.udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if s.isClosed() {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.o.Log.Warn().Err(err).Msg("resolver: reading a UDP query")
			continue
		}
		s.udpSem <- struct{}{}
		s.wg.Add(1)
		go func() {
			defer func() { <-s.udpSem; s.wg.Done() }()
			size := n
			if n > maxMessage {
				size = maxMessage + 1 // the rest was cut: at least this
			}
			if out := s.answer(buf[:n], size, from.Addr().Unmap(), "udp"); out != nil {
				_, _ = s.l.udp.WriteToUDPAddrPort(out, from)
			}
		}()
	}
}

func (s *Server) serveTCP() {
	defer s.wg.Done()
	for {
		c, err := s.l.tcp.Accept()
		if err != nil {
			if s.isClosed() {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.o.Log.Warn().Err(err).Msg("resolver: accepting a TCP connection")
			time.Sleep(10 * time.Millisecond) // e.g. out of file descriptors: do not spin
			continue
		}
		select {
		case s.tcpSem <- struct{}{}:
		default:
			_ = c.Close()
			continue
		}
		src := sourceOf(c)
		if ok, closed := s.track(c, src, true); !ok {
			<-s.tcpSem
			_ = c.Close()
			if closed {
				return
			}
			continue
		}
		s.wg.Add(1)
		go func() {
			defer func() { s.track(c, src, false); _ = c.Close(); <-s.tcpSem; s.wg.Done() }()
			s.serveConn(c, src)
		}()
	}
}

// serveConn answers the queries of one TCP connection, each a 2-byte length and a message.
func (s *Server) serveConn(c net.Conn, src netip.Addr) {
	var lenBuf [2]byte
	for {
		_ = c.SetDeadline(time.Now().Add(tcpIdle))
		if _, err := io.ReadFull(c, lenBuf[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(lenBuf[:]))
		msg := make([]byte, n) // at most 64 KiB: the length is 16 bits
		if _, err := io.ReadFull(c, msg); err != nil {
			return
		}
		out := s.answer(msg, n, src, "tcp")
		if out == nil {
			return
		}
		frame := make([]byte, 2+len(out))
		binary.BigEndian.PutUint16(frame, uint16(len(out)))
		copy(frame[2:], out)
		if _, err := c.Write(frame); err != nil {
			return
		}
		if n > maxMessage {
			return // refused; what follows is not worth reading
		}
	}
}

// track adds c (add true) to the connections served, or removes it. ok false: not added,
// because the server is closed (closed true) or src has maxTCPPerSource connections.
func (s *Server) track(c net.Conn, src netip.Addr, add bool) (ok, closed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !add {
		delete(s.conns, c)
		if s.perSrc[src]--; s.perSrc[src] <= 0 {
			delete(s.perSrc, src)
		}
		return true, s.closed
	}
	if s.closed {
		return false, true
	}
	if s.perSrc[src] >= maxTCPPerSource {
		return false, false
	}
	s.conns[c] = struct{}{}
	s.perSrc[src]++
	return true, false
}

func sourceOf(c net.Conn) netip.Addr {
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// String names the server for logs.
func (s *Server) String() string { return fmt.Sprintf("resolver on %s", s.l.Addr()) }
