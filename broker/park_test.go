package broker

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
	"testing"
	"time"
)

// parkingTunnel serves one loopback connection with a parkingConn, as intercept does after the
// agent's TLS handshake (TLS itself plays no part in parking). It returns the agent's end of
// the connection, a reader for its responses, the parkingConn, a channel closed when the
// tunnel has ended (end being called more than once fails the test), and one that receives
// each time the tunnel parks.
func parkingTunnel(t *testing.T, linger time.Duration, srv *http.Server) (net.Conn, *bufio.Reader, *parkingConn, <-chan struct{}, <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	agent, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agent.Close() })
	conn := <-accepted
	if conn == nil {
		t.Fatal("accept failed")
	}
	if srv.Handler == nil {
		srv.Handler = http.HandlerFunc(echoRequest)
	}
	srv.ErrorLog, srv.TLSNextProto = discardLog, noNextProto
	var ends atomic.Int32
	ended := make(chan struct{})
	pc := newParkingConn(conn, srv, linger, func() {
		if ends.Add(1) == 1 {
			close(ended)
		} else {
			t.Error("the tunnel's end was called twice")
		}
	})
	parked := make(chan struct{}, 16)
	pc.onPark = func() { parked <- struct{}{} }
	pc.serve()
	return agent, bufio.NewReader(agent), pc, ended, parked
}

// echoRequest answers with the request's method, path and body.
func echoRequest(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.Path, body)
}

// roundTrip writes raw and reads one response per want, checking each body.
func roundTrip(t *testing.T, agent net.Conn, br *bufio.Reader, raw string, want ...string) {
	t.Helper()
	if _, err := io.WriteString(agent, raw); err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		resp, err := http.ReadResponse(br, nil)
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

func parks(pc *parkingConn) int {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.parks
}

// waitEnd reads from the agent's side until the broker closes the connection, then waits for
// the tunnel's end.
func waitEnd(t *testing.T, br *bufio.Reader, ended <-chan struct{}) {
	t.Helper()
	if rest, err := io.ReadAll(br); err != nil || len(rest) > 0 {
		t.Fatalf("after the last response: %q, %v", rest, err)
	}
	<-ended
}

// TestParkingKeepsEveryByte: a tunnel parked after each response (linger 0) still answers
// every request right, however its bytes arrive: whole, with a body by length or chunked,
// pipelined in one write, or one byte at a time. Each request is sent once the tunnel has
// parked, so that it is the parked tunnel that reads it.
func TestParkingKeepsEveryByte(t *testing.T) {
	agent, br, _, ended, parked := parkingTunnel(t, 0, &http.Server{})
	roundTrip(t, agent, br, "GET /1 HTTP/1.1\r\nHost: a\r\n\r\n", "GET /1 ")
	waitPark(t, parked)
	roundTrip(t, agent, br, "POST /2 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello", "POST /2 hello")
	waitPark(t, parked)
	roundTrip(t, agent, br, "POST /3 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nT: v\r\n\r\n", "POST /3 abc")
	waitPark(t, parked)
	roundTrip(t, agent, br, "GET /4 HTTP/1.1\r\nHost: a\r\n\r\n"+
		"POST /5 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nxy"+
		"GET /6 HTTP/1.1\r\nHost: a\r\n\r\n", "GET /4 ", "POST /5 xy", "GET /6 ")
	waitPark(t, parked)
	// The start of the next request comes with one: net/http holds those bytes when it
	// goes idle, so the tunnel must not park then.
	roundTrip(t, agent, br, "GET /6b HTTP/1.1\r\nHost: a\r\n\r\nGE", "GET /6b ")
	roundTrip(t, agent, br, "T /6c HTTP/1.1\r\nHost: a\r\n\r\n", "GET /6c ")
	waitPark(t, parked)
	for _, b := range []byte("POST /7 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nxyz") {
		if _, err := agent.Write([]byte{b}); err != nil {
			t.Fatal(err)
		}
	}
	roundTrip(t, agent, br, "", "POST /7 xyz")
	agent.(*net.TCPConn).CloseWrite()
	waitEnd(t, br, ended)
}

// TestParkingWaitsForEveryResponse: a read is refused only when net/http has answered every
// request the guard has seen whole. (net/http does not read while it holds a whole request,
// so this is checked on the parkingConn itself.)
func TestParkingWaitsForEveryResponse(t *testing.T) {
	agent, server := net.Pipe()
	defer agent.Close()
	pc := newParkingConn(server, &http.Server{}, 0, func() {})
	go io.WriteString(agent, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	buf := make([]byte, 64)
	for n := 0; n < len("GET / HTTP/1.1\r\nHost: a\r\n\r\n"); {
		k, err := pc.Conn.Read(buf) // through the guard, as net/http would
		if err != nil {
			t.Fatal(err)
		}
		n += k
	}
	pc.idle = true // net/http is idle, but has answered none of the one request read
	_ = pc.Conn.SetReadDeadline(time.Now())
	if _, err := pc.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read with a request unanswered: %v, want the read itself (timing out)", err)
	}
	pc.answered = 1
	if _, err := pc.Read(buf); err != errParked {
		t.Fatalf("read with every request answered: %v, want errParked", err)
	}
}

func waitPark(t *testing.T, parked <-chan struct{}) {
	t.Helper()
	select {
	case <-parked:
	case <-time.After(10 * time.Second):
		t.Fatal("the tunnel was not parked")
	}
}

// TestParkingLingers: requests that follow closely keep the tunnel with net/http; one that
// comes after the linger finds it parked, and is answered.
func TestParkingLingers(t *testing.T) {
	agent, br, pc, _, _ := parkingTunnel(t, time.Hour, &http.Server{})
	for i := range 3 {
		roundTrip(t, agent, br, fmt.Sprintf("GET /%d HTTP/1.1\r\nHost: a\r\n\r\n", i), fmt.Sprintf("GET /%d ", i))
	}
	if n := parks(pc); n != 0 {
		t.Errorf("parked %d times within the linger, want 0", n)
	}

	agent, br, _, _, parked := parkingTunnel(t, time.Millisecond, &http.Server{})
	roundTrip(t, agent, br, "GET /a HTTP/1.1\r\nHost: a\r\n\r\n", "GET /a ")
	waitPark(t, parked)
	roundTrip(t, agent, br, "GET /b HTTP/1.1\r\nHost: a\r\n\r\n", "GET /b ")
}

// TestParkedTunnelIdleTimeout: the server's idle timeout ends a tunnel whether it is parked
// or lingering.
func TestParkedTunnelIdleTimeout(t *testing.T) {
	for _, linger := range []time.Duration{0, time.Hour} {
		agent, br, _, ended, _ := parkingTunnel(t, linger, &http.Server{IdleTimeout: 50 * time.Millisecond})
		roundTrip(t, agent, br, "GET /1 HTTP/1.1\r\nHost: a\r\n\r\n", "GET /1 ")
		waitEnd(t, br, ended)
	}
}

// TestParkedTunnelShutdown: a drain ends a parked tunnel at once, and lets a request in
// flight finish first.
func TestParkedTunnelShutdown(t *testing.T) {
	agent, br, pc, ended, parked := parkingTunnel(t, 0, &http.Server{})
	roundTrip(t, agent, br, "GET /1 HTTP/1.1\r\nHost: a\r\n\r\n", "GET /1 ")
	waitPark(t, parked)
	if err := pc.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitEnd(t, br, ended)

	started, release := make(chan struct{}), make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		echoRequest(w, r)
	})}
	agent, br, pc, ended, _ = parkingTunnel(t, 0, srv)
	if _, err := io.WriteString(agent, "GET /slow HTTP/1.1\r\nHost: a\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	<-started
	shut := make(chan error, 1)
	go func() { shut <- pc.Shutdown(context.Background()) }()
	close(release)
	roundTrip(t, agent, br, "", "GET /slow ")
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
	waitEnd(t, br, ended)
}

// TestParkedTunnelFramingGuard: the first request after a park is checked like any other.
func TestParkedTunnelFramingGuard(t *testing.T) {
	agent, br, _, ended, parked := parkingTunnel(t, 0, &http.Server{})
	roundTrip(t, agent, br, "GET /1 HTTP/1.1\r\nHost: a\r\n\r\n", "GET /1 ")
	waitPark(t, parked)
	if _, err := io.WriteString(agent, "GET /2 HTTP/1.1\nHost: a\n\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "framing") {
		t.Fatalf("bare LF after a park: %s %q, want the framing guard's 400", resp.Status, body)
	}
	waitEnd(t, br, ended)
}

// TestBackgroundReadDeferred: net/http's background read, started with every request, ends
// without reading the connection when the response is done within bgReadDelay; a request
// that takes longer still learns that its agent went away (its context ends), and a request
// pipelined behind a slow one is still answered.
func TestBackgroundReadDeferred(t *testing.T) {
	agent, br, pc, _, _ := parkingTunnel(t, time.Hour, &http.Server{})
	const n = 10
	for i := range n {
		roundTrip(t, agent, br, fmt.Sprintf("GET /%d HTTP/1.1\r\nHost: a\r\n\r\n", i), fmt.Sprintf("GET /%d ", i))
	}
	pc.mu.Lock()
	deferred := pc.bgDeferred
	pc.mu.Unlock()
	if deferred < n/2 { // not all: a busy machine can hold a response past bgReadDelay
		t.Errorf("%d of %d background reads ended without reading the connection", deferred, n)
	}

	gone := make(chan error, 1)
	arrived := make(chan struct{})
	slow := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/slow" {
			echoRequest(w, r)
			return
		}
		close(arrived)
		select {
		case <-r.Context().Done():
			gone <- r.Context().Err()
		case <-time.After(10 * time.Second):
			gone <- errors.New("the request's context did not end when its agent went away")
		}
	})}
	agent, _, _, _, _ = parkingTunnel(t, time.Hour, slow)
	io.WriteString(agent, "GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
	<-arrived
	agent.Close()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}

	release := make(chan struct{})
	pipelined := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/first" {
			<-release
		}
		echoRequest(w, r)
	})}
	agent, br, _, _, _ = parkingTunnel(t, time.Hour, pipelined)
	io.WriteString(agent, "GET /first HTTP/1.1\r\nHost: a\r\n\r\nGET /second HTTP/1.1\r\nHost: a\r\n\r\n")
	time.AfterFunc(3*bgReadDelay, func() { close(release) }) // past the deferred read's wait
	roundTrip(t, agent, br, "", "GET /first ", "GET /second ")
}
