package http2srv

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/capbroker/capbroker/broker/wire"
)

// responseWriter is the http.ResponseWriter of a stream's handler (also http.Flusher, its
// FlushError, and Finish; not http.Hijacker: an HTTP/2 stream cannot be taken over). The
// header block is sent with the first flush or the end of the response, so that a short
// response leaves as HEADERS and DATA frames in one write. The header sent is the handler's
// map as it is then, without its trailers: the fields the "Trailer" field declares and those
// named with http.TrailerPrefix, which are sent after the body.
type responseWriter struct {
	st  *stream
	req *http.Request

	mu            sync.Mutex
	header        http.Header
	status        int
	contentLength int64 // the handler's Content-Length, or -1
	written       int64
	noBody        bool   // HEAD, or a status without a body
	buf           []byte // body not yet sent
	unflushed     int    // body written since the last flush
	sentHeader    bool
	finished      bool // END_STREAM sent
	done          bool // the handler has returned
	err           error
}

// maxBuffered is the most body held before it is sent: a frame's worth.
const maxBuffered = maxFrame

var (
	errAfterDone = errors.New("http2: response used after its handler returned")
	errFinished  = errors.New("http2: write after the response was finished")
)

func (w *responseWriter) Header() http.Header {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return http.Header{}
	}
	if w.header == nil {
		w.header = make(http.Header, 8)
	}
	return w.header
}

func (w *responseWriter) WriteHeader(code int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done || w.finished {
		return
	}
	w.writeHeader(code)
}

// writeHeader sets the status (or sends an informational response); w.mu is held.
func (w *responseWriter) writeHeader(code int) {
	if w.status != 0 {
		return
	}
	if code < 100 || code > 999 {
		panic("http2: invalid WriteHeader code " + strconv.Itoa(code))
	}
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		// Informational: sent at once, with the header as it is; the final status follows.
		w.sendHeaders(code, false, nil)
		w.flush(false)
		return
	}
	w.status = code
	if cl := w.header["Content-Length"]; len(cl) == 1 {
		if n, err := strconv.ParseInt(cl[0], 10, 64); err == nil && n >= 0 {
			w.contentLength = n
		}
	}
	w.noBody = w.req.Method == http.MethodHead || !bodyAllowed(code)
}

func bodyAllowed(status int) bool {
	return !(status >= 100 && status <= 199) && status != http.StatusNoContent && status != http.StatusNotModified
}

func (w *responseWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return 0, errAfterDone
	}
	if w.finished {
		return 0, errFinished
	}
	if w.err != nil {
		return 0, w.err
	}
	w.writeHeader(http.StatusOK)
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
	if len(w.buf)+len(p) <= maxBuffered {
		w.buf = append(w.buf, p...)
		return len(p), nil
	}
	if !w.sentHeader {
		w.sendHeaders(w.status, false, w.buf)
	}
	if len(w.buf) > 0 {
		if err := w.sendData(w.buf, false); err != nil {
			return 0, err
		}
		w.buf = w.buf[:0]
	}
	if err := w.sendData(p, false); err != nil {
		return 0, err
	}
	return len(p), nil
}

// FlushError sends what was written so far to the agent.
func (w *responseWriter) FlushError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return errAfterDone
	}
	if w.finished {
		return nil
	}
	if w.err != nil {
		return w.err
	}
	w.writeHeader(http.StatusOK)
	if !w.sentHeader {
		w.sendHeaders(w.status, false, w.buf)
	}
	if len(w.buf) > 0 {
		if err := w.sendData(w.buf, false); err != nil {
			return err
		}
		w.buf = w.buf[:0]
	}
	// A body written a record or more at a time: what is over whole records may wait for its
	// next frame (holdTailLocked). A small write (an event) goes at once.
	hold := w.unflushed >= writeSize/2
	w.unflushed = 0
	return w.flush(hold)
}

func (w *responseWriter) Flush() { _ = w.FlushError() }

// Finish ends the response now, while the handler still runs (see broker/http1's).
func (w *responseWriter) Finish() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return errAfterDone
	}
	return w.finishLocked()
}

// finish ends the response after the handler returned.
func (w *responseWriter) finish() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.finishLocked()
}

func (w *responseWriter) finishLocked() error {
	if w.finished {
		return w.err
	}
	if w.err != nil {
		return w.err
	}
	w.finished = true
	w.writeHeader(http.StatusOK)
	if w.contentLength >= 0 && w.written != w.contentLength && !w.noBody {
		w.err = http.ErrContentLength // the body is short: the stream is reset, not ended
		return w.err
	}
	trailers := w.trailers()
	if !w.sentHeader {
		w.sendHeaders(w.status, len(w.buf) == 0 && len(trailers) == 0, w.buf)
	}
	if len(w.buf) > 0 || (len(trailers) == 0 && !w.endSent()) {
		if err := w.sendData(w.buf, len(trailers) == 0); err != nil {
			return err
		}
		w.buf = nil
	}
	if len(trailers) > 0 {
		w.sendFields(trailers, true)
	}
	return w.flush(false)
}

// endSent reports whether END_STREAM was sent; w.mu is held.
func (w *responseWriter) endSent() bool { return w.st.endSent.Load() }

// trailers are the response's trailer fields: the declared ones, and those named with
// http.TrailerPrefix.
func (w *responseWriter) trailers() []hpack.HeaderField {
	var out []hpack.HeaderField
	for _, v := range w.header["Trailer"] {
		for _, k := range strings.Split(v, ",") {
			k = http.CanonicalHeaderKey(strings.TrimSpace(k))
			for _, val := range w.header[k] {
				out = appendField(out, k, val)
			}
		}
	}
	for k, vs := range w.header {
		if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok {
			for _, val := range vs {
				out = appendField(out, name, val)
			}
		}
	}
	return out
}

// appendField appends a field valid in HTTP/2 as a trailer, or nothing.
func appendField(out []hpack.HeaderField, k, v string) []hpack.HeaderField {
	if !httpguts.ValidTrailerHeader(k) || !httpguts.ValidHeaderFieldName(k) || !httpguts.ValidHeaderFieldValue(v) {
		return out
	}
	return append(out, hpack.HeaderField{Name: lowerKey(k), Value: v})
}

// sendContinue sends "100 Continue" when the handler first reads a body the agent holds back.
func (w *responseWriter) sendContinue() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done || w.sentHeader || w.status != 0 || w.err != nil {
		return
	}
	w.sendHeaders(http.StatusContinue, false, nil)
	w.flush(false)
}

// skipped are the response fields HTTP/2 leaves out (RFC 9113, 8.2.2).
var skipped = map[string]bool{"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Transfer-Encoding": true, "Upgrade": true}

// sendHeaders writes the header block for status: the handler's fields (not its trailers),
// with a Date, a Content-Type sniffed from first when none was set, and, for a whole short
// response sent at once, its Content-Length; w.mu is held.
func (w *responseWriter) sendHeaders(status int, end bool, first []byte) {
	c := w.st.c
	final := status >= 200
	if final {
		w.sentHeader = true
	}
	var declared map[string]bool
	for _, v := range w.header["Trailer"] {
		for _, k := range strings.Split(v, ",") {
			if declared == nil {
				declared = map[string]bool{}
			}
			declared[http.CanonicalHeaderKey(strings.TrimSpace(k))] = true
		}
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.hbuf.b = c.hbuf.b[:0]
	enc := c.henc
	_ = enc.WriteField(hpack.HeaderField{Name: ":status", Value: statusText(status)})
	for k, vs := range w.header {
		if skipped[k] || declared[k] || strings.HasPrefix(k, http.TrailerPrefix) || !httpguts.ValidHeaderFieldName(k) {
			continue
		}
		lk := lowerKey(k)
		for _, v := range vs {
			if httpguts.ValidHeaderFieldValue(v) {
				_ = enc.WriteField(hpack.HeaderField{Name: lk, Value: v})
			}
		}
	}
	if final {
		if _, ok := w.header["Content-Type"]; !ok && !w.noBody && len(first) > 0 {
			_ = enc.WriteField(hpack.HeaderField{Name: "content-type", Value: http.DetectContentType(first)})
		}
		if _, ok := w.header["Date"]; !ok {
			_ = enc.WriteField(hpack.HeaderField{Name: "date", Value: wire.Date()})
		}
		if _, ok := w.header["Content-Length"]; !ok && w.finished && !w.noBody && declared == nil && !w.hasPrefixed() {
			_ = enc.WriteField(hpack.HeaderField{Name: "content-length", Value: strconv.Itoa(len(first))})
		}
	}
	c.writeBlock(w.st, c.hbuf.b, end)
}

// hasPrefixed reports whether the handler set a trailer with http.TrailerPrefix.
func (w *responseWriter) hasPrefixed() bool {
	for k := range w.header {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			return true
		}
	}
	return false
}

// sendFields writes a header block of fields (trailers); w.mu is held.
func (w *responseWriter) sendFields(fields []hpack.HeaderField, end bool) {
	c := w.st.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.hbuf.b = c.hbuf.b[:0]
	for _, f := range fields {
		_ = c.henc.WriteField(f)
	}
	c.writeBlock(w.st, c.hbuf.b, end)
}

// writeBlock writes a header block as st's HEADERS and CONTINUATION frames; c.wmu is held.
func (c *Conn) writeBlock(st *stream, block []byte, end bool) {
	id := st.id
	if end {
		st.endSent.Store(true)
	}
	c.mu.Lock()
	max := c.maxWrite
	c.mu.Unlock()
	first := true
	for first || len(block) > 0 {
		frag := block
		if len(frag) > max {
			frag = frag[:max]
		}
		block = block[len(frag):]
		if first {
			c.writeErr(c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: frag, EndStream: end, EndHeaders: len(block) == 0}))
			first = false
		} else {
			c.writeErr(c.fr.WriteContinuation(id, len(block) == 0, frag))
		}
	}
	c.roomLocked()
}

// sendData writes p as DATA frames as the windows allow, the last with END_STREAM when end;
// w.mu is held.
func (w *responseWriter) sendData(p []byte, end bool) error {
	st := w.st
	c := st.c
	for {
		n, err := c.reserve(st, len(p))
		if err != nil {
			w.err = err
			return err
		}
		last := end && n == len(p)
		if last {
			st.endSent.Store(true)
		}
		c.wmu.Lock()
		c.wrote(c.fr.WriteData(st.id, last, p[:n]))
		werr := c.werr
		c.wmu.Unlock()
		if werr != nil {
			w.err = werr
			return werr
		}
		p = p[n:]
		if len(p) == 0 {
			return nil
		}
	}
}

// reserve waits until st may send some of n bytes and takes them from the windows: as many
// as both allow, at most a frame. Before it waits, what was written is flushed: the agent
// opens the windows only for what it has received. A stream or connection that ends
// meanwhile fails it.
func (c *Conn) reserve(st *stream, n int) (int, error) {
	flushed := false
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		switch {
		case c.closed:
			return 0, errConnClosed
		case st.localDone:
			return 0, errStreamReset
		case n == 0:
			return 0, nil
		}
		avail := min(st.sendWindow, c.sendWindow, int64(c.maxWrite))
		if avail > 0 {
			k := min(int64(n), avail)
			st.sendWindow -= k
			c.sendWindow -= k
			return int(k), nil
		}
		if !flushed {
			c.mu.Unlock()
			c.flushPending(true)
			c.mu.Lock()
			flushed = true
			continue
		}
		c.flow.Wait()
		flushed = false
	}
}

// flush sends what the connection's writer holds, or leaves it to the write under way, which
// sends it next (see flushLocked); with hold, what is over whole records may wait for the
// next frames (holdTailLocked). w.mu is held.
func (w *responseWriter) flush(hold bool) error {
	c := w.st.c
	c.wmu.Lock()
	if hold {
		c.holdTailLocked()
	} else {
		c.flushLocked(false)
	}
	err := c.werr
	c.wmu.Unlock()
	return err
}

// lowerKey is a canonical header name in lower case, as HTTP/2 has it.
func lowerKey(k string) string {
	if l, ok := lowerKeys[k]; ok {
		return l
	}
	return strings.ToLower(k)
}

var lowerKeys = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{
		"Accept-Ranges", "Age", "Cache-Control", "Content-Encoding", "Content-Language",
		"Content-Length", "Content-Type", "Date", "Etag", "Expires", "Last-Modified", "Location",
		"Server", "Set-Cookie", "Strict-Transport-Security", "Vary", "Via", "X-Content-Type-Options",
		"X-Request-Id", "Trailer", "Www-Authenticate", "Retry-After", "X-Ratelimit-Limit-Requests",
		"X-Ratelimit-Remaining-Requests", "Openai-Processing-Ms", "Request-Id", "Cf-Ray",
	} {
		m[k] = strings.ToLower(k)
	}
	return m
}()

// statusText is a status as :status has it.
func statusText(code int) string {
	switch code {
	case 200:
		return "200"
	case 404:
		return "404"
	}
	return strconv.Itoa(code)
}
