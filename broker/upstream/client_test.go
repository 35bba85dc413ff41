package upstream

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The tests below run Client against servers on loopback ephemeral ports only. They
// synchronise on channels and on the servers' ConnState hooks; the only timers are guards
// that turn a hang into a failure (see within).

// guard bounds every wait for something that must happen: reaching it is a failure.
const guard = 10 * time.Second

// within waits for a value on ch, failing the test after guard.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(guard):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// connTracker counts a server's connections through its ConnState hook.
type connTracker struct {
	opened atomic.Int32
	closed chan net.Conn // StateClosed, in order
}

func newConnTracker() *connTracker { return &connTracker{closed: make(chan net.Conn, 100)} }

func (ct *connTracker) hook(c net.Conn, s http.ConnState) {
	switch s {
	case http.StateNew:
		ct.opened.Add(1)
	case http.StateClosed:
		select {
		case ct.closed <- c:
		default: // a test that looks for closes never makes this many
		}
	}
}

func (ct *connTracker) wantOpened(t *testing.T, want int32) {
	t.Helper()
	if got := ct.opened.Load(); got != want {
		t.Fatalf("server saw %d connections, want %d", got, want)
	}
}

// newServer starts an httptest server (TLS or plain, HTTP/2 offered or not) whose connections
// are counted.
func newServer(t testing.TB, h http.Handler, useTLS, h2 bool) (*httptest.Server, *connTracker) {
	t.Helper()
	ct := newConnTracker()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = ct.hook
	srv.EnableHTTP2 = h2
	if useTLS {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv, ct
}

// newClient returns a Client that may dial loopback and trusts cert (nil: plain HTTP only).
func newClient(t testing.TB, cert *x509.Certificate) *Client {
	t.Helper()
	opts := Options{AllowPrivate: pfx("127.0.0.1/32")}
	if cert != nil {
		opts.CAFile = filepath.Join(t.TempDir(), "ca.pem")
		writeFile(t, opts.CAFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}))
	}
	return newClientOpts(t, opts)
}

func clientFor(t testing.TB, srv *httptest.Server) *Client {
	t.Helper()
	if srv.TLS == nil {
		return newClient(t, nil)
	}
	return newClient(t, srv.Certificate())
}

// recordDials makes c hand every TCP connection it dials to the returned channel as well.
// Call it before c is used.
func recordDials(c *Client) <-chan net.Conn {
	ch := make(chan net.Conn, 100)
	dial := c.dial
	c.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := dial(ctx, network, addr)
		if err == nil {
			ch <- nc
		}
		return nc, err
	}
	return ch
}

// waitReadable waits until the kernel has something for nc to read (bytes or a FIN), without
// reading it: nc is a pooled connection nobody is reading.
func waitReadable(t *testing.T, nc net.Conn) {
	t.Helper()
	rc, err := nc.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	_ = nc.SetReadDeadline(time.Now().Add(guard))
	defer nc.SetReadDeadline(time.Time{})
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, err := unix.Recvfrom(int(fd), buf[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return !errors.Is(err, unix.EAGAIN) // false: wait until readable, then peek again
	})
	if err != nil {
		t.Fatalf("waiting for the server's close to reach the client: %v", err)
	}
}

func request(t *testing.T, method, url string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// do runs req and returns the status and the whole body, read to its end.
func do(t *testing.T, c *Client, req *http.Request) (int, string) {
	t.Helper()
	resp, err := c.RoundTrip(req, testPool)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", req.Method, req.URL, err)
	}
	return resp.StatusCode, string(b)
}

func mustGet(t *testing.T, c *Client, url, want string) {
	t.Helper()
	code, body := do(t, c, request(t, http.MethodGet, url, nil))
	if code != http.StatusOK || body != want {
		t.Fatalf("GET %s = %d %q, want 200 %q", url, code, body, want)
	}
}

type result struct {
	resp *http.Response
	err  error
}

// async runs c.RoundTrip(req, testPool) on a goroutine of its own.
func async(c *Client, req *http.Request) <-chan result {
	ch := make(chan result, 1)
	go func() {
		resp, err := c.RoundTrip(req, testPool)
		ch <- result{resp, err}
	}()
	return ch
}

// testPool is the pool of the tests' requests, where a test uses one.
const testPool Pool = "test-agent"

// keyOf is the key of testPool's connections to rawURL's origin.
func keyOf(t testing.TB, rawURL string) connKey {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return connKey{pool: testPool, origin: origin{https: u.Scheme == "https", addr: u.Host}}
}

// rawServer is a loopback listener whose connections are served by a test function, for
// responses Go's http.Server will not send.
type rawServer struct {
	URL      string
	cert     *x509.Certificate // nil for plain HTTP
	accepted atomic.Int32
}

func newRawServer(t *testing.T, useTLS bool, serve func(net.Conn)) *rawServer {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rs := &rawServer{URL: "http://" + ln.Addr().String()}
	if useTLS {
		// Borrow httptest's certificate (for 127.0.0.1); the server itself is not used.
		hs := httptest.NewUnstartedServer(http.NotFoundHandler())
		hs.StartTLS()
		hs.Close()
		rs.cert = hs.Certificate()
		ln = tls.NewListener(ln, &tls.Config{Certificates: hs.TLS.Certificates, NextProtos: []string{"http/1.1"}})
		rs.URL = "https://" + ln.Addr().String()
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			rs.accepted.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				serve(c)
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return rs
}

// 1 and 13: sequential requests whose bodies are read to the end share one connection, over
// TLS and plain HTTP, with Content-Length and chunked bodies, GETs and POSTs.
func TestClientKeepAlive(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/chunked" {
			io.WriteString(w, "chunk1 ")
			w.(http.Flusher).Flush() // no Content-Length: the body is chunked
		}
		fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.Path, b)
	})
	for _, scheme := range []string{"https", "http"} {
		t.Run(scheme, func(t *testing.T) {
			srv, ct := newServer(t, h, scheme == "https", false)
			c := clientFor(t, srv)
			for i := range 5 {
				mustGet(t, c, srv.URL+"/a", "GET /a ")
				mustGet(t, c, srv.URL+"/chunked", "chunk1 GET /chunked ")
				body := fmt.Sprintf("payload %d", i)
				if code, got := do(t, c, request(t, http.MethodPost, srv.URL+"/p", strings.NewReader(body))); code != 200 || got != "POST /p "+body {
					t.Fatalf("POST = %d %q", code, got)
				}
			}
			ct.wantOpened(t, 1)
			if !c.hasIdle(keyOf(t, srv.URL)) {
				t.Fatal("the connection is not back in the pool")
			}
		})
	}
}

// 2: a body closed before its end closes its connection; one read to EOF returns it; a
// response with Connection: close is not kept either.
func TestClientBodyNotReadToEnd(t *testing.T) {
	big := strings.Repeat("x", 64<<10)
	srv, ct := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			io.WriteString(w, big)
		case "/close":
			w.Header().Set("Connection", "close")
			io.WriteString(w, "bye")
		default:
			io.WriteString(w, "ok")
		}
	}), true, false)
	c := clientFor(t, srv)

	resp, err := c.RoundTrip(request(t, http.MethodGet, srv.URL+"/big", nil), testPool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	within(t, ct.closed, "the server to see the half-read connection closed")
	if c.hasIdle(keyOf(t, srv.URL)) {
		t.Fatal("a connection with an unread body was pooled")
	}

	mustGet(t, c, srv.URL+"/big", big)
	ct.wantOpened(t, 2)
	mustGet(t, c, srv.URL+"/", "ok") // the /big connection, read to EOF, is reused
	ct.wantOpened(t, 2)

	mustGet(t, c, srv.URL+"/close", "bye")
	within(t, ct.closed, "the Connection: close connection to close")
	mustGet(t, c, srv.URL+"/", "ok")
	ct.wantOpened(t, 3)
}

// 3: a server that closes a kept-alive connection after a response, without saying so.
func TestClientServerClosedIdle(t *testing.T) {
	// /close answers, then closes the connection when the test says (after the client has
	// read the response and pooled the connection); / answers with the request's body.
	newCloser := func(t *testing.T, useTLS bool) (*httptest.Server, *connTracker, chan struct{}, chan struct{}) {
		proceed, closed := make(chan struct{}, 1), make(chan struct{}, 1)
		done := make(chan struct{}) // a hijacked handler outlives httptest's Close: end it
		srv, ct := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/close" {
				b, _ := io.ReadAll(r.Body)
				fmt.Fprintf(w, "%s %s", r.Method, b)
				return
			}
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			brw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nclosed")
			brw.Flush()
			select {
			case <-proceed:
			case <-done:
			}
			conn.Close()
			closed <- struct{}{}
		}), useTLS, false)
		t.Cleanup(func() { close(done) })
		return srv, ct, proceed, closed
	}
	// pooledThenClosed returns a client whose one pooled connection the server has closed,
	// and that the liveness peek cannot see closed (as when the close arrives just after the
	// peek): the request fails on it.
	pooledThenClosed := func(t *testing.T, useTLS bool) (*httptest.Server, *connTracker, *Client) {
		srv, ct, proceed, closed := newCloser(t, useTLS)
		c := clientFor(t, srv)
		mustGet(t, c, srv.URL+"/close", "closed")
		pc := c.take(keyOf(t, srv.URL))
		if pc == nil {
			t.Fatal("no pooled connection")
		}
		pc.raw = nil // no socket to peek at: alive reports true
		c.put(pc)
		proceed <- struct{}{}
		within(t, closed, "the server to close")
		return srv, ct, c
	}
	for _, scheme := range []string{"https", "http"} {
		t.Run(scheme+" GET replayed", func(t *testing.T) {
			// The GET fails on the closed connection before any response, and is sent
			// again on a fresh connection.
			srv, ct, c := pooledThenClosed(t, scheme == "https")
			mustGet(t, c, srv.URL+"/", "GET ")
			ct.wantOpened(t, 2)
		})
		t.Run(scheme+" idempotent POST replayed with its body", func(t *testing.T) {
			srv, ct, c := pooledThenClosed(t, scheme == "https")
			req := request(t, http.MethodPost, srv.URL+"/", strings.NewReader("body once more"))
			req.Header.Set("Idempotency-Key", "k1")
			if code, body := do(t, c, req); code != 200 || body != "POST body once more" {
				t.Fatalf("POST = %d %q", code, body)
			}
			ct.wantOpened(t, 2)
		})
		t.Run(scheme+" liveness check", func(t *testing.T) {
			// The pooled connection is checked when it is taken: a POST, which is never
			// replayed, goes out on a new connection. Over TLS the server's close arrives as a
			// close_notify alert (bytes to read) before the FIN.
			srv, ct, proceed, closed := newCloser(t, scheme == "https")
			c := clientFor(t, srv)
			dials := recordDials(c)
			mustGet(t, c, srv.URL+"/close", "closed")
			first := within(t, dials, "the first dial")
			proceed <- struct{}{}
			within(t, closed, "the server to close")
			waitReadable(t, first)
			if code, body := do(t, c, request(t, http.MethodPost, srv.URL+"/", strings.NewReader("once"))); code != 200 || body != "POST once" {
				t.Fatalf("POST = %d %q", code, body)
			}
			ct.wantOpened(t, 2)
		})
	}
	t.Run("unsolicited bytes on an idle connection", func(t *testing.T) {
		// Bytes a server sends on an idle connection answer no request: were the connection
		// reused, they would be read as the next request's response.
		proceed, done := make(chan struct{}), make(chan struct{})
		t.Cleanup(func() { close(done) })
		sent := make(chan struct{}, 1)
		var n atomic.Int32
		srv := newRawServer(t, false, func(conn net.Conn) {
			first := n.Add(1) == 1
			br := bufio.NewReader(conn)
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
			if first {
				select {
				case <-proceed:
				case <-done:
					return
				}
				io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale")
				sent <- struct{}{}
			}
			io.Copy(io.Discard, br) // hold the connection open, answer nothing more
		})
		c := newClient(t, nil)
		dials := recordDials(c)
		mustGet(t, c, srv.URL+"/", "first")
		first := within(t, dials, "the first dial")
		close(proceed)
		within(t, sent, "the unsolicited response")
		waitReadable(t, first)
		mustGet(t, c, srv.URL+"/", "first")
		if n := srv.accepted.Load(); n != 2 {
			t.Fatalf("server accepted %d connections, want 2", n)
		}
	})
}

// 4: a POST with a streaming body, answered 413 before the server has read the body.
func TestClientEarlyResponseStreamingBody(t *testing.T) {
	postClosed := make(chan struct{}, 1)
	srv := newRawServer(t, true, func(conn net.Conn) {
		br := bufio.NewReader(conn)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			if req.Method == http.MethodPost {
				// No Connection: close: only the unfinished request body tells the client
				// the connection cannot be reused.
				io.WriteString(conn, "HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 8\r\n\r\ntoo big!")
				io.Copy(io.Discard, conn) // read on, answer nothing, until the client closes
				postClosed <- struct{}{}
				return
			}
			io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	c := newClient(t, srv.cert)
	c.headerTimeout = guard // a reused POST connection must fail the test, not hang it

	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() })
	req := request(t, http.MethodPost, srv.URL+"/upload", pr)
	req.ContentLength = -1 // unknown: sent chunked, as net/http's server gives a chunked body
	if req.GetBody != nil || !streaming(req) || replayable(req) {
		t.Fatal("the request is not a non-replayable streaming one")
	}
	res := within(t, async(c, req), "the 413")
	if res.err != nil {
		t.Fatalf("RoundTrip: %v, want the 413 response", res.err)
	}
	b, err := io.ReadAll(res.resp.Body)
	res.resp.Body.Close()
	if res.resp.StatusCode != http.StatusRequestEntityTooLarge || string(b) != "too big!" || err != nil {
		t.Fatalf("got %d %q %v, want 413 %q", res.resp.StatusCode, b, err, "too big!")
	}
	if c.hasIdle(keyOf(t, srv.URL)) {
		t.Fatal("the connection with an unfinished request body was pooled")
	}
	within(t, postClosed, "the client to close the POST's connection")

	// The request body is closed once its writer finds the connection gone.
	wrote := make(chan error, 1)
	go func() {
		chunk := make([]byte, 8<<10)
		for range 1000 {
			if _, err := pw.Write(chunk); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	if err := within(t, wrote, "the request body to be closed"); !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("writing the request body: %v, want io.ErrClosedPipe (the body closed)", err)
	}

	mustGet(t, c, srv.URL+"/", "ok")
	if n := srv.accepted.Load(); n != 2 {
		t.Fatalf("server accepted %d connections, want 2", n)
	}
}

// 5: a response header block over maxResponseHeaderBytes is an error, not a hang or an
// unbounded read.
func TestClientResponseHeaderTooLarge(t *testing.T) {
	srv := newRawServer(t, true, func(conn net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(conn)); err != nil {
			return
		}
		bw := bufio.NewWriter(conn)
		bw.WriteString("HTTP/1.1 200 OK\r\nX-Big: ")
		bw.WriteString(strings.Repeat("a", maxResponseHeaderBytes+maxResponseHeaderBytes/10))
		bw.WriteString("\r\nContent-Length: 2\r\n\r\nok")
		bw.Flush() // fails once the client gives up and closes
	})
	c := newClient(t, srv.cert)
	res := within(t, async(c, request(t, http.MethodGet, srv.URL+"/", nil)), "RoundTrip")
	if res.err == nil {
		res.resp.Body.Close()
		t.Fatal("RoundTrip succeeded, want an error for the oversized header")
	}
	if !strings.Contains(res.err.Error(), "larger than") {
		t.Fatalf("err = %v, want the header size limit", res.err)
	}
}

// 6: no response header within headerTimeout is a timeout error, sent once.
func TestClientHeaderTimeout(t *testing.T) {
	release := make(chan struct{})
	var blocked atomic.Int32
	srv, _ := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			blocked.Add(1)
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		io.WriteString(w, "ok")
	}), true, false)
	t.Cleanup(func() { close(release) }) // before srv.Close, which waits for handlers

	for _, tc := range []struct{ reused, stalledBody bool }{{false, false}, {true, false}, {true, true}} {
		reused, stalledBody := tc.reused, tc.stalledBody
		t.Run(fmt.Sprintf("reused=%v streaming body stalled=%v", reused, stalledBody), func(t *testing.T) {
			c := clientFor(t, srv)
			c.headerTimeout = 200 * time.Millisecond
			if reused {
				mustGet(t, c, srv.URL+"/", "ok")
			}
			before := blocked.Load()
			start := time.Now()
			req := request(t, http.MethodGet, srv.URL+"/block", nil)
			if stalledBody {
				pr, pw := io.Pipe() // nothing is ever written: the body's writer waits in Read
				t.Cleanup(func() { pw.Close() })
				req = request(t, http.MethodPost, srv.URL+"/block", pr)
				req.ContentLength = -1
			}
			res := within(t, async(c, req), "RoundTrip")
			if res.err == nil {
				res.resp.Body.Close()
				t.Fatal("RoundTrip succeeded, want a timeout")
			}
			var ne net.Error
			if !errors.As(res.err, &ne) || !ne.Timeout() {
				t.Fatalf("err = %v, want a net.Error with Timeout()", res.err)
			}
			if d := time.Since(start); d < c.headerTimeout {
				t.Fatalf("timed out after %v, before the header timeout %v", d, c.headerTimeout)
			}
			// A slow server is not a closed connection: the request is not sent again.
			if n := blocked.Load() - before; n != 1 {
				t.Fatalf("the server got the request %d times, want 1", n)
			}
		})
	}
}

// 7: cancelling the request's context while the response is awaited ends RoundTrip with
// context.Canceled and closes the connection.
func TestClientContextCancel(t *testing.T) {
	for _, stalledBody := range []bool{false, true} {
		t.Run(fmt.Sprintf("streaming body stalled=%v", stalledBody), func(t *testing.T) {
			entered, sawClose := make(chan struct{}, 1), make(chan struct{}, 1)
			release := make(chan struct{})
			srv, ct := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				entered <- struct{}{}
				if r.Method == http.MethodPost {
					// The body never comes: the read ends when the client closes.
					if _, err := io.Copy(io.Discard, r.Body); err != nil {
						sawClose <- struct{}{}
					}
					return
				}
				select {
				case <-r.Context().Done(): // the server noticed the client's close
					sawClose <- struct{}{}
				case <-release:
				}
			}), true, false)
			t.Cleanup(func() { close(release) })
			c := clientFor(t, srv)

			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/", nil)
			if stalledBody {
				pr, pw := io.Pipe() // nothing is ever written: the body's writer waits in Read
				t.Cleanup(func() { pw.Close() })
				req, _ = http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/", pr)
				req.ContentLength = -1
			}
			done := async(c, req)
			within(t, entered, "the request to reach the handler")
			start := time.Now()
			cancel()
			res := within(t, done, "RoundTrip to return after the cancel")
			if res.err == nil {
				// The cancel closes the connection; a server that ends the request on the close
				// (here: an empty 200) must not have its answer taken for the response.
				res.resp.Body.Close()
				t.Fatalf("RoundTrip succeeded after its context was cancelled: %d %v", res.resp.StatusCode, res.resp.Header)
			}
			if !errors.Is(res.err, context.Canceled) {
				t.Fatalf("err = %v, want context.Canceled", res.err)
			}
			if d := time.Since(start); d > guard/2 {
				t.Fatalf("RoundTrip took %v to return after the cancel", d)
			}
			within(t, sawClose, "the server to see the connection closed")
			within(t, ct.closed, "the server to close its side")
			if c.hasIdle(keyOf(t, srv.URL)) {
				t.Fatal("the abandoned connection was pooled")
			}
		})
	}
}

// closeTracker is a request body that records its Close.
type closeTracker struct {
	io.Reader
	closed atomic.Bool
}

func (b *closeTracker) Close() error { b.closed.Store(true); return nil }

// 8: a header value with a line break (an injected secret could hold one) is refused before
// anything is dialled or sent, and the error does not quote the value.
func TestClientRefusesLineBreaksInHeaders(t *testing.T) {
	srv, ct := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the server got a request: %v", r.Header)
	}), true, false)
	const canary = "CANARY-s3cr3t-7f1d"
	for name, value := range map[string]string{
		"CRLF":     "Bearer " + canary + "\r\nX-Injected: 1",
		"LF":       "Bearer " + canary + "\nX-Injected: 1",
		"CR":       "Bearer " + canary + "\rX-Injected: 1",
		"NUL":      "Bearer " + canary + "\x00",
		"trailing": "Bearer " + canary + "\r\n",
	} {
		for _, trailer := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s trailer=%v", name, trailer), func(t *testing.T) {
				c := clientFor(t, srv)
				dials := recordDials(c)
				body := &closeTracker{Reader: strings.NewReader("data")}
				req := request(t, http.MethodPost, srv.URL+"/", body)
				if trailer {
					req.Trailer = http.Header{"X-Sig": {value}}
				} else {
					req.Header.Set("Authorization", value)
				}
				resp, err := c.RoundTrip(req, testPool)
				if err == nil {
					resp.Body.Close()
					t.Fatal("RoundTrip sent a header value with a line break")
				}
				if strings.Contains(err.Error(), canary) {
					t.Fatalf("the error quotes the header value: %v", err)
				}
				if !body.closed.Load() {
					t.Error("the request body was not closed")
				}
				if len(dials) != 0 {
					t.Error("a connection was dialled for a refused request")
				}
			})
		}
	}
	ct.wantOpened(t, 0)
}

// 9: informational responses before the final one are skipped.
func TestClientInformationalResponses(t *testing.T) {
	srv, ct := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		w.Header().Set("X-Final", "yes")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "final")
	}), true, false)
	c := clientFor(t, srv)
	for range 2 {
		resp, err := c.RoundTrip(request(t, http.MethodGet, srv.URL+"/", nil), testPool)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(b) != "final" || resp.Header.Get("X-Final") != "yes" || resp.Header.Get("Link") != "" {
			t.Fatalf("got %d %q %v, want the final 200", resp.StatusCode, b, resp.Header)
		}
	}
	ct.wantOpened(t, 1)

	t.Run("raw 100 and 103 then 200", func(t *testing.T) {
		srv := newRawServer(t, true, func(conn net.Conn) {
			if _, err := http.ReadRequest(bufio.NewReader(conn)); err != nil {
				return
			}
			io.WriteString(conn, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"+
				"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		})
		mustGet(t, newClient(t, srv.cert), srv.URL+"/", "ok")
	})
	t.Run("endless 1xx", func(t *testing.T) {
		srv := newRawServer(t, true, func(conn net.Conn) {
			if _, err := http.ReadRequest(bufio.NewReader(conn)); err != nil {
				return
			}
			for range 100 {
				if _, err := io.WriteString(conn, "HTTP/1.1 103 Early Hints\r\n\r\n"); err != nil {
					return
				}
			}
		})
		res := within(t, async(newClient(t, srv.cert), request(t, http.MethodGet, srv.URL+"/", nil)), "RoundTrip")
		if res.err == nil || !strings.Contains(res.err.Error(), "informational") {
			if res.err == nil {
				res.resp.Body.Close()
			}
			t.Fatalf("err = %v, want too many informational responses", res.err)
		}
	})
}

// 10: a request after Prepare uses the prepared connection.
// The prepared connection passes the liveness check (TLS 1.3 session tickets may be waiting
// on it, unread).
func TestClientPrepare(t *testing.T) {
	srv, ct := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}), true, false)
	c := clientFor(t, srv)
	prepared := make(chan struct{}, 1)
	c.prepared = func() { prepared <- struct{}{} }
	addr := srv.Listener.Addr().String()
	c.Prepare(addr, false)
	within(t, prepared, "the prepared connection")
	ct.wantOpened(t, 1)
	c.Prepare(addr, false) // one is idle already: nothing to do
	mustGet(t, c, srv.URL+"/", "ok")
	ct.wantOpened(t, 1)
}

// A request that finds the pool empty while a Prepare dial is under way waits for it instead
// of dialling a second connection beside it; one whose context ends meanwhile stops waiting.
func TestClientRequestWaitsForPrepare(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			srv, ct := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, r.Proto)
			}), true, h2)
			c := clientFor(t, srv)
			release, dials := make(chan struct{}), make(chan struct{}, 10)
			dial := c.dial
			c.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
				dials <- struct{}{}
				<-release // every dial waits until the request is waiting
				return dial(ctx, network, addr)
			}
			waiting := make(chan struct{}, 1)
			c.awaitingPrepared = func() { waiting <- struct{}{} }
			c.Prepare(srv.Listener.Addr().String(), false)
			within(t, dials, "the prepared dial")
			res := async(c, request(t, http.MethodGet, srv.URL+"/", nil))
			select {
			case <-waiting:
			case <-dials:
				t.Fatal("the request dialled a connection of its own while the prepared one was being dialled")
			}
			close(release)
			r := within(t, res, "the response")
			if r.err != nil {
				t.Fatal(r.err)
			}
			b, _ := io.ReadAll(r.resp.Body)
			r.resp.Body.Close()
			want := "HTTP/1.1"
			if h2 {
				want = "HTTP/2.0"
			}
			if string(b) != want {
				t.Fatalf("response %q, want %q", b, want)
			}
			ct.wantOpened(t, 1)
		})
	}
	t.Run("context ends while waiting", func(t *testing.T) {
		srv, _ := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), true, false)
		c := clientFor(t, srv)
		release := make(chan struct{})
		t.Cleanup(func() { close(release) })
		dial := c.dial
		c.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			<-release
			return dial(ctx, network, addr)
		}
		waiting := make(chan struct{}, 1)
		c.awaitingPrepared = func() { waiting <- struct{}{} }
		c.Prepare(srv.Listener.Addr().String(), false)
		ctx, cancel := context.WithCancel(t.Context())
		req := request(t, http.MethodGet, srv.URL+"/", nil).WithContext(ctx)
		res := async(c, req)
		within(t, waiting, "the request to wait")
		cancel()
		if r := within(t, res, "RoundTrip to return"); !errors.Is(r.err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", r.err)
		}
	})
}

// 11: a host whose TLS handshake negotiates h2 is served over HTTP/2 by the Transport, on the
// connection the client dialled.
func TestClientH2Handoff(t *testing.T) {
	srv, ct := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Proto)
	}), true, true)
	c := clientFor(t, srv)
	for range 2 {
		mustGet(t, c, srv.URL+"/", "HTTP/2.0")
	}
	ct.wantOpened(t, 1)
	if !c.isH2(srv.Listener.Addr().String()) {
		t.Fatal("the host is not marked h2")
	}
	c.handoff.Range(func(k, _ any) bool {
		t.Errorf("connection to %v still waiting for the Transport", k)
		return true
	})
}

// A prepared connection the server closed before any request (its keep-alive timeout, say) is
// not used, although its close (close_notify, after the session tickets) reads as bytes:
// a POST, never replayed, goes out on a new connection.
func TestClientPreparedThenClosed(t *testing.T) {
	closed := make(chan struct{}, 1)
	var n atomic.Int32
	srv := newRawServer(t, true, func(conn net.Conn) {
		if n.Add(1) == 1 {
			if err := conn.(*tls.Conn).Handshake(); err != nil {
				t.Error(err)
			}
			conn.Close()
			closed <- struct{}{}
			return
		}
		br := bufio.NewReader(conn)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		b, _ := io.ReadAll(req.Body)
		fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
	})
	c := newClient(t, srv.cert)
	dials := recordDials(c)
	prepared := make(chan struct{}, 1)
	c.prepared = func() { prepared <- struct{}{} }
	c.Prepare(strings.TrimPrefix(srv.URL, "https://"), false)
	within(t, prepared, "the prepared connection")
	first := within(t, dials, "the prepared dial")
	within(t, closed, "the server to close")
	waitPeerClosed(t, first)
	if code, body := do(t, c, request(t, http.MethodPost, srv.URL+"/", strings.NewReader("once"))); code != 200 || body != "once" {
		t.Fatalf("POST = %d %q", code, body)
	}
	if n := srv.accepted.Load(); n != 2 {
		t.Fatalf("server accepted %d connections, want 2", n)
	}
}

// waitPeerClosed waits until the kernel has seen the peer of nc close its side.
func waitPeerClosed(t *testing.T, nc net.Conn) {
	t.Helper()
	rc, err := nc.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(guard)
	for {
		closed := false
		_ = rc.Control(func(fd uintptr) { closed = peerClosed(fd) })
		if closed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the server's close did not reach the client")
		}
		runtime.Gosched()
	}
}

// A handed-off h2 connection nobody took in time (a Prepare no request followed) is closed,
// not given to the Transport: the server may have closed it meanwhile.
func TestClientStaleHandoff(t *testing.T) {
	srv, ct := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Proto)
	}), true, true)
	c := clientFor(t, srv)
	addr := srv.Listener.Addr().String()
	c.Prepare(addr, false)
	if done, ok := c.preparing.Load(origin{https: true, addr: addr}); ok { // else the dial is over already
		within(t, done.(chan struct{}), "the prepared dial")
	}
	v, ok := c.handoff.Load(handoffKey("", addr))
	if !ok {
		t.Fatal("the prepared h2 connection is not waiting for the Transport")
	}
	stale := v.(handedOff)
	c.handoff.Store(handoffKey("", addr), handedOff{stale.Conn, stale.at.Add(-maxHandoffAge), stale.via, stale.inspected})
	mustGet(t, c, srv.URL+"/", "HTTP/2.0")
	ct.wantOpened(t, 2)
	within(t, ct.closed, "the stale connection to be closed")
}

// 12: a connection idle for idleTimeout is closed and leaves the pool.
func TestClientIdleExpiry(t *testing.T) {
	srv, ct := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}), true, false)
	c := clientFor(t, srv)
	c.idleTimeout = 50 * time.Millisecond
	mustGet(t, c, srv.URL+"/", "ok")
	within(t, ct.closed, "the idle connection to be closed")
	if c.hasIdle(keyOf(t, srv.URL)) {
		t.Fatal("the expired connection is still pooled")
	}
	c.mu.Lock()
	n := c.nidle
	c.mu.Unlock()
	if n != 0 {
		t.Fatalf("nidle = %d after expiry, want 0", n)
	}
	mustGet(t, c, srv.URL+"/", "ok")
	ct.wantOpened(t, 2)

	t.Run("expire after take is a no-op", func(t *testing.T) {
		c := clientFor(t, srv)
		mustGet(t, c, srv.URL+"/", "ok")
		pc := c.take(keyOf(t, srv.URL))
		if pc == nil {
			t.Fatal("no pooled connection")
		}
		pc.expire() // the timer fired as the connection was taken: it must stay open
		c.put(pc)
		opened := ct.opened.Load()
		mustGet(t, c, srv.URL+"/", "ok")
		ct.wantOpened(t, opened)
	})
}

// 14: a 101 response's body is the connection: readable (bytes sent with the response head
// first) and writable; the upgrade has a connection of its own.
func TestClientUpgrade(t *testing.T) {
	echoed := make(chan struct{}, 1)
	srv, ct := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			io.WriteString(w, "ok")
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\nhello\n")
		brw.Flush()
		io.Copy(conn, brw) // echo until the client closes
		echoed <- struct{}{}
	}), true, false)
	c := clientFor(t, srv)
	mustGet(t, c, srv.URL+"/", "ok") // an idle connection the upgrade must not take

	req := request(t, http.MethodGet, srv.URL+"/ws", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "echo")
	resp, err := c.RoundTrip(req, testPool)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		resp.Body.Close()
		t.Fatalf("status %d, want 101", resp.StatusCode)
	}
	rw, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		t.Fatalf("101 body %T is not an io.ReadWriteCloser", resp.Body)
	}
	buf := make([]byte, 6)
	if _, err := io.ReadFull(rw, buf); err != nil || string(buf) != "hello\n" {
		t.Fatalf("read %q, %v; want the bytes sent with the 101", buf, err)
	}
	for _, msg := range []string{"ping\n", strings.Repeat("z", 100<<10)} {
		if _, err := io.WriteString(rw, msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(rw, got); err != nil || !bytes.Equal(got, []byte(msg)) {
			t.Fatalf("echo of %d bytes: %v", len(msg), err)
		}
	}
	ct.wantOpened(t, 2)
	rw.Close()
	within(t, echoed, "the server to see the upgraded connection closed")
	mustGet(t, c, srv.URL+"/", "ok") // the first connection, still pooled
	ct.wantOpened(t, 2)
}
