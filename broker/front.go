package broker

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/capbroker/capbroker/broker/policy"
)

// The front is the explicit proxy's listener as net/http's server sees it. Every connection
// the admission lets in (admittingListener: its slot taken, its bytes behind the framing
// guard) has its first request read here, on a goroutine of its own. A well-formed CONNECT,
// what an agent's connection almost always begins with, is decided (connect) and its tunnel
// served on that goroutine: net/http's server and goproxy would spend on it a connection
// object, a context chain, a background read started and aborted for the hijack, and a
// hijack (BenchmarkConnect: 0.89x the CPU per CONNECT, 64 allocations against 85).
// Everything else, a plain-HTTP proxy request or a request net/http's server would answer
// with an error (a head too large, a bad Host, an Expect), goes on to net/http's server with
// goproxy, as before, every byte read here read again there: it answers it exactly as it
// would have.
type front struct {
	net.Listener // the admitting listener
	b            *Broker
	handed       chan acceptResult // connections (or the listener's error) for net/http's server
	done         chan struct{}
	closeOnce    sync.Once

	mu     sync.Mutex
	closed bool
	// active counts the CONNECTs read and being decided: a drain waits for them, as net/http's
	// Shutdown waits for a request being handled, until the tunnel takes its connection.
	active sync.WaitGroup
}

func (b *Broker) newFront(ln net.Listener) *front {
	f := &front{Listener: ln, b: b, handed: make(chan acceptResult), done: make(chan struct{})}
	go f.pump()
	return f
}

// pump accepts connections until the listener fails, and reads each one's first request.
func (f *front) pump() {
	for {
		c, err := f.Listener.Accept()
		if err == nil {
			go f.serve(c)
			continue
		}
		select {
		case f.handed <- acceptResult{nil, err}:
		case <-f.done:
			return
		}
		if errors.Is(err, net.ErrClosed) {
			return
		}
	}
}

// Accept returns the connections for net/http's server.
func (f *front) Accept() (net.Conn, error) {
	select {
	case r := <-f.handed:
		return r.c, r.err
	case <-f.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting; a CONNECT whose head is read after it is not served.
func (f *front) Close() error {
	f.closeOnce.Do(func() {
		f.mu.Lock()
		f.closed = true
		f.mu.Unlock()
		close(f.done)
	})
	return f.Listener.Close()
}

// wait waits, until ctx ends, for the CONNECTs being decided to be done with.
func (f *front) wait(ctx context.Context) {
	done := make(chan struct{})
	go func() { f.active.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// enter counts a CONNECT about to be decided, unless the front was closed.
func (f *front) enter() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.active.Add(1)
	return true
}

// hand gives c to net/http's server.
func (f *front) hand(c net.Conn) {
	select {
	case f.handed <- acceptResult{c, nil}:
	case <-f.done:
		_ = c.Close()
	}
}

// maxFirstHead bounds what the front reads of a first request's head: net/http's server reads
// that much (MaxHeaderBytes and its 4 KiB allowance) before it answers 431.
const maxFirstHead = maxHeaderBytes + 4096

// serve reads c's first request head, within the read-header timeout, and serves a CONNECT or
// hands c on.
func (f *front) serve(c net.Conn) {
	ac, ok := c.(*admittedConn)
	if !ok { // not from the admitting listener: net/http's server refuses its requests
		f.hand(c)
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(readHeaderTimeout))
	bp := heads.Get().(*[]byte)
	buf, end, err := readFirstHead(c, (*bp)[:0])
	var r *http.Request
	if end > 0 {
		r = connectRequest(buf[:end])
	}
	// What is read again (all of it by net/http's server; what follows the head by a
	// tunnel) is kept apart from the buffer, which goes back to the pool (it is one only
	// while nothing larger was needed).
	from := 0
	if r != nil {
		from = end
	}
	rest := append([]byte(nil), buf[from:]...)
	if cap(buf) == cap(*bp) {
		heads.Put(bp)
	}
	switch {
	case err != nil && (len(rest) == 0 || !errors.Is(err, io.EOF)):
		// As net/http's server: the agent left or sent nothing in time (no answer), or the
		// framing guard refused what it sent (and answered).
		_ = c.Close()
	case r == nil:
		f.hand(&replayedConn{admittedConn: ac, pending: rest})
	case !f.enter():
		_ = c.Close() // a drain began: as net/http's server, which no longer serves it
	default:
		_ = c.SetReadDeadline(time.Time{})
		f.b.serveConnect(ac, r, rest, f.active.Done)
	}
}

// heads are the front's buffers for first request heads: a CONNECT's fits one.
var heads = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// readFirstHead reads from c until the end of the first request's head, which the framing
// guard has made end with CRLF CRLF, into buf, and returns what it read and where the head
// ends; or, as soon as what it read is not a CONNECT, or on an error, with end -1.
func readFirstHead(c net.Conn, buf []byte) (_ []byte, end int, err error) {
	for {
		if len(buf) == cap(buf) {
			if len(buf) >= maxFirstHead {
				return buf, -1, nil // net/http's server answers 431
			}
			buf = slices.Grow(buf, min(max(cap(buf), 1024), maxFirstHead-len(buf)))
		}
		from := max(len(buf)-3, 0)
		n, rerr := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if !isConnect(buf) {
			return buf, -1, rerr
		}
		if i := bytes.Index(buf[from:], []byte("\r\n\r\n")); i >= 0 {
			return buf, from + i + 4, nil
		}
		if rerr != nil {
			return buf, -1, rerr
		}
	}
}

// isConnect reports whether b is, so far, the start of a CONNECT's request line.
func isConnect(b []byte) bool {
	const m = "CONNECT "
	k := min(len(b), len(m))
	return string(b[:k]) == m[:k]
}

// connectRequest parses a CONNECT's head as net/http's server does, and returns nil for one
// net/http's server would refuse itself (or that is not a CONNECT after all).
func connectRequest(head []byte) *http.Request {
	if r := parseConnect(head); r != nil {
		return r
	}
	return readConnect(head)
}

// readConnect is connectRequest with http.ReadRequest: for any CONNECT parseConnect leaves.
func readConnect(head []byte) *http.Request {
	br := headReaders.Get().(*bufio.Reader)
	br.Reset(bytes.NewReader(head))
	r, err := http.ReadRequest(br)
	br.Reset(nil)
	headReaders.Put(br)
	if err != nil || r.Method != http.MethodConnect || r.ProtoMajor != 1 || r.Header.Get("Expect") != "" {
		return nil
	}
	// Whatever the head says of a body, what follows it is the tunnel's (the framing guard
	// passes it through): the request has none, and keeps nothing of the head's reader.
	r.Body, r.ContentLength, r.TransferEncoding = http.NoBody, 0, nil
	// http.ReadRequest has taken the Host field out of the header (the request's host is
	// the CONNECT's authority): net/http's server refuses a malformed one all the same.
	for _, line := range bytes.Split(head, []byte("\r\n")) {
		if len(line) > 5 && bytes.EqualFold(line[:5], []byte("host:")) && !httpguts.ValidHostHeader(string(bytes.Trim(line[5:], " \t"))) {
			return nil
		}
	}
	for k, vs := range r.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return nil
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return nil
			}
		}
	}
	return r
}

// parseConnect parses head, which ends with CRLF CRLF, when it is a CONNECT in the one shape
// agents send: "CONNECT host:port HTTP/1.1", the host of letters, digits, dots and hyphens,
// then header fields each once, none of those that would make net/http read more into the
// request (Connection, Content-Length, Transfer-Encoding, Trailer, Pragma, Expect), none
// folded, the Host field valid (httpguts, as net/http's server checks it). It returns the
// request http.ReadRequest would return, with no body; for any other head nil, and
// readConnect parses it with http.ReadRequest. It never refuses: what it does not take goes
// to the slow path, which decides as net/http's server would. FuzzParseConnect holds the two
// to the same request.
func parseConnect(head []byte) *http.Request {
	const prefix, proto = "CONNECT ", " HTTP/1.1\r\n"
	if !bytes.HasPrefix(head, []byte(prefix)) {
		return nil
	}
	s := string(head) // one string: every field below is a part of it
	authority, lines, ok := strings.Cut(s[len(prefix):], proto)
	if !ok || !connectAuthority(authority) || !strings.HasSuffix(lines, "\r\n") {
		return nil
	}
	lines = lines[:len(lines)-2] // each field line with its CRLF
	values := make([]string, strings.Count(lines, "\r\n"))
	h := make(http.Header, len(values))
	for i := 0; lines != ""; i++ {
		line, rest, _ := strings.Cut(lines, "\r\n")
		lines = rest
		name, value, ok := strings.Cut(line, ":")
		if !ok || !httpguts.ValidHeaderFieldName(name) {
			return nil // an obs-fold, a space before the colon...: the slow path decides
		}
		value = strings.Trim(value, " \t")
		if !httpguts.ValidHeaderFieldValue(value) {
			return nil
		}
		name = textproto.CanonicalMIMEHeaderKey(name)
		switch _, dup := h[name]; {
		case dup:
			return nil
		case name == "Host" && !httpguts.ValidHostHeader(value):
			return nil
		case slowFields[name]:
			return nil
		}
		values[i] = value
		h[name] = values[i : i+1 : i+1]
	}
	delete(h, "Host") // as http.ReadRequest: the CONNECT's authority is the request's host
	return &http.Request{
		Method: http.MethodConnect, URL: &url.URL{Host: authority}, RequestURI: authority,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: h, Host: authority, Body: http.NoBody,
	}
}

// slowFields are the header fields that make http.ReadRequest read more into a request than
// its head: a CONNECT with one goes to readConnect.
var slowFields = map[string]bool{
	"Connection": true, "Content-Length": true, "Transfer-Encoding": true, "Trailer": true,
	"Pragma": true, "Expect": true,
}

// connectAuthority reports whether a is host:port with a host of letters, digits, dots and
// hyphens and a port of one to five digits.
func connectAuthority(a string) bool {
	host, port, ok := strings.Cut(a, ":")
	if !ok || host == "" || port == "" || len(port) > 5 {
		return false
	}
	for i := range len(host) {
		switch c := host[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '-':
		default:
			return false
		}
	}
	for i := range len(port) {
		if port[i] < '0' || port[i] > '9' {
			return false
		}
	}
	return true
}

var headReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 1024) }}

// serveConnect decides a CONNECT the front read on c, then answers the refusal or serves the
// tunnel, with rest (what the agent sent after the head) read first. decided is called once
// the decision is made.
func (b *Broker) serveConnect(c *admittedConn, r *http.Request, rest []byte, decided func()) {
	r.RemoteAddr = c.RemoteAddr().String()
	ctx := &connectContext{Context: context.Background(), conn: c, watch: heldWatch{conn: c}}
	r = r.WithContext(ctx)
	x := b.begin(policy.PhaseConnect, r)
	open, err := b.connect(x, r)
	decided()
	if err != nil {
		resp := x.fail(r, err)
		bw := bufio.NewWriter(c)
		if resp.Write(bw) == nil {
			_ = bw.Flush()
		}
		_ = c.Close()
		return
	}
	if rest = append(rest, ctx.watch.read...); len(rest) > 0 {
		open(&replayedConn{admittedConn: c, pending: rest})
		return
	}
	open(c)
}

// connectContext is the context of a CONNECT the front read: the admitted connection it came
// on (claimConn) and its watch (watchHeld), in one value.
type connectContext struct {
	context.Context
	conn  *admittedConn
	watch heldWatch
}

func (c *connectContext) Value(key any) any {
	switch key.(type) {
	case admittedKey:
		return c.conn
	case heldWatchKey:
		return &c.watch
	}
	return c.Context.Value(key)
}

// replayedConn is an admitted connection whose first bytes were read already: they are read
// again first.
type replayedConn struct {
	*admittedConn
	pending []byte
}

func (c *replayedConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		if len(c.pending) == 0 {
			c.pending = nil
		}
		return n, nil
	}
	return c.admittedConn.Read(p)
}

// heldWatch notices an agent that goes away while its CONNECT is held for a person's approval
// (ask): net/http's server reads the connection while its handler runs, and cancels the
// request's context when that read fails; the front reads nothing until the tunnel is open.
type heldWatch struct {
	conn net.Conn
	read []byte // what the watch read: the tunnel's first bytes
}

type heldWatchKey struct{}

// watch returns parent, cancelled when the agent goes away before stop is called.
func (w *heldWatch) watch(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var b [1]byte
		n, err := w.conn.Read(b[:])
		w.read = append(w.read, b[:n]...)
		if err != nil && !isTimeout(err) {
			cancel()
		}
	}()
	return ctx, func() {
		_ = w.conn.SetReadDeadline(time.Unix(1, 0)) // ends the read
		<-done
		_ = w.conn.SetReadDeadline(time.Time{})
		cancel()
	}
}

// watchHeld is the context a request held for approval waits under: r's, cancelled too when
// the agent goes away, for a CONNECT the front read (see heldWatch).
func watchHeld(r *http.Request) (context.Context, func()) {
	if w, ok := r.Context().Value(heldWatchKey{}).(*heldWatch); ok {
		return w.watch(r.Context())
	}
	return r.Context(), func() {}
}
