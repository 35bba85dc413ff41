package http2srv

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/capbroker/capbroker/internal/tcppair"
)

// serveTCP serves h on a loopback listener with a Server like the broker's; the client
// speaks HTTP/2 over plain TCP (prior knowledge).
func serveTCP(t *testing.T, h http.Handler) (*http.Client, *sync.WaitGroup) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 30 * time.Second, PingTimeout: 5 * time.Second,
		MaxHeaderBytes: 64 << 10, MaxConcurrentStreams: 100}
	var wg sync.WaitGroup
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go s.NewConn(c, wg.Done).Serve()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	tr := &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, ln.Addr().String())
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}, &wg
}

func TestSmallRequests(t *testing.T) {
	c, _ := serveTCP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Method", r.Method)
		w.Write(append([]byte("got "), b...))
	}))
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.Post("http://x.test/a", "text/plain", strings.NewReader(strings.Repeat("y", i*1000)))
			if err != nil {
				t.Error(err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != "got "+strings.Repeat("y", i*1000) || resp.Header.Get("X-Method") != "POST" || resp.ProtoMajor != 2 {
				t.Errorf("got %d %q %v", len(b), resp.Header, resp.Proto)
			}
		}()
	}
	wg.Wait()
}

func TestLargeBothWays(t *testing.T) {
	c, _ := serveTCP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(w, r.Body)
	}))
	body := bytes.Repeat([]byte("0123456789abcdef"), 300000) // 4.8 MB: beyond every window
	resp, err := c.Post("http://x.test/a", "application/octet-stream", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("echo: %d bytes, %v", len(got), err)
	}
}

func TestFlushStreams(t *testing.T) {
	read := make(chan struct{})
	c, _ := serveTCP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: a\n\n")
		w.(http.Flusher).Flush()
		<-read // the agent has the first event before the second is written
		io.WriteString(w, "data: b\n\n")
	}))
	resp, err := c.Get("http://x.test/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 9)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "data: a\n\n" {
		t.Fatalf("first event: %q %v", buf, err)
	}
	close(read)
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "data: b\n\n" {
		t.Fatalf("second event: %q %v", rest, err)
	}
}

func TestTrailersBothWays(t *testing.T) {
	c, _ := serveTCP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Trailer", "X-Declared")
		w.WriteHeader(200)
		io.WriteString(w, "body")
		w.Header().Set("X-Declared", "got "+r.Trailer.Get("X-Req"))
		w.Header().Set(http.TrailerPrefix+"X-Late", "late")
	}))
	req, _ := http.NewRequest("POST", "http://x.test/t", io.NopCloser(strings.NewReader("abc")))
	req.Trailer = http.Header{"X-Req": {"r1"}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "body" || resp.Trailer.Get("X-Declared") != "got r1" || resp.Trailer.Get("X-Late") != "late" {
		t.Fatalf("body %q trailer %v", b, resp.Trailer)
	}
}

func TestResetCancelsRequest(t *testing.T) {
	started, cancelled := make(chan struct{}), make(chan struct{})
	c, _ := serveTCP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done()
		close(cancelled)
	}))
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://x.test/slow", nil)
	go func() { <-started; cancel() }()
	if _, err := c.Do(req); err == nil {
		t.Fatal("a cancelled request succeeded")
	}
	<-cancelled // the client's RST_STREAM ended the handler's context
}

func TestAbortResetsStream(t *testing.T) {
	c, _ := serveTCP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		io.WriteString(w, "partial")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}))
	resp, err := c.Get("http://x.test/cut")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Fatal("a response cut short read as whole")
	}
	// the connection still serves
	c2, _ := c.Get("http://x.test/cut")
	if c2 == nil {
		t.Fatal("the connection ended with the stream")
	}
	c2.Body.Close()
}

func TestShortBodyResets(t *testing.T) {
	c, _ := serveTCP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		io.WriteString(w, "short")
	}))
	resp, err := c.Get("http://x.test/short")
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err == nil {
		t.Fatal("a body shorter than its Content-Length read as whole")
	}
}

// rawConn is an HTTP/2 client connection driven frame by frame.
type rawConn struct {
	t    *testing.T
	nc   net.Conn
	fr   *http2.Framer
	enc  *hpack.Encoder
	hbuf bytes.Buffer
	w    chan func() // writes, in order, on one goroutine
}

// write queues a write.
func (r *rawConn) write(f func()) { r.w <- f }

func dialRaw(t *testing.T, s *Server) (*rawConn, *Conn) {
	t.Helper()
	a, b := tcppair.New(t)
	conn := s.NewConn(b, func() {})
	go conn.Serve()
	r := &rawConn{t: t, nc: a, fr: http2.NewFramer(a, a), w: make(chan func(), 64)}
	r.enc = hpack.NewEncoder(&r.hbuf)
	r.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	go func() {
		for f := range r.w {
			f()
		}
	}()
	r.write(func() {
		io.WriteString(a, http2.ClientPreface)
		r.fr.WriteSettings()
	})
	return r, conn
}

func (r *rawConn) headers(id uint32, end bool, fields ...string) {
	r.hbuf.Reset()
	for i := 0; i < len(fields); i += 2 {
		r.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	block := append([]byte(nil), r.hbuf.Bytes()...)
	r.write(func() {
		r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndStream: end, EndHeaders: true})
	})
}

// next reads frames until one matching, which it returns; it fails the test when the
// connection ends first.
func (r *rawConn) next(match func(http2.Frame) bool) http2.Frame {
	r.t.Helper()
	_ = r.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			r.t.Fatalf("reading frames: %v", err)
		}
		if match(f) {
			return f
		}
	}
}

func testServer(h http.Handler) *Server {
	return &Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 30 * time.Second, PingTimeout: 5 * time.Second,
		MaxHeaderBytes: 4 << 10, MaxConcurrentStreams: 2}
}

var get = []string{":method", "GET", ":scheme", "https", ":authority", "x.test", ":path", "/"}

func TestStreamLimits(t *testing.T) {
	release := make(chan struct{})
	r, _ := dialRaw(t, testServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release })))
	r.headers(1, true, get...)
	r.headers(3, true, get...)
	r.headers(5, true, get...) // beyond SETTINGS_MAX_CONCURRENT_STREAMS (2)
	rst := r.next(func(f http2.Frame) bool { _, ok := f.(*http2.RSTStreamFrame); return ok }).(*http2.RSTStreamFrame)
	if rst.StreamID != 5 || rst.ErrCode != http2.ErrCodeRefusedStream {
		t.Fatalf("got %v", rst)
	}
	close(release)
}

func TestHeaderChecks(t *testing.T) {
	r, _ := dialRaw(t, testServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	isRST := func(f http2.Frame) bool { _, ok := f.(*http2.RSTStreamFrame); return ok }
	for i, fields := range [][]string{
		append(append([]string{}, get...), "connection", "keep-alive"),
		append(append([]string{}, get...), "te", "gzip"),
		{":method", "GET", ":scheme", "https", ":authority", "x.test"},                          // no :path
		{":method", "GET", ":scheme", "https", ":authority", "x.test", ":path", "/", ":x", "y"}, // unknown pseudo
		append(append([]string{}, get...), "host", "other.test"),                                // Host against :authority
	} {
		id := uint32(2*i + 1)
		r.headers(id, true, fields...)
		rst := r.next(isRST).(*http2.RSTStreamFrame)
		if rst.StreamID != id || rst.ErrCode != http2.ErrCodeProtocol {
			t.Fatalf("%v: got %v", fields, rst)
		}
	}
	// a header list beyond MaxHeaderBytes: 431
	big := strings.Repeat("a", 2<<10)
	r.headers(11, true, append(append([]string{}, get...), "x-a", big, "x-b", big, "x-c", big)...)
	h := r.next(func(f http2.Frame) bool { _, ok := f.(*http2.MetaHeadersFrame); return ok }).(*http2.MetaHeadersFrame)
	if h.StreamID != 11 || h.PseudoValue("status") != "431" {
		t.Fatalf("got %v %q", h.StreamID, h.PseudoValue("status"))
	}
}

func TestContinueOnRead(t *testing.T) {
	r, _ := dialRaw(t, testServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	})))
	r.headers(1, false, ":method", "POST", ":scheme", "https", ":authority", "x.test", ":path", "/", "expect", "100-continue", "content-length", "2")
	isHeaders := func(f http2.Frame) bool { _, ok := f.(*http2.MetaHeadersFrame); return ok }
	if h := r.next(isHeaders).(*http2.MetaHeadersFrame); h.PseudoValue("status") != "100" {
		t.Fatalf("first response %q, want 100", h.PseudoValue("status"))
	}
	r.write(func() { r.fr.WriteData(1, true, []byte("hi")) })
	if h := r.next(isHeaders).(*http2.MetaHeadersFrame); h.PseudoValue("status") != "200" {
		t.Fatalf("final response %q", h.PseudoValue("status"))
	}
}

func TestShutdownFinishesStreams(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	r, conn := dialRaw(t, testServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		io.WriteString(w, "done")
	})))
	r.headers(1, true, get...)
	r.next(func(f http2.Frame) bool { _, ok := f.(*http2.SettingsFrame); return ok })
	<-started
	shut := make(chan error, 1)
	go func() { shut <- conn.Shutdown(context.Background()) }()
	ga := r.next(func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok }).(*http2.GoAwayFrame)
	if ga.ErrCode != http2.ErrCodeNo || ga.LastStreamID != 1 {
		t.Fatalf("got %v", ga)
	}
	close(release)
	d := r.next(func(f http2.Frame) bool { _, ok := f.(*http2.DataFrame); return ok }).(*http2.DataFrame)
	if string(d.Data()) != "done" {
		t.Fatalf("the open stream's response: %q", d.Data())
	}
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
}

func TestIdleTimeoutEnds(t *testing.T) {
	s := testServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	s.IdleTimeout = 50 * time.Millisecond
	r, conn := dialRaw(t, s)
	ga := r.next(func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok }).(*http2.GoAwayFrame)
	if ga.ErrCode != http2.ErrCodeNo {
		t.Fatalf("got %v", ga)
	}
	<-conn.done
}

func TestRapidResetBounded(t *testing.T) {
	var mu sync.Mutex
	running, peak := 0, 0
	s := testServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		running++
		peak = max(peak, running)
		mu.Unlock()
		<-r.Context().Done()
		time.Sleep(time.Millisecond) // a handler slow to notice: the next ones must wait
		mu.Lock()
		running--
		mu.Unlock()
	}))
	r, conn := dialRaw(t, s)
	for i := range 200 {
		id := uint32(2*i + 1)
		r.headers(id, true, get...)
		r.write(func() { r.fr.WriteRSTStream(id, http2.ErrCodeCancel) })
	}
	// Either every stream was served in turn, or the flood ended the connection.
	ga := r.next(func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok }).(*http2.GoAwayFrame)
	if ga.ErrCode != http2.ErrCodeEnhanceYourCalm {
		t.Fatalf("got %v", ga)
	}
	<-conn.done
	mu.Lock()
	defer mu.Unlock()
	if peak > int(s.MaxConcurrentStreams) {
		t.Fatalf("%d handlers ran at once; the limit is %d", peak, s.MaxConcurrentStreams)
	}
}

func TestTrailersAfterEarlyResponse(t *testing.T) {
	r, _ := dialRaw(t, testServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusForbidden) // answered without reading the body
	})))
	r.headers(1, false, ":method", "POST", ":scheme", "https", ":authority", "x.test", ":path", "/", "trailer", "x-t")
	rst := r.next(func(f http2.Frame) bool { _, ok := f.(*http2.RSTStreamFrame); return ok }).(*http2.RSTStreamFrame)
	if rst.StreamID != 1 || rst.ErrCode != http2.ErrCodeNo {
		t.Fatalf("got %v", rst)
	}
	// The agent's trailers, sent before it saw the reset, leave the connection serving.
	r.headers(1, true, "x-t", "v")
	r.write(func() { r.fr.WritePing(false, [8]byte{7}) })
	f := r.next(func(f http2.Frame) bool {
		switch f.(type) {
		case *http2.PingFrame, *http2.GoAwayFrame:
			return true
		}
		return false
	})
	if p, ok := f.(*http2.PingFrame); !ok || !p.IsAck() {
		t.Fatalf("got %v, want the PING's answer", f)
	}
}

// TestStreamContexts: a stream that ended whole leaves its context, live, to a later stream;
// a reset stream's context is cancelled and not handed on; streams open at once have their
// own; and every context ends with the connection.
func TestStreamContexts(t *testing.T) {
	got := make(chan context.Context, 1)
	hold := make(chan struct{})
	c, wg := serveTCP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Context()
		switch r.URL.Path {
		case "/reset":
			<-r.Context().Done()
		case "/hold":
			<-hold
		}
	}))
	get := func(path string) context.Context {
		t.Helper()
		resp, err := c.Get("http://x.test" + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return <-got
	}
	// A stream's context is handed on once its stream is done, which may be just after the
	// agent has the response: within a few requests, one has the one before's, live.
	prev, reused := get("/a"), false
	for range 50 {
		next := get("/b")
		if next.Err() != nil {
			t.Fatalf("a new stream's context is done: %v", next.Err())
		}
		if reused = next == prev; reused {
			break
		}
		prev = next
	}
	if !reused {
		t.Fatal("no stream's context was handed on to the next")
	}

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://x.test/reset", nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := c.Do(req); err == nil {
			t.Error("a cancelled request succeeded")
		}
	}()
	reset := <-got
	cancel()
	<-done
	<-reset.Done() // the agent's RST_STREAM cancelled it
	for range 5 {
		if next := get("/c"); next == reset || next.Err() != nil {
			t.Fatalf("after a reset: reused the reset context %v, err %v", next == reset, next.Err())
		}
	}

	held := make(chan context.Context, 1)
	go func() {
		resp, err := c.Get("http://x.test/hold")
		if err == nil {
			resp.Body.Close()
		}
	}()
	held <- <-got
	if beside := get("/d"); beside == <-held {
		t.Fatal("two open streams share a context")
	}
	close(hold)
	last := get("/e")
	c.CloseIdleConnections()
	wg.Wait()
	if last.Err() == nil {
		t.Fatal("a kept context outlived its connection")
	}
}

// TestConcurrentResponsesWhole: responses of many streams written at once, each larger than
// the write buffer and the agent's initial windows, reach the agent whole and unmixed
// (frames written by one goroutine while others add theirs).
func TestConcurrentResponsesWhole(t *testing.T) {
	body := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i)}, 300<<10+i) }
	c, _ := serveTCP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := int(r.URL.Path[1] - 'a')
		b := body(i)
		for len(b) > 0 { // in uneven pieces, flushed now and then
			n := min(len(b), 7000+i*100)
			w.Write(b[:n])
			if len(b)%3 == 0 {
				w.(http.Flusher).Flush()
			}
			b = b[n:]
		}
	}))
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.Get("http://x.test/" + string(rune('a'+i)))
			if err != nil {
				t.Error(err)
				return
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || !bytes.Equal(got, body(i)) {
				t.Errorf("stream %d: %d bytes, %v", i, len(got), err)
			}
		}()
	}
	wg.Wait()
}

// TestHandlerStartsBeforeBody: a request whose body has not come starts its handler once the
// server has read what the agent sent, without waiting for the body (a handler may answer
// without it); one whose body came with it has the body whole.
func TestHandlerStartsBeforeBody(t *testing.T) {
	r, _ := dialRaw(t, testServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/whole" {
			b, _ := io.ReadAll(r.Body)
			io.WriteString(w, string(b))
			return
		}
		w.WriteHeader(http.StatusForbidden) // answered without the body
	})))
	post := func(path string) []string {
		return []string{":method", "POST", ":scheme", "https", ":authority", "x.test", ":path", path}
	}
	r.headers(1, false, post("/early")...) // and no body, ever
	h := r.next(func(f http2.Frame) bool { _, ok := f.(*http2.MetaHeadersFrame); return ok }).(*http2.MetaHeadersFrame)
	if h.StreamID != 1 || h.PseudoValue("status") != "403" {
		t.Fatalf("got %v %q", h.StreamID, h.PseudoValue("status"))
	}
	r.headers(3, false, post("/whole")...)
	r.write(func() { r.fr.WriteData(3, true, []byte("body")) })
	d := r.next(func(f http2.Frame) bool {
		d, ok := f.(*http2.DataFrame)
		return ok && d.StreamID == 3 && len(d.Data()) > 0
	}).(*http2.DataFrame)
	if string(d.Data()) != "body" {
		t.Fatalf("echoed %q", d.Data())
	}
}

// TestHeadersOnClosedStream: HEADERS on a stream both ends have ended is a connection error
// STREAM_CLOSED (RFC 9113, 5.1), also while the handler that ended the response still runs
// and the stream is not yet removed: what counts is what the agent has seen.
func TestHeadersOnClosedStream(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	r, _ := dialRaw(t, testServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
		if err := w.(interface{ Finish() error }).Finish(); err != nil {
			t.Error(err)
		}
		<-release
	})))
	r.headers(1, true, get...)
	r.next(func(f http2.Frame) bool {
		return f.Header().StreamID == 1 && f.Header().Flags.Has(http2.FlagDataEndStream)
	})
	r.headers(1, true, get...)
	f := r.next(func(f http2.Frame) bool {
		switch f.(type) {
		case *http2.RSTStreamFrame, *http2.GoAwayFrame:
			return true
		}
		return false
	})
	if ga, ok := f.(*http2.GoAwayFrame); !ok || ga.ErrCode != http2.ErrCodeStreamClosed {
		t.Fatalf("got %v, want GOAWAY STREAM_CLOSED", f)
	}
}
