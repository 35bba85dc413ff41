package http1

import (
	"bufio"
	"net"
	"net/http"
)

// writer is the http.ResponseWriter a handler gets (also http.Flusher and http.Hijacker,
// which http.ResponseController finds, and Finish): the connection's response, for as long
// as its handler runs. Once the handler has returned, every call fails (or does nothing), and
// so does a read of the request's body (http.ErrBodyReadAfterClose): what the handler left
// running neither writes beside the server finishing the response nor reaches the next
// request's. One allocation per request holds the writer and the request's body.
type writer struct {
	r    *response
	gen  uint64      // the request's, in r.gen
	body requestBody // the request's body, as the handler reads it
}

// maxKeptFields is the most header fields whose map a response keeps for the next request;
// a larger one is let go.
const maxKeptFields = 32

// newWriter readies the connection's response for req (a fresh one after a park or the
// first request) and returns the handler's writer for it.
func (c *Conn) newWriter(req *http.Request) *writer {
	r := c.resp
	if r == nil {
		r = &response{c: c}
		c.resp = r
	}
	r.mu.Lock()
	h := r.header
	if h == nil || len(h) > maxKeptFields {
		h = make(http.Header, 8)
	} else {
		clear(h)
	}
	r.responseState = responseState{req: req, header: h, contentLength: -1}
	gen := r.gen.Load()
	r.mu.Unlock()
	w := &writer{r: r, gen: gen}
	w.body.rc, w.body.w = req.Body, w
	return w
}

// live reports whether the writer's request is still the response's.
func (w *writer) live() bool { return w.r.gen.Load() == w.gen }

// Header is the response's header; after the request, an empty one of its own.
func (w *writer) Header() http.Header {
	if !w.r.lock(w.gen) {
		return http.Header{}
	}
	defer w.r.mu.Unlock()
	return w.r.header
}

func (w *writer) WriteHeader(code int) { w.r.writeHeader(w.gen, code) }

func (w *writer) Write(p []byte) (int, error) { return w.r.write(w.gen, p) }

// FlushError sends what was written so far to the agent.
func (w *writer) FlushError() error { return w.r.flush(w.gen) }

func (w *writer) Flush() { _ = w.FlushError() }

// Finish ends the response now, while the handler still runs: what it does after (its
// bookkeeping) no longer delays the agent. Writes after it fail.
func (w *writer) Finish() error { return w.r.finish(w.gen) }

// Hijack hands the connection to the handler (see response.hijack).
func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) { return w.r.hijack(w.gen) }
