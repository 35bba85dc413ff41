package http1

import (
	"context"
	"io"
	"net/http"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
)

// check is what net/http's server checks of a request before any handler sees it: the
// version, a valid Host (required in HTTP/1.1), valid header names and values, and an Expect
// it can meet. It returns the status and status line of the refusal, or 0.
func check(req *http.Request) (int, string) {
	if req.ProtoMajor != 1 {
		return http.StatusHTTPVersionNotSupported, "505 HTTP Version Not Supported"
	}
	// http.ReadRequest has taken Host out of the header, into req.Host (the framing guard
	// refuses a second Host field).
	switch {
	case req.ProtoAtLeast(1, 1) && req.Host == "":
		return http.StatusBadRequest, "400 Bad Request: missing required Host header"
	case req.Host != "" && !httpguts.ValidHostHeader(req.Host):
		return http.StatusBadRequest, "400 Bad Request: malformed Host header"
	}
	for k, vs := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return http.StatusBadRequest, "400 Bad Request: invalid header name"
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return http.StatusBadRequest, "400 Bad Request: invalid header value"
			}
		}
	}
	if e := req.Header.Get("Expect"); e != "" && (!strings.EqualFold(e, "100-continue") || !req.ProtoAtLeast(1, 1)) {
		return http.StatusExpectationFailed, "417 Expectation Failed"
	}
	return 0, ""
}

// handle runs the handler for req and finishes its response.
func (c *Conn) handle(req *http.Request) outcome {
	req = req.WithContext(c.requestContext())
	if c.remote == "" {
		c.remote = c.raw.RemoteAddr().String()
	}
	req.RemoteAddr = c.remote
	hw := c.newWriter(req)
	w, body := hw.r, &hw.body
	if req.Body != nil && req.Body != http.NoBody {
		req.Body = body
		if req.Header.Get("Expect") != "" {
			body.expect = true
		}
	} else {
		body.eof = true
		c.watchable()
	}

	ok := c.serveHandler(hw, req)
	// The handler's writer and body fail from here on: what it left running cannot write
	// beside the drain and the response's end below, nor into the next response.
	gen := w.retire()
	c.stopWatch()
	if !ok {
		return closing // the handler panicked: the response may be cut anywhere
	}
	if c.hijacked {
		return hijacked
	}
	// What the handler left of the body is read, so that the connection can carry the next
	// request; a body too long for that, or one the agent was never asked to send, ends it.
	if !body.eof {
		switch {
		case body.expect && !body.continued:
			w.closeAfter = true
		default:
			if !body.drain() {
				w.closeAfter = true
			}
		}
	}
	if err := w.finish(gen); err != nil || w.closeAfter {
		return closing // (a drain that began meanwhile is goIdle's to see)
	}
	if c.ctx.Err() != nil {
		c.endContext() // the next request gets a live one
	}
	return next
}

// requestContext is the context of the request about to be handled: the connection's, made
// for its first request and kept for the next ones until it is cancelled (see endContext).
//
// net/http makes a context for each request and cancels it when the handler returns: a
// cancelable context, its cancel function, its Done channel and, once something is
// registered on it (context.AfterFunc, a derived context), the map of its children, for each
// request. What a request registers is unregistered by its owner before the handler returns
// (the upstream client's AfterFunc is stopped as the response body is closed, a derived
// context's cancel is deferred), so a context whose request ended well can serve the next
// one. A handler must not leave anything that waits on its request's context after it
// returns: that would end only with the connection's context (the agent going away, the
// connection ending or being parked or hijacked).
func (c *Conn) requestContext() context.Context {
	if c.ctx == nil {
		parent := c.s.BaseContext
		if parent == nil {
			parent = context.Background()
		}
		ctx, cancel := context.WithCancel(parent)
		c.mu.Lock()
		c.ctx, c.cancel = ctx, cancel
		c.mu.Unlock()
	}
	return c.ctx
}

// endContext cancels the connection's context, if it has one; the next request gets a new
// one. It is called when the serving goroutine stops serving (the connection ends, is parked
// or hijacked: the handler has returned), and after a request whose context was cancelled.
func (c *Conn) endContext() {
	if c.ctx == nil {
		return
	}
	c.mu.Lock()
	cancel := c.cancel
	c.ctx, c.cancel = nil, nil
	c.mu.Unlock()
	cancel()
}

// serveHandler runs the handler; it reports false when the handler panicked (as net/http's
// server does, the panic ends the connection, not the broker; http.ErrAbortHandler alike).
func (c *Conn) serveHandler(w *writer, req *http.Request) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	c.s.Handler.ServeHTTP(w, req)
	return true
}

var aLongTimeAgo = time.Unix(1, 0)

// requestBody is a request's body as the handler reads it: it asks for a body the agent
// holds back (Expect: 100-continue) when first read, and arms the watch when read to its end.
type requestBody struct {
	rc        io.ReadCloser
	w         *writer
	expect    bool // the agent waits for 100 Continue
	continued bool // it was sent
	eof       bool
	lr        io.LimitedReader // drain's
}

func (b *requestBody) Read(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	if !b.w.live() {
		return 0, http.ErrBodyReadAfterClose // the handler has returned
	}
	if b.expect && !b.continued {
		if err := b.w.r.sendContinue(b.w.gen); err != nil {
			return 0, err
		}
		b.continued = true
	}
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.eof = true
		b.w.r.c.watchable()
	}
	return n, err
}

func (b *requestBody) Close() error { return nil } // what is left is drained after the handler

// drain reads what the handler left of the body, up to maxDrain; it reports whether the body
// ended within it (io.CopyN would allocate a LimitedReader for each drain: the body holds
// one).
func (b *requestBody) drain() bool {
	b.lr = io.LimitedReader{R: b.rc, N: maxDrain + 1}
	n, err := io.Copy(io.Discard, &b.lr)
	b.lr.R = nil
	return n <= maxDrain && err == nil
}
