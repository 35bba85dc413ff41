package http1

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/capbroker/capbroker/broker/wire"
	"github.com/capbroker/capbroker/internal/deadline"
)

// shortBody is how much of a body whose length the handler did not set is held back to learn
// it: a body that ends within it (and is not flushed) is sent with a Content-Length, a longer
// one chunked. net/http's server holds 2 KiB.
const shortBody = 2 << 10

// response is the response to the connection's current request; it is the connection's,
// reset for each request (see Conn.newWriter). A handler reaches it through its writer, whose
// calls fail once its request is over: gen counts the requests, and each call says the one
// it is for.
type response struct {
	c   *Conn
	mu  sync.Mutex    // the handler's writes and the body's 100 Continue
	gen atomic.Uint64 // the request's; set under mu, read with it or not
	// tail sends a record's tail held back by flush (see holdTail), when no write came:
	// tailDelay after the last hold.
	tail    deadline.Timer
	tailGen uint64 // the request whose tail it sends
	responseState
}

// responseState is what a response starts each request with afresh.
type responseState struct {
	req         *http.Request
	header      http.Header
	wroteHeader bool  // WriteHeader was called (or implied by Write)
	status      int   // its status
	headSent    bool  // the status line and header are in the writer
	written     int64 // body bytes the handler wrote
	unflushed   int   // body bytes written since the last flush
	short       []byte
	chunked     bool
	noBody      bool  // HEAD, 204, 304: the body is not sent
	closeAfter  bool  // the connection ends after this response
	finished    bool  // the response has ended (Finish)
	err         error // the first write that failed: the rest fail alike
	// contentLength is the body's length once known: the handler's Content-Length, parsed
	// when the header was written, or the short body's; -1 until then.
	contentLength int64
}

// lock locks the response for a call of the request of generation gen; it reports false,
// unlocked, when that request is over.
func (w *response) lock(gen uint64) bool {
	w.mu.Lock()
	if w.gen.Load() != gen {
		w.mu.Unlock()
		return false
	}
	return true
}

// retire ends the handler's hold on the response: calls for its request fail from now on.
// It returns the generation the server finishes the response with.
func (w *response) retire() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gen.Add(1)
}

var shortBufs = sync.Pool{New: func() any { b := make([]byte, 0, shortBody); return &b }}

func (w *response) writeHeader(gen uint64, code int) {
	if !w.lock(gen) {
		return
	}
	defer w.mu.Unlock()
	w.writeHeaderLocked(code)
}

func (w *response) writeHeaderLocked(code int) {
	if w.c.hijacked || w.wroteHeader {
		return
	}
	if code < 100 || code > 999 {
		panic("http1: invalid WriteHeader code " + strconv.Itoa(code))
	}
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		// An informational response goes out at once; the final one follows.
		w.writeStatusAndHeader(code)
		_, _ = w.c.bw.WriteString("\r\n")
		w.err = w.c.bw.Flush()
		return
	}
	w.wroteHeader, w.status = true, code
	w.noBody = w.req.Method == http.MethodHead || code == http.StatusNoContent || code == http.StatusNotModified || code < 200
	if cl := w.header.Get("Content-Length"); cl != "" {
		n, err := strconv.ParseInt(cl, 10, 64)
		if err != nil || n < 0 {
			w.header.Del("Content-Length") // as net/http's server: an invalid one is not sent
		} else {
			w.contentLength = n
		}
	}
}

func (w *response) write(gen uint64, p []byte) (int, error) {
	if !w.lock(gen) {
		return 0, errFinished
	}
	defer w.mu.Unlock()
	if w.c.hijacked {
		return 0, http.ErrHijacked
	}
	if w.finished {
		return 0, errFinished
	}
	if !w.wroteHeader {
		w.writeHeaderLocked(http.StatusOK)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if w.noBody {
		if w.req.Method == http.MethodHead {
			return len(p), nil
		}
		return 0, http.ErrBodyNotAllowed
	}
	if w.contentLength >= 0 && w.written+int64(len(p)) > w.contentLength {
		return 0, http.ErrContentLength
	}
	w.written += int64(len(p))
	w.unflushed += len(p)
	if !w.headSent {
		if w.contentLength < 0 && !w.hasTrailers() && len(w.short)+len(p) <= shortBody {
			if w.short == nil {
				w.short = (*shortBufs.Get().(*[]byte))[:0]
			}
			w.short = append(w.short, p...)
			return len(p), nil
		}
		w.sendHead(false, p)
	}
	if err := w.writeBody(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// sendHead writes the status line and the header, framing the body: the handler's
// Content-Length; with done (the handler returned) and a short body held back, its length;
// else chunked, or for HTTP/1.0, up to the connection's end. The fields this writer adds
// (framing, Date, a sniffed Content-Type, Connection) are written after the handler's,
// without changing its header map; first is the body's first bytes, to sniff a Content-Type
// from when the handler set none.
func (w *response) sendHead(done bool, first []byte) {
	h := w.header
	delete(h, "Transfer-Encoding") // the framing is this writer's to choose
	var framing string
	switch {
	case w.noBody || w.contentLength >= 0:
	case done && !w.hasTrailers():
		w.contentLength = int64(len(w.short))
		framing = "Content-Length: " + strconv.Itoa(len(w.short)) + "\r\n"
	case w.req.ProtoAtLeast(1, 1):
		w.chunked = true
		framing = "Transfer-Encoding: chunked\r\n"
	default:
		w.closeAfter = true
	}
	if w.req.Close || w.wantsClose() {
		w.closeAfter = true
	}
	w.c.mu.Lock()
	draining := w.c.draining
	w.c.mu.Unlock()
	if draining {
		w.closeAfter = true
	}
	delete(h, "Connection") // said below, once
	w.writeStatusAndHeader(w.status)
	bw := w.c.bw
	bw.WriteString(framing)
	if len(w.short) > 0 {
		first = w.short
	}
	if _, ok := h["Content-Type"]; !ok && !w.noBody && len(first) > 0 {
		bw.WriteString("Content-Type: ")
		bw.WriteString(http.DetectContentType(first))
		bw.WriteString("\r\n")
	}
	if _, ok := h["Date"]; !ok {
		bw.WriteString("Date: ")
		bw.WriteString(wire.Date())
		bw.WriteString("\r\n")
	}
	switch {
	case w.closeAfter:
		bw.WriteString("Connection: close\r\n")
	case !w.req.ProtoAtLeast(1, 1):
		bw.WriteString("Connection: keep-alive\r\n")
	}
	bw.WriteString("\r\n")
	w.headSent = true
	if len(w.short) > 0 {
		short := w.short
		w.short = nil
		_ = w.writeBody(short)
		short = short[:0]
		shortBufs.Put(&short)
	}
}

// wantsClose reports whether the handler said the connection ends with this response.
func (w *response) wantsClose() bool {
	for _, v := range w.header["Connection"] {
		if httpguts.HeaderValuesContainsToken([]string{v}, "close") {
			return true
		}
	}
	return false
}

// hasTrailers reports whether the handler declared or set trailers: they need a chunked body.
func (w *response) hasTrailers() bool {
	if _, ok := w.header["Trailer"]; ok {
		return true
	}
	for k := range w.header {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			return true
		}
	}
	return false
}

// writeStatusAndHeader writes the status line and the header fields, in a stable order;
// trailers (http.TrailerPrefix) are left for the end of the body, values' line breaks are
// spaces, and invalid names are left out.
func (w *response) writeStatusAndHeader(code int) {
	bw := w.c.bw
	bw.WriteString("HTTP/1.1 ")
	bw.WriteString(strconv.Itoa(code))
	bw.WriteByte(' ')
	if text := http.StatusText(code); text != "" {
		bw.WriteString(text)
	} else {
		bw.WriteString("status code " + strconv.Itoa(code))
	}
	bw.WriteString("\r\n")
	writeFields(bw, w.header, false)
}

var errFinished = errors.New("http1: write after the response was finished, or its handler returned")

var newlines = strings.NewReplacer("\r\n", " ", "\r", " ", "\n", " ")

// writeFields writes h's fields (or, with trailers, the http.TrailerPrefix ones without it).
func writeFields(bw *bufio.Writer, h http.Header, trailers bool) {
	keys := make([]string, 0, 16) // on the stack for most headers
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		name := k
		if strings.HasPrefix(k, http.TrailerPrefix) != trailers {
			continue
		}
		if trailers {
			name = k[len(http.TrailerPrefix):]
		}
		if !httpguts.ValidHeaderFieldName(name) {
			continue
		}
		for _, v := range h[k] {
			bw.WriteString(name)
			bw.WriteString(": ")
			v = strings.TrimSpace(v)
			if strings.ContainsAny(v, "\r\n") {
				v = newlines.Replace(v)
			}
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
}

func (w *response) writeBody(p []byte) error {
	if w.err != nil {
		return w.err
	}
	bw := w.c.bw
	if w.chunked {
		bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(len(p)), 16)) // no string made
		bw.WriteString("\r\n")
		// Through the buffer in pieces it holds: bufio writes a larger one straight through,
		// and the TLS connection would send its tail in a record of its own, before the CRLF.
		for len(p) > bw.Size() && w.err == nil {
			_, w.err = bw.Write(p[:bw.Size()])
			p = p[bw.Size():]
		}
		if w.err != nil {
			return w.err
		}
	}
	_, w.err = bw.Write(p)
	if w.chunked && w.err == nil {
		_, w.err = bw.WriteString("\r\n")
	}
	return w.err
}

// flush sends what was written so far to the agent.
func (w *response) flush(gen uint64) error {
	if !w.lock(gen) {
		return errFinished
	}
	defer w.mu.Unlock()
	if w.c.hijacked {
		return http.ErrHijacked
	}
	if !w.wroteHeader {
		w.writeHeaderLocked(http.StatusOK)
	}
	if !w.headSent {
		w.sendHead(false, nil)
	}
	if w.holdTail(gen) {
		return nil
	}
	w.unflushed = 0
	if w.err == nil {
		w.err = w.c.bw.Flush()
	}
	return w.err
}

// tailDelay bounds how long flush holds back a record's tail. A variable for tests.
var tailDelay = time.Millisecond

// maxTail is the most flush holds back. Each 16 KiB chunk adds its 8 bytes of framing to what
// is carried: 1 KiB is a flush, and a short record, in 128 chunks.
const maxTail = 1 << 10

// holdTail reports whether flush may leave what is buffered for the next write: a chunked
// body written about a record or more at a time (a download streamed as it arrives, 16 KiB per
// upstream record) fills whole records, and its size line and CRLF leave a few bytes over
// each time; flushed at once they would be a TLS record, and a write, of their own per chunk.
// They go with the next chunk, or after tailDelay when none came, or at the response's end.
// A small write (a server-sent event) is flushed at once.
func (w *response) holdTail(gen uint64) bool {
	if !w.chunked || w.unflushed < recordSize/2 || w.c.bw.Buffered() > maxTail || w.err != nil {
		return false
	}
	w.unflushed = 0
	w.tailGen = gen
	w.tail.Set(tailDelay, w.sendTail)
	return true
}

// sendTail flushes a tail holdTail held back, unless its response has ended (it was flushed
// then) or moved on. A download holds a tail after every chunk: a later hold moves the
// deadline, not the timer, and sendTail then waits for it (internal/deadline says why).
func (w *response) sendTail() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.tail.Due() {
		return
	}
	if w.gen.Load() != w.tailGen || w.finished || w.c.hijacked || w.c.bw == nil || w.err != nil {
		return
	}
	w.err = w.c.bw.Flush()
}

// finish ends the response, once: the held-back body, the chunked end and trailers,
// everything flushed. A body shorter than its Content-Length ends the connection.
func (w *response) finish(gen uint64) error {
	if !w.lock(gen) {
		return errFinished
	}
	defer w.mu.Unlock()
	if w.finished {
		return w.err
	}
	w.finished = true
	if !w.wroteHeader {
		w.writeHeaderLocked(http.StatusOK)
	}
	if !w.headSent {
		w.sendHead(true, nil)
	}
	bw := w.c.bw
	if w.chunked {
		bw.WriteString("0\r\n")
		writeFields(bw, w.header, true)
		bw.WriteString("\r\n")
	}
	if !w.noBody && w.contentLength >= 0 && w.written < w.contentLength {
		w.closeAfter = true
	}
	if w.err == nil {
		w.err = bw.Flush()
	}
	return w.err
}

// sendContinue answers Expect: 100-continue, unless the response has begun.
func (w *response) sendContinue(gen uint64) error {
	if !w.lock(gen) {
		return errFinished
	}
	defer w.mu.Unlock()
	if w.wroteHeader || w.c.hijacked {
		return nil
	}
	_, _ = io.WriteString(w.c.bw, "HTTP/1.1 100 Continue\r\n\r\n")
	return w.c.bw.Flush()
}

// Hijack hands the connection to the handler, with what was read of it and not yet parsed; the
// connection is no longer served, and ends when the handler closes it.
func (w *response) hijack(gen uint64) (net.Conn, *bufio.ReadWriter, error) {
	if !w.lock(gen) {
		return nil, nil, errFinished
	}
	defer w.mu.Unlock()
	c := w.c
	if c.hijacked {
		return nil, nil, http.ErrHijacked
	}
	if w.headSent {
		if err := c.bw.Flush(); err != nil {
			return nil, nil, err
		}
	}
	c.stopWatch()
	c.mu.Lock()
	c.hijacked = true
	c.mu.Unlock()
	_ = c.raw.SetDeadline(time.Time{})
	c.src.want, c.src.applied = time.Time{}, time.Time{}
	hc := &hijackedConn{Conn: c.raw, c: c}
	// The reader keeps reading through the source (a byte a park put back comes first); it
	// and the writer now belong to the handler, not to the pool.
	br, bw := c.br, c.bw
	c.br, c.bw = nil, nil
	bw.Reset(hc)
	return hc, bufio.NewReadWriter(br, bw), nil
}

// hijackedConn is the connection as the handler takes it: closing it ends the connection.
type hijackedConn struct {
	net.Conn
	c *Conn
}

func (h *hijackedConn) Close() error {
	h.c.close()
	return nil
}

// Switch is the framing guard's (broker/wire): the protocol was switched.
func (h *hijackedConn) Switch() {
	if s, ok := h.Conn.(interface{ Switch() }); ok {
		s.Switch()
	}
}
