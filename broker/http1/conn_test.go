package http1

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/capbroker/capbroker/internal/tcppair"
)

// served is one loopback connection served by a Server: the agent's end, a reader for its
// responses, the Conn, a channel closed when the connection has ended (end being called more
// than once fails the test), and one that receives each time it parks.
type served struct {
	agent  *net.TCPConn
	br     *bufio.Reader
	conn   *Conn
	ended  <-chan struct{}
	parked <-chan struct{}
}

func serve(t testing.TB, s *Server) *served {
	t.Helper()
	agent, raw := tcppair.New(t)
	if s.Handler == nil {
		s.Handler = http.HandlerFunc(echo)
	}
	if s.IdleTimeout == 0 {
		s.IdleTimeout = time.Minute
	}
	if s.ReadHeaderTimeout == 0 {
		s.ReadHeaderTimeout = 10 * time.Second
	}
	if s.MaxHeaderBytes == 0 {
		s.MaxHeaderBytes = 64 << 10
	}
	var ends atomic.Int32
	ended := make(chan struct{})
	c := s.NewConn(raw, func() {
		if ends.Add(1) == 1 {
			close(ended)
		} else {
			t.Error("the connection's end was called twice")
		}
	})
	parked := make(chan struct{}, 16)
	c.onPark = func() { parked <- struct{}{} }
	go c.Serve()
	return &served{agent: agent, br: bufio.NewReader(agent), conn: c, ended: ended, parked: parked}
}

// echo answers with the request's method, path and body.
func echo(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.Path, body)
}

// roundTrip writes raw and reads one response per want, checking each body.
func (s *served) roundTrip(t *testing.T, raw string, want ...string) {
	t.Helper()
	if _, err := io.WriteString(s.agent, raw); err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		resp, err := http.ReadResponse(s.br, nil)
		if err != nil {
			t.Fatalf("reading the response to get %q: %v", w, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(got) != w {
			t.Fatalf("got %q (%v), want %q", got, err, w)
		}
	}
}

// response reads one response whole.
func (s *served) response(t *testing.T, raw string) (*http.Response, string) {
	t.Helper()
	if raw != "" {
		if _, err := io.WriteString(s.agent, raw); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.ReadResponse(s.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// waitEnd reads until the server closes the connection, then waits for its end.
func (s *served) waitEnd(t *testing.T) {
	t.Helper()
	if rest, err := io.ReadAll(s.br); err != nil || len(rest) > 0 {
		t.Fatalf("after the last response: %q, %v", rest, err)
	}
	<-s.ended
}

func (s *served) waitPark(t *testing.T) {
	t.Helper()
	select {
	case <-s.parked:
	case <-time.After(10 * time.Second):
		t.Fatal("the connection did not park")
	}
}

// TestParkingKeepsEveryByte: a connection parked after each response (Linger 0) answers every
// request right, however its bytes arrive: whole, with a body by length or chunked, pipelined
// in one write, or one byte at a time. Each request is sent once the connection has parked.
func TestParkingKeepsEveryByte(t *testing.T) {
	s := serve(t, &Server{})
	s.waitPark(t)
	s.roundTrip(t, "GET /1 HTTP/1.1\r\nHost: a\r\n\r\n", "GET /1 ")
	s.waitPark(t)
	s.roundTrip(t, "POST /2 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello", "POST /2 hello")
	s.waitPark(t)
	s.roundTrip(t, "POST /3 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", "POST /3 abcde")
	s.waitPark(t)
	s.roundTrip(t, "GET /4 HTTP/1.1\r\nHost: a\r\n\r\nGET /5 HTTP/1.1\r\nHost: a\r\n\r\n", "GET /4 ", "GET /5 ")
	s.waitPark(t)
	for _, b := range []byte("POST /6 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nxyz") {
		if _, err := s.agent.Write([]byte{b}); err != nil {
			t.Fatal(err)
		}
	}
	s.roundTrip(t, "", "POST /6 xyz")
	if p := s.conn.Parks(); p < 5 {
		t.Errorf("parked %d times, want at least 5", p)
	}
}

// TestLingerKeepsBusyConnections: requests closer together than Linger never park.
func TestLingerKeepsBusyConnections(t *testing.T) {
	s := serve(t, &Server{Linger: time.Hour})
	for i := range 20 {
		s.roundTrip(t, fmt.Sprintf("GET /%d HTTP/1.1\r\nHost: a\r\n\r\n", i), fmt.Sprintf("GET /%d ", i))
	}
	if p := s.conn.Parks(); p != 0 {
		t.Errorf("parked %d times", p)
	}
}

// TestIdleTimeout: a connection that gets no request for IdleTimeout ends, parked or not.
func TestIdleTimeout(t *testing.T) {
	for name, linger := range map[string]time.Duration{"parked": 0, "lingering": time.Hour} {
		t.Run(name, func(t *testing.T) {
			s := serve(t, &Server{IdleTimeout: 50 * time.Millisecond, Linger: linger})
			s.roundTrip(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n", "GET / ")
			s.waitEnd(t)
		})
	}
}

// TestReadHeaderTimeout: a head that does not arrive whole in time ends the connection.
func TestReadHeaderTimeout(t *testing.T) {
	s := serve(t, &Server{ReadHeaderTimeout: 50 * time.Millisecond, Linger: time.Hour})
	io.WriteString(s.agent, "GET / HTTP/1.1\r\nHo")
	s.waitEnd(t)
}

// TestShutdown: a drain ends a parked or waiting connection at once, and lets a busy one
// finish its response, which says the connection closes.
func TestShutdown(t *testing.T) {
	for name, linger := range map[string]time.Duration{"parked": 0, "waiting": time.Hour} {
		t.Run(name, func(t *testing.T) {
			s := serve(t, &Server{Linger: linger})
			s.roundTrip(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n", "GET / ")
			if linger == 0 {
				s.waitPark(t)
			}
			if err := s.conn.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			s.waitEnd(t)
		})
	}
	release, arrived := make(chan struct{}), make(chan struct{})
	s := serve(t, &Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
		io.WriteString(w, "done")
	})})
	io.WriteString(s.agent, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	<-arrived
	shut := make(chan error, 1)
	go func() { shut <- s.conn.Shutdown(context.Background()) }()
	for !s.conn.isDraining() {
		time.Sleep(time.Millisecond) // polls the conn's state, not a delay standing in for it
	}
	close(release)
	resp, body := s.response(t, "")
	if body != "done" || !resp.Close {
		t.Fatalf("the last response: %q, close %v", body, resp.Close)
	}
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
	s.waitEnd(t)
}

func (c *Conn) isDraining() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.draining
}

// TestAgentGoneEndsContext: a request handled longer than watchDelay learns that its agent
// went away (its context ends); a request pipelined behind a slow one is still answered; and
// quick requests never read the connection beside the handler.
func TestAgentGoneEndsContext(t *testing.T) {
	gone := make(chan error, 1)
	arrived := make(chan struct{})
	s := serve(t, &Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		select {
		case <-r.Context().Done():
			gone <- r.Context().Err()
		case <-time.After(10 * time.Second):
			gone <- errors.New("the request's context did not end when its agent went away")
		}
	})})
	io.WriteString(s.agent, "GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
	<-arrived
	s.agent.Close()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	<-s.ended

	release, watching := make(chan struct{}), make(chan struct{}, 1)
	s = serve(t, &Server{Linger: time.Hour, onWatch: func() { watching <- struct{}{} }, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/first" {
			<-release
		}
		echo(w, r)
	})})
	io.WriteString(s.agent, "GET /first HTTP/1.1\r\nHost: a\r\n\r\n")
	<-watching // the watch reads the connection: the next request's first byte goes to it
	io.WriteString(s.agent, "GET /second HTTP/1.1\r\nHost: a\r\n\r\n")
	close(release)
	s.roundTrip(t, "", "GET /first ", "GET /second ")
}

// TestWatchListCountsServes: a parked connection is served again by its park's goroutine,
// whose Serve may add it to the watch list before the Serve that parked it has removed it. It
// stays watched until both have removed it: a set lost it, and the agent going away then ended
// none of its requests (TestAgentGoneEndsContext failed so, at times, under load).
func TestWatchListCountsServes(t *testing.T) {
	l := &watchList{conns: map[*Conn]int{}}
	c := &Conn{}
	listed := func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		_, ok := l.conns[c]
		return ok
	}
	l.add(c)    // the Serve that parks it
	l.add(c)    // the park's goroutine serves it again
	l.remove(c) // the first Serve returns
	if !listed() {
		t.Fatal("the connection left the watch list while served again")
	}
	l.remove(c)
	if listed() {
		t.Fatal("the connection stayed on the watch list after its last Serve")
	}
}

// TestFraming: responses are framed as net/http's server frames them.
func TestFraming(t *testing.T) {
	long := strings.Repeat("x", 3*shortBody)
	cases := map[string]struct {
		handler    http.HandlerFunc
		req        string
		wantCL     int64
		wantTE     []string
		wantBody   string
		wantClose  bool
		wantHeader map[string]string
	}{
		"short body gets a length": {
			handler: func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") },
			req:     "GET / HTTP/1.1\r\nHost: a\r\n\r\n", wantCL: 5, wantBody: "hello",
			wantHeader: map[string]string{"Content-Type": "text/plain; charset=utf-8"},
		},
		"long body is chunked": {
			handler: func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, long) },
			req:     "GET / HTTP/1.1\r\nHost: a\r\n\r\n", wantCL: -1, wantTE: []string{"chunked"}, wantBody: long,
		},
		"flushed body is chunked": {
			handler: func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, "a")
				http.NewResponseController(w).Flush()
				io.WriteString(w, "b")
			},
			req: "GET / HTTP/1.1\r\nHost: a\r\n\r\n", wantCL: -1, wantTE: []string{"chunked"}, wantBody: "ab",
		},
		"handler's length kept": {
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", "4")
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, "{}")
				http.NewResponseController(w).Flush()
				io.WriteString(w, "{}")
			},
			req: "GET / HTTP/1.1\r\nHost: a\r\n\r\n", wantCL: 4, wantBody: "{}{}",
			wantHeader: map[string]string{"Content-Type": "application/json"},
		},
		"HEAD has no body": {
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", "4")
				io.WriteString(w, "abcd")
			},
			req: "HEAD / HTTP/1.1\r\nHost: a\r\n\r\n", wantCL: 4,
		},
		"204 has no body": {
			handler: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) },
			req:     "GET / HTTP/1.1\r\nHost: a\r\n\r\n", wantCL: 0, // as Go's client reads a 204
		},
		"HTTP/1.0 without length closes": {
			handler: func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, "a")
				http.NewResponseController(w).Flush()
			},
			req: "GET / HTTP/1.0\r\n\r\n", wantCL: -1, wantBody: "a", wantClose: true,
		},
		"request asks to close": {
			handler: func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "a") },
			req:     "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", wantCL: 1, wantBody: "a", wantClose: true,
		},
		"handler asks to close": {
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Connection", "close")
				io.WriteString(w, "a")
			},
			req: "GET / HTTP/1.1\r\nHost: a\r\n\r\n", wantCL: 1, wantBody: "a", wantClose: true,
		},
		"trailers": {
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Trailer", "X-Sum")
				io.WriteString(w, "a")
				w.Header().Set(http.TrailerPrefix+"X-Sum", "1")
			},
			req: "GET / HTTP/1.1\r\nHost: a\r\n\r\n", wantCL: -1, wantTE: []string{"chunked"}, wantBody: "a",
		},
		"short body of a length too long closes": {
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", "10")
				io.WriteString(w, "abc")
			},
			req: "GET / HTTP/1.1\r\nHost: a\r\n\r\n", wantCL: 10, wantClose: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := serve(t, &Server{Handler: tc.handler, Linger: time.Hour})
			io.WriteString(s.agent, tc.req)
			resp, err := http.ReadResponse(s.br, &http.Request{Method: strings.Fields(tc.req)[0]})
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if name == "short body of a length too long closes" {
				if err == nil {
					t.Fatal("a body cut short was read whole")
				}
				s.waitEnd(t)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(body) != tc.wantBody || resp.ContentLength != tc.wantCL || fmt.Sprint(resp.TransferEncoding) != fmt.Sprint(tc.wantTE) {
				t.Fatalf("body %q length %d TE %v; want %q %d %v", body, resp.ContentLength, resp.TransferEncoding, tc.wantBody, tc.wantCL, tc.wantTE)
			}
			if resp.Header.Get("Date") == "" {
				t.Error("no Date")
			}
			for k, v := range tc.wantHeader {
				if got := resp.Header.Get(k); got != v {
					t.Errorf("%s: %q, want %q", k, got, v)
				}
			}
			if name == "trailers" && resp.Trailer.Get("X-Sum") != "1" {
				t.Errorf("trailer: %v", resp.Trailer)
			}
			if resp.Close != tc.wantClose {
				t.Fatalf("close %v, want %v", resp.Close, tc.wantClose)
			}
			if tc.wantClose {
				s.waitEnd(t)
			} else {
				s.roundTrip(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
			}
		})
	}
}

// TestRefusals: requests net/http's server refuses before a handler sees them are refused
// alike, and the connection ends.
func TestRefusals(t *testing.T) {
	cases := map[string]struct {
		req  string
		want int
	}{
		"no Host":             {"GET / HTTP/1.1\r\n\r\n", 400},
		"bad Host":            {"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400},
		"bad header name":     {"GET / HTTP/1.1\r\nHost: a\r\nA(b: c\r\n\r\n", 400},
		"unknown expectation": {"GET / HTTP/1.1\r\nHost: a\r\nExpect: magic\r\n\r\n", 417},
		"HTTP/2.0":            {"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505},
		"garbage":             {"\x01\x02\x03\r\n\r\n", 400},
		"head too large":      {"GET / HTTP/1.1\r\nHost: a\r\nX: " + strings.Repeat("a", 10000) + "\r\n\r\n", 431},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			called := false
			s := serve(t, &Server{MaxHeaderBytes: 100, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { called = true })})
			if name != "head too large" {
				s.conn.s.MaxHeaderBytes = 64 << 10
			}
			resp, _ := s.response(t, tc.req)
			if resp.StatusCode != tc.want || !resp.Close {
				t.Fatalf("%s (close %v), want %d", resp.Status, resp.Close, tc.want)
			}
			s.waitEnd(t)
			if called {
				t.Fatal("the handler saw the request")
			}
		})
	}
}

// TestExpectContinue: the agent is asked for its body when the handler reads it, and not
// when the handler answers without it (the connection then ends: the body may still come).
func TestExpectContinue(t *testing.T) {
	s := serve(t, &Server{Linger: time.Hour})
	io.WriteString(s.agent, "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
	line, err := s.br.ReadString('\n')
	if err != nil || line != "HTTP/1.1 100 Continue\r\n" {
		t.Fatalf("%q, %v", line, err)
	}
	s.br.ReadString('\n')
	s.roundTrip(t, "ok", "POST /a ok")

	s = serve(t, &Server{Linger: time.Hour, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", http.StatusForbidden)
	})})
	resp, _ := s.response(t, "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
	if resp.StatusCode != http.StatusForbidden || !resp.Close {
		t.Fatalf("%s close %v", resp.Status, resp.Close)
	}
	s.waitEnd(t)
}

// TestUnreadBody: a body the handler leaves is drained to keep the connection, unless it is
// longer than maxDrain.
func TestUnreadBody(t *testing.T) {
	ignore := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	s := serve(t, &Server{Linger: time.Hour, Handler: ignore})
	s.roundTrip(t, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.1\r\nHost: a\r\n\r\n", "ok", "ok")

	// A body of maxDrain exactly is drained whole: the connection carries on.
	s = serve(t, &Server{Linger: time.Hour, Handler: ignore})
	go func() {
		fmt.Fprintf(s.agent, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", maxDrain)
		s.agent.Write(make([]byte, maxDrain))
		io.WriteString(s.agent, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	}()
	s.roundTrip(t, "", "ok", "ok")

	s = serve(t, &Server{Linger: time.Hour, Handler: ignore})
	big := maxDrain + 10
	go func() {
		fmt.Fprintf(s.agent, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", big)
		s.agent.Write(make([]byte, big))
	}()
	if _, body := s.response(t, ""); body != "ok" {
		t.Fatal(body)
	}
	// The connection ends, with the agent's bytes unread: a reset may reach the agent first.
	if rest, err := io.ReadAll(s.br); len(rest) > 0 || (err != nil && !errors.Is(err, syscall.ECONNRESET)) {
		t.Fatalf("after the response: %q, %v", rest, err)
	}
	<-s.ended
}

// TestHijack: the handler takes the connection, with bytes already read, and closing it ends
// the connection once.
func TestHijack(t *testing.T) {
	s := serve(t, &Server{Linger: time.Hour, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		go func() {
			defer conn.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\n\r\n")
			brw.Flush()
			io.Copy(brw, brw) // echo
			brw.Flush()
		}()
	})})
	io.WriteString(s.agent, "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\nearly")
	resp, err := http.ReadResponse(s.br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatal(resp, err)
	}
	s.agent.CloseWrite()
	rest, _ := io.ReadAll(s.br)
	if string(rest) != "early" {
		t.Fatalf("echoed %q", rest)
	}
	<-s.ended
}

// TestHandlerPanic: a panicking handler ends its connection, not the process.
func TestHandlerPanic(t *testing.T) {
	s := serve(t, &Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { panic("boom") })})
	io.WriteString(s.agent, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	<-s.ended
}

// BenchmarkRequest times one request and its response on a connection over loopback TCP (no
// TLS, no pipeline: a handler that answers at once), and reports the process's CPU time per
// request: what serving HTTP/1.1 on a tunnel costs.
func BenchmarkRequest(b *testing.B) {
	s := serve(b, &Server{Linger: 100 * time.Millisecond, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "2")
		io.WriteString(w, "ok")
	})})
	req := []byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	cpu := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	b.ReportAllocs()
	c0 := cpu()
	for b.Loop() {
		if _, err := s.agent.Write(req); err != nil {
			b.Fatal(err)
		}
		resp, err := http.ReadResponse(s.br, nil)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	b.ReportMetric(float64((cpu()-c0).Nanoseconds())/float64(b.N)/1000, "cpu-µs/op")
}

// TestFinishEarly: a handler that finishes its response has it reach the agent before it
// returns; writes after fail.
func TestFinishEarly(t *testing.T) {
	release, wrote := make(chan struct{}), make(chan error, 1)
	s := serve(t, &Server{Linger: time.Hour, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "early")
		w.(interface{ Finish() error }).Finish()
		<-release
		_, err := io.WriteString(w, "late")
		wrote <- err
	})})
	s.roundTrip(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n", "early")
	close(release)
	if err := <-wrote; err == nil {
		t.Fatal("a write after Finish succeeded")
	}
	s.roundTrip(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n", "early") // the connection carries on
}

// TestAbortedBodyNotWhole: a handler that aborts mid-body (http.ErrAbortHandler) leaves the
// agent with a body it cannot take for whole: the connection ends without the chunked end.
func TestAbortedBodyNotWhole(t *testing.T) {
	s := serve(t, &Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "part")
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	})})
	io.WriteString(s.agent, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	resp, err := http.ReadResponse(s.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("body %q, %v: want it cut short", body, err)
	}
	<-s.ended
}

// TestRequestContext: a connection's requests share a context while none is cancelled; what
// a request registered on it and stopped does not run when a later request's agent goes
// away; and the context is cancelled once the handler has returned when the connection is
// parked, ends, or was hijacked.
func TestRequestContext(t *testing.T) {
	isDone := func(ctx context.Context) bool {
		select {
		case <-ctx.Done():
			return true
		default:
			return false
		}
	}
	ctxs := make(chan context.Context, 1)
	record := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isDone(r.Context()) {
			t.Error("a handler got a cancelled context")
		}
		ctxs <- r.Context()
		io.WriteString(w, "ok")
	})

	// Shared, and what the first request registered and stopped stays stopped.
	fired := make(chan string, 4)
	gone := make(chan error, 1)
	var first context.Context
	s := serve(t, &Server{Linger: time.Hour, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if r.URL.Path == "/first" {
			first = ctx
			stop := context.AfterFunc(ctx, func() { fired <- "AfterFunc" })
			child, cancel := context.WithCancel(ctx)
			context.AfterFunc(child, func() { fired <- "a derived context's AfterFunc" })
			cancel()
			<-child.Done()
			stop()
			io.WriteString(w, "first")
			return
		}
		if ctx != first || isDone(ctx) {
			t.Errorf("the second request's context: %p, done %v; the first's %p", ctx, isDone(ctx), first)
		}
		io.WriteString(w, "second")
		w.(interface{ Finish() error }).Finish()
		select {
		case <-ctx.Done():
			gone <- ctx.Err()
		case <-time.After(10 * time.Second):
			gone <- errors.New("the request's context did not end when its agent went away")
		}
	})})
	s.roundTrip(t, "GET /first HTTP/1.1\r\nHost: a\r\n\r\n", "first")
	if got := <-fired; got != "a derived context's AfterFunc" {
		t.Fatalf("%s ran", got)
	}
	s.roundTrip(t, "GET /second HTTP/1.1\r\nHost: a\r\n\r\n", "second")
	s.agent.Close()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	<-s.ended
	select {
	case got := <-fired:
		t.Fatalf("the first request's stopped %s ran when the second's agent went away", got)
	default:
	}

	// Parked: cancelled as the park begins.
	s = serve(t, &Server{Linger: 0, Handler: record})
	s.roundTrip(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n", "ok")
	ctx := <-ctxs
	// Not <-s.parked: with Linger 0 the connection may also have parked before the request.
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the context outlived its connection's park")
	}
	s.roundTrip(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\n", "ok") // the next request has a live one
	if <-ctxs == ctx {
		t.Fatal("a request after a park got the cancelled context")
	}

	// The connection ends: cancelled before the end is reported.
	s = serve(t, &Server{Linger: time.Hour, Handler: record})
	s.roundTrip(t, "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", "ok")
	ctx = <-ctxs
	<-s.ended
	if !isDone(ctx) {
		t.Fatal("the context outlived its connection")
	}

	// Hijacked: cancelled when the handler returns.
	hijacked := make(chan context.Context, 1)
	s = serve(t, &Server{Linger: time.Hour, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		conn.Close()
		hijacked <- r.Context()
	})})
	io.WriteString(s.agent, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	ctx = <-hijacked
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a hijacked request's context was not cancelled after its handler returned")
	}
}

// TestStaleWriter: the connection's response is reset for each request; a handler's writer
// and body used after the handler returned fail, between requests and during the next one,
// and change nothing of the next response.
func TestStaleWriter(t *testing.T) {
	type leak struct {
		w    http.ResponseWriter
		body io.Reader
	}
	leaked, inSecond, staleDone := make(chan leak, 1), make(chan struct{}), make(chan struct{})
	s := serve(t, &Server{Linger: time.Hour, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/first" {
			w.Header().Set("X-First", "1")
			io.WriteString(w, "first") // the body is left unread, to be drained
			leaked <- leak{w, r.Body}
			return
		}
		close(inSecond)
		<-staleDone
		echo(w, r)
	})})
	s.roundTrip(t, "POST /first HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello", "first")
	stale := <-leaked
	use := func(when string) {
		t.Helper()
		if _, err := io.WriteString(stale.w, "stale"); err == nil {
			t.Errorf("%s: a stale Write succeeded", when)
		}
		stale.w.Header().Set("X-Stale", "1")
		stale.w.WriteHeader(http.StatusTeapot)
		rc := http.NewResponseController(stale.w)
		if err := rc.Flush(); err == nil {
			t.Errorf("%s: a stale Flush succeeded", when)
		}
		if _, _, err := rc.Hijack(); err == nil {
			t.Errorf("%s: a stale Hijack succeeded", when)
		}
		if err := stale.w.(interface{ Finish() error }).Finish(); err == nil {
			t.Errorf("%s: a stale Finish succeeded", when)
		}
		if n, err := stale.body.Read(make([]byte, 16)); n != 0 || err == nil {
			t.Errorf("%s: a stale body read %d bytes, %v", when, n, err)
		}
	}
	use("between requests")
	io.WriteString(s.agent, "POST /second HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nworld")
	<-inSecond
	use("during the next request")
	close(staleDone)
	resp, body := s.response(t, "")
	if resp.StatusCode != http.StatusOK || body != "POST /second world" || resp.Header.Get("X-Stale") != "" || resp.Header.Get("X-First") != "" {
		t.Fatalf("the next response: %d %q %v", resp.StatusCode, body, resp.Header)
	}
}

// TestIsTimeout: a deadline's error is a timeout, found without an allocation (it is checked
// after each watch and each linger).
func TestIsTimeout(t *testing.T) {
	deadline := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	if !isTimeout(deadline) || !isTimeout(timeoutErr{}) || isTimeout(io.EOF) {
		t.Fatal("isTimeout misjudges")
	}
	if n := testing.AllocsPerRun(100, func() { isTimeout(deadline) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// TestBaseContext: what the server's BaseContext carries, every request's context carries.
func TestBaseContext(t *testing.T) {
	type key struct{}
	base := context.WithValue(context.Background(), key{}, "tunnel")
	s := serve(t, &Server{Linger: time.Hour, BaseContext: base, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, _ := r.Context().Value(key{}).(string)
		io.WriteString(w, v)
	})})
	s.roundTrip(t, "GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", "tunnel", "tunnel")
}
