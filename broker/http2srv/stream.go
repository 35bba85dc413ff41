package http2srv

import (
	"context"
	"io"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"
)

// stream is one request and its response. The fields below mu's line are guarded by the
// connection's mu.
type stream struct {
	c       *Conn
	id      uint32
	ctx     context.Context
	cancel  context.CancelFunc
	w       responseWriter
	reqBody requestBody

	// guarded by c.mu
	sendWindow   int64
	recvAvail    int64 // the stream's receive window left
	recvUnsent   int64 // read by the handler, not yet returned
	declared     int64 // the request's Content-Length, or -1
	bodyBytes    int64
	body         bodyBuf // received, not yet read by the handler
	bodyCond     sync.Cond
	bodyErr      error // why the body ends early (the stream or connection ended)
	remoteDone   bool  // END_STREAM received
	localDone    bool  // END_STREAM or RST_STREAM sent, or the handler is done and the stream reset
	discard      bool  // the handler is done: the body's bytes are dropped
	gone         bool  // removed from c.streams
	needContinue bool
	trailer      http.Header // the request's declared trailers (its Trailer map)
	trailerVals  http.Header // their values, from a trailing HEADERS
	gotTrailer   bool

	// endSent: END_STREAM is in the connection's output, set before the frame is, so that
	// once the agent has seen it the reader knows the stream is closed (when the agent's
	// END_STREAM came too) even before the handler's goroutine removes it.
	endSent atomic.Bool
	// reuse: the stream ended whole after its handler returned, so its context, not
	// cancelled, may serve a later stream (see streamContext); guarded by c.mu.
	reuse bool
}

// streamCtx is a stream's context and its cancel function.
type streamCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// streamContext returns a context for a new stream: one a stream that ended whole left, or a
// new one. net/http makes a context for each request and cancels it when the handler
// returns: a cancelable context, its registration in the connection's (a lock and a map
// insert, and a delete when cancelled), its Done channel once asked for, for each request.
// As broker/http1 keeps its connection's context for the next request until one is
// cancelled, a stream's context outlives its handler when the stream ended whole: what a
// request registered on it was unregistered by its owner before the handler returned (the
// upstream client's AfterFunc is stopped as the response body is closed, a derived
// context's cancel is deferred). A handler must not leave anything that waits on its
// request's context after it returns. A stream reset, by either side, has its context
// cancelled, and so does every stream when the connection ends.
func (c *Conn) streamContext() streamCtx {
	c.mu.Lock()
	if n := len(c.freeCtxs); n > 0 {
		sc := c.freeCtxs[n-1]
		c.freeCtxs[n-1] = streamCtx{}
		c.freeCtxs = c.freeCtxs[:n-1]
		c.mu.Unlock()
		return sc
	}
	c.mu.Unlock()
	ctx, cancel := context.WithCancel(c.ctx)
	return streamCtx{ctx, cancel}
}

// releaseContext cancels st's context, or keeps it for a later stream when st ended whole
// after its handler returned; c.mu is held.
func (c *Conn) releaseContext(st *stream) {
	if st.reuse && !c.closed && len(c.freeCtxs) < int(c.s.MaxConcurrentStreams) && st.ctx.Err() == nil {
		c.freeCtxs = append(c.freeCtxs, streamCtx{st.ctx, st.cancel})
		st.reuse = false
		return
	}
	st.cancel()
}

// connHeaders may not be in an HTTP/2 request (RFC 9113, 8.2.2).
var connHeaders = [...]string{"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Upgrade"}

func (c *Conn) processHeaders(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	if id%2 != 1 {
		return connError(http2.ErrCodeProtocol)
	}
	c.mu.Lock()
	if st := c.streams[id]; st != nil {
		defer c.mu.Unlock()
		return c.processTrailers(st, f)
	}
	if id <= c.lastID {
		reset := c.wasReset(id)
		c.mu.Unlock()
		if reset {
			// Trailers the agent sent before it saw our RST_STREAM: ignored (RFC 9113,
			// 5.1; the block was decoded, so the hpack state stays in step).
			return nil
		}
		return connError(http2.ErrCodeStreamClosed)
	}
	c.lastID = id
	if c.goingAway {
		c.mu.Unlock()
		return nil // opened after GOAWAY: ignored (its id was beyond the one announced)
	}
	if f.HasPriority() && f.Priority.StreamDep == id {
		c.mu.Unlock()
		return streamError{id, http2.ErrCodeProtocol}
	}
	if uint32(len(c.streams)) >= c.s.MaxConcurrentStreams {
		c.mu.Unlock()
		return streamError{id, http2.ErrCodeRefusedStream}
	}
	c.mu.Unlock()

	req, st, err := c.newRequest(f)
	if err != nil {
		return err
	}
	if !validRequestHeaders(req.Header) {
		return streamError{id, http2.ErrCodeProtocol} // malformed (RFC 9113, 8.2.2)
	}
	handler := c.s.Handler
	if f.Truncated {
		handler = http.HandlerFunc(headerTooLarge)
	}
	c.mu.Lock()
	c.streams[id] = st
	c.openStreams.Store(int32(len(c.streams)))
	if f.StreamEnded() {
		st.remoteDone = true
	}
	t := task{c, st, handler, req}
	if c.running >= int(c.s.MaxConcurrentStreams) {
		// The handlers of streams the agent reset still run: no more than the streams
		// announced run at once, however fast streams are opened and reset (CVE-2023-44487).
		// The rest wait, up to a bound beyond which the agent is flooding.
		if len(c.queued) >= 4*int(c.s.MaxConcurrentStreams) {
			c.mu.Unlock()
			return connError(http2.ErrCodeEnhanceYourCalm)
		}
		c.queued = append(c.queued, t)
		c.mu.Unlock()
		return nil
	}
	c.running++
	c.mu.Unlock()
	if !st.remoteDone {
		// The body follows: the handler starts once it has ended, or when the reader has
		// read all the agent sent so far (see dispatchDeferred), rather than start now and
		// wait for the body's first frame (a goroutine parked and woken per request).
		c.deferred = append(c.deferred, t)
		return nil
	}
	dispatch(t)
	return nil
}

// dispatchDeferred starts the handlers whose requests' bodies have ended, or all of them
// (before the reader waits for the agent, and when it stops); called by the reader alone.
func (c *Conn) dispatchDeferred(all bool) {
	kept := c.deferred[:0]
	for _, t := range c.deferred {
		if !all {
			c.mu.Lock()
			ended := t.st.remoteDone || t.st.localDone
			c.mu.Unlock()
			if !ended {
				kept = append(kept, t)
				continue
			}
		}
		dispatch(t)
	}
	clear(c.deferred[len(kept):])
	c.deferred = kept
}

// handlerDone counts a handler as ended and returns the next queued stream to run, if one is
// still open.
func (c *Conn) handlerDone() (task, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.running--
	for len(c.queued) > 0 {
		t := c.queued[0]
		c.queued[0] = task{}
		c.queued = c.queued[1:]
		if t.st.localDone { // reset while it waited
			c.removeStream(t.st)
			continue
		}
		c.running++
		return t, true
	}
	return task{}, false
}

// task is a request to run a handler for.
type task struct {
	c   *Conn
	st  *stream
	h   http.Handler
	req *http.Request
}

// idleWorkers hands a task to a worker goroutine that waits for one: unbuffered, a send
// succeeds only when one does.
var idleWorkers = make(chan task)

// workerIdle is how long a worker waits for its next task before it ends.
const workerIdle = 2 * time.Second

// dispatch runs t on a waiting worker, or a new one. A worker's stack has grown to what the
// handler needs (the broker's pipeline is deep): a goroutine started for each request grows
// its stack, copying it, several times over, about a tenth of an h2 request's CPU time.
func dispatch(t task) {
	select {
	case idleWorkers <- t:
	default:
		go worker(t)
	}
}

// worker runs tasks until none came for between one and two workerIdle periods. Its timer
// is set once and re-armed when it fires after the worker was busy meanwhile, not reset for
// every task.
func worker(t task) {
	timer := time.NewTimer(workerIdle)
	busy := true
	for {
		t.c.runHandler(t.st, t.h, t.req)
		if next, ok := t.c.handlerDone(); ok {
			t = next
			continue
		}
		t = task{}
		busy = true
	wait:
		select {
		case t = <-idleWorkers:
		case <-timer.C:
			if !busy {
				return
			}
			busy = false
			timer.Reset(workerIdle)
			goto wait
		}
	}
}

// processTrailers reads a HEADERS frame that ends a request's body; c.mu is held.
func (c *Conn) processTrailers(st *stream, f *http2.MetaHeadersFrame) error {
	if st.remoteDone {
		if st.endSent.Load() {
			// Closed, not half-closed: the agent may have read our END_STREAM before this
			// goroutine sees the stream removed (RFC 9113, 5.1).
			return connError(http2.ErrCodeStreamClosed)
		}
		return streamError{st.id, http2.ErrCodeStreamClosed}
	}
	if st.gotTrailer {
		return connError(http2.ErrCodeProtocol)
	}
	st.gotTrailer = true
	if !f.StreamEnded() || len(f.PseudoFields()) > 0 {
		return streamError{st.id, http2.ErrCodeProtocol}
	}
	for _, hf := range f.RegularFields() {
		k := textproto.CanonicalMIMEHeaderKey(hf.Name)
		if !httpguts.ValidTrailerHeader(k) {
			return streamError{st.id, http2.ErrCodeProtocol}
		}
		if _, declared := st.trailer[k]; declared {
			if st.trailerVals == nil {
				st.trailerVals = http.Header{}
			}
			st.trailerVals[k] = append(st.trailerVals[k], hf.Value)
		}
	}
	if st.declared >= 0 && st.bodyBytes != st.declared {
		return streamError{st.id, http2.ErrCodeProtocol}
	}
	c.endRemote(st)
	return nil
}

// validRequestHeaders reports whether h has none of the fields HTTP/2 leaves out.
func validRequestHeaders(h http.Header) bool {
	for _, k := range connHeaders {
		if _, ok := h[k]; ok {
			return false
		}
	}
	te := h["Te"]
	return len(te) == 0 || (len(te) == 1 && (te[0] == "trailers" || te[0] == ""))
}

// newRequest makes a stream's request from its header block, as net/http's HTTP/2 server
// does: the pseudo-header fields checked, cookies joined, trailers declared, a Host field
// agreeing with :authority.
func (c *Conn) newRequest(f *http2.MetaHeadersFrame) (*http.Request, *stream, error) {
	id := f.StreamID
	bad := streamError{id, http2.ErrCodeProtocol}
	var method, scheme, authority, path string
	for _, hf := range f.PseudoFields() {
		switch hf.Name {
		case ":method":
			method = hf.Value
		case ":scheme":
			scheme = hf.Value
		case ":authority":
			authority = hf.Value
		case ":path":
			path = hf.Value
		default: // :protocol (extended CONNECT is not offered), or a response's :status
			return nil, nil, bad
		}
	}
	connect := method == "CONNECT"
	switch {
	case connect && (path != "" || scheme != "" || authority == ""):
		return nil, nil, bad
	case !connect && (method == "" || path == "" || (scheme != "https" && scheme != "http")):
		return nil, nil, bad
	}
	fields := f.RegularFields()
	header := make(http.Header, len(fields))
	vals := make([]string, len(fields)) // one array for the values, as textproto's reader
	for i, hf := range fields {
		k := commonKey(hf.Name)
		if vv, ok := header[k]; ok {
			header[k] = append(vv, hf.Value) // a repeated field: its own array from here
			continue
		}
		vals[i] = hf.Value
		header[k] = vals[i : i+1 : i+1]
	}
	needContinue := false
	if e := header["Expect"]; e != nil && httpguts.HeaderValuesContainsToken(e, "100-continue") {
		needContinue = true
		delete(header, "Expect")
	}
	if cookies := header["Cookie"]; len(cookies) > 1 {
		header["Cookie"] = []string{strings.Join(cookies, "; ")}
	}
	var trailer http.Header
	for _, v := range header["Trailer"] {
		for _, key := range strings.Split(v, ",") {
			key = textproto.CanonicalMIMEHeaderKey(textproto.TrimString(key))
			switch key {
			case "Transfer-Encoding", "Trailer", "Content-Length":
				return nil, nil, bad
			}
			if trailer == nil {
				trailer = http.Header{}
			}
			trailer[key] = nil
		}
	}
	delete(header, "Trailer")
	switch host := header["Host"]; {
	case len(host) > 1:
		return nil, nil, bad
	case len(host) == 1:
		if authority == "" {
			authority = host[0]
		} else if host[0] != authority {
			return nil, nil, bad
		}
		delete(header, "Host")
	}
	if strings.IndexByte(authority, '@') >= 0 || (authority != "" && !httpguts.ValidHostHeader(authority)) {
		return nil, nil, bad
	}
	var u *url.URL
	requestURI := path
	if connect {
		u, requestURI = &url.URL{Host: authority}, authority
	} else {
		if path[0] != '/' && path != "*" {
			return nil, nil, bad
		}
		var err error
		if u, err = url.ParseRequestURI(path); err != nil {
			return nil, nil, bad
		}
	}

	st := &stream{c: c, id: id, declared: -1, needContinue: needContinue, trailer: trailer}
	st.bodyCond.L = &c.mu
	c.mu.Lock()
	st.sendWindow = c.initWindow
	c.mu.Unlock()
	st.recvAvail = recvWindow
	// A value, not escaping: WithContext below makes the request's one allocation.
	req := http.Request{
		Method:     method,
		URL:        u,
		Proto:      "HTTP/2.0",
		ProtoMajor: 2,
		Header:     header,
		Host:       authority,
		RemoteAddr: c.remoteAddr(),
		RequestURI: requestURI,
		Trailer:    trailer,
	}
	if scheme == "https" {
		req.TLS = c.tlsConn
	}
	if f.StreamEnded() {
		req.Body = http.NoBody
	} else {
		req.ContentLength = -1
		if vv, ok := header["Content-Length"]; ok {
			cl, err := strconv.ParseUint(vv[0], 10, 63)
			if err != nil || len(vv) > 1 {
				return nil, nil, bad
			}
			req.ContentLength = int64(cl)
			st.declared = int64(cl)
		}
		st.reqBody.st = st
		req.Body = &st.reqBody
	}
	sc := c.streamContext()
	st.ctx, st.cancel = sc.ctx, sc.cancel
	return req.WithContext(st.ctx), st, nil
}

// commonKey is name (lower case, as HTTP/2 has it) in its canonical form.
func commonKey(name string) string {
	if k, ok := commonKeys[name]; ok {
		return k
	}
	return textproto.CanonicalMIMEHeaderKey(name)
}

var commonKeys = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{
		"Accept", "Accept-Encoding", "Accept-Language", "Authorization", "Cache-Control",
		"Content-Length", "Content-Type", "Cookie", "Date", "Expect", "Host", "If-Modified-Since",
		"If-None-Match", "Origin", "Referer", "Te", "Trailer", "User-Agent", "X-Api-Key",
		"X-Forwarded-For", "X-Request-Id", "Anthropic-Version", "Openai-Organization",
	} {
		m[strings.ToLower(k)] = k
	}
	return m
}()

func (c *Conn) remoteAddr() string {
	if c.remote == "" {
		c.remote = c.raw.RemoteAddr().String()
	}
	return c.remote
}

func headerTooLarge(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, "431 Request Header Fields Too Large", http.StatusRequestHeaderFieldsTooLarge)
}

// runHandler runs the handler for a stream's request, then ends its response: whole, or
// with RST_STREAM when the handler panicked (http.ErrAbortHandler included) or the response
// could not be finished.
func (c *Conn) runHandler(st *stream, h http.Handler, req *http.Request) {
	st.w = responseWriter{st: st, req: req, contentLength: -1}
	w := &st.w
	ok := serve(h, w, req)
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
	if ok {
		ok = w.finish() == nil
	}
	c.mu.Lock()
	reset := st.localDone // by the agent, or the connection ended
	c.mu.Unlock()
	switch {
	case reset:
	case !ok:
		c.resetStream(st.id, http2.ErrCodeInternal)
	default:
		c.mu.Lock()
		st.localDone, st.discard = true, true
		if n := st.body.reset(); n > 0 {
			c.returnConn(int64(n))
		}
		remoteOpen := !st.remoteDone
		if !remoteOpen {
			st.reuse = true
			c.removeStream(st)
		}
		c.mu.Unlock()
		if remoteOpen {
			// The response is whole and the agent is still sending a body nothing will
			// read: NO_ERROR tells it to stop (RFC 9113, 8.1).
			c.resetStream(st.id, http2.ErrCodeNo)
		}
	}
	c.flushIfDirty()
}

func serve(h http.Handler, w http.ResponseWriter, req *http.Request) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	h.ServeHTTP(w, req)
	return true
}

// closeStream ends st as its stream was reset (by either side) or the connection ended.
func (c *Conn) closeStream(st *stream, err error) {
	c.mu.Lock()
	c.endStreamLocked(st, err)
	c.removeStream(st)
	c.mu.Unlock()
}

// endStreamLocked ends st's request (its context, its body) with err; c.mu is held.
func (c *Conn) endStreamLocked(st *stream, err error) {
	st.localDone, st.discard = true, true
	if !st.remoteDone && st.bodyErr == nil {
		st.bodyErr = err
	}
	if n := st.body.reset(); n > 0 {
		c.returnConn(int64(n))
	}
	st.bodyCond.Broadcast()
	c.flow.Broadcast()
	st.cancel()
}

// removeStream takes st out of the connection's streams; c.mu is held.
func (c *Conn) removeStream(st *stream) {
	if st.gone {
		return
	}
	st.gone = true
	c.releaseContext(st)
	delete(c.streams, st.id)
	c.openStreams.Store(int32(len(c.streams)))
	if len(c.streams) == 0 {
		c.idleSince = time.Now()
		if c.shutdown {
			go c.close()
		}
	}
}

// requestBody is a request's body as the handler reads it: the DATA frames' bytes the reader
// buffered, up to the stream's window.
type requestBody struct {
	st     *stream
	closed bool
}

func (b *requestBody) Read(p []byte) (int, error) {
	st := b.st
	c := st.c
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	if st.needContinue {
		st.needContinue = false
		st.w.sendContinue()
	}
	c.mu.Lock()
	for st.body.len() == 0 && !st.remoteDone && st.bodyErr == nil && !st.discard {
		st.bodyCond.Wait()
	}
	if st.body.len() == 0 {
		err := st.bodyErr
		switch {
		case err != nil:
		case st.remoteDone:
			err = io.EOF
			// The trailers are the request's once its body has been read (by the handler's
			// goroutine: the request is its own).
			for k, v := range st.trailerVals {
				st.trailer[k] = v
			}
			st.trailerVals = nil
		default:
			err = http.ErrBodyReadAfterClose
		}
		c.mu.Unlock()
		return 0, err
	}
	n := st.body.read(p)
	c.returnConn(int64(n))
	if !st.remoteDone {
		st.recvUnsent += int64(n)
		if st.recvUnsent >= recvWindow/4 {
			st.recvAvail += st.recvUnsent
			c.pendingUpdates = append(c.pendingUpdates, windowUpdate{st.id, uint32(st.recvUnsent)})
			st.recvUnsent = 0
		}
	}
	pending := len(c.pendingUpdates) > 0
	c.mu.Unlock()
	if pending {
		// from the handler's goroutine: the reader may be waiting for the agent, which
		// waits for these
		c.flushIfDirty()
	}
	return n, nil
}

func (b *requestBody) Close() error {
	b.closed = true
	return nil
}
