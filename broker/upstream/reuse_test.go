package upstream

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The idle lists of put and take, with a pool's only connection kept in an array of its own
// (see conn.alone): whatever the order of puts, takes and removes, a list holds exactly the
// connections put and not yet taken, the most recently put last.
func TestClientIdleListOwnArray(t *testing.T) {
	c := newClient(t, nil)
	key := connKey{pool: testPool, origin: origin{addr: "127.0.0.1:1"}}
	conns := make([]*conn, 3)
	for i := range conns {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		conns[i] = &conn{c: c, key: key, Conn: a}
	}
	a, b, d := conns[0], conns[1], conns[2]
	want := func(step string, order ...*conn) {
		t.Helper()
		c.mu.Lock()
		got := append([]*conn(nil), c.idle[key]...)
		n := c.nidle
		_, entry := c.idle[key]
		c.mu.Unlock()
		if len(got) != len(order) || n != len(order) || entry != (len(order) > 0) {
			t.Fatalf("%s: pool holds %d (nidle %d, entry %v), want %d", step, len(got), n, entry, len(order))
		}
		for i := range order {
			if got[i] != order[i] {
				t.Fatalf("%s: connection %d is not the one put", step, i)
			}
		}
	}
	c.put(a)
	want("put a", a)
	c.put(b) // outgrows a's array
	want("put b", a, b)
	if c.take(key) != b {
		t.Fatal("take did not return the most recent connection")
	}
	want("take b", a)
	c.put(d)
	want("put d", a, d)
	if !c.remove(a) {
		t.Fatal("remove did not find a")
	}
	want("remove a", d)
	if c.take(key) != d {
		t.Fatal("take did not return d")
	}
	want("take d")
	c.put(b) // in its own array
	want("put b again", b)
	if !c.remove(b) {
		t.Fatal("remove did not find b")
	}
	want("remove b")
	c.put(a)
	c.put(b)
	c.put(d)
	want("put a, b, d", a, b, d)
	for _, pc := range []*conn{d, b, a} {
		if c.take(key) != pc {
			t.Fatal("take out of order")
		}
	}
	want("all taken")
	for _, pc := range conns {
		pc.timer.Stop()
	}
}

// peekSocket reports a quiet socket as EAGAIN, a waiting byte as 1 without taking it, and the
// peer's close as 0.
func TestPeekSocket(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	fd := uintptr(fds[0])
	if n, err := peekSocket(fd); n != 0 || !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("quiet socket: n=%d err=%v, want EAGAIN", n, err)
	}
	if _, err := unix.Write(fds[1], []byte("xy")); err != nil {
		t.Fatal(err)
	}
	for range 2 { // a peek takes nothing
		if n, err := peekSocket(fd); n != 1 || err != nil {
			t.Fatalf("byte waiting: n=%d err=%v, want 1", n, err)
		}
	}
	buf := make([]byte, 4)
	if n, _ := unix.Read(fds[0], buf); string(buf[:n]) != "xy" {
		t.Fatalf("read %q after the peeks, want \"xy\"", buf[:n])
	}
	unix.Close(fds[1])
	if n, err := peekSocket(fd); n != 0 || err != nil {
		t.Fatalf("closed peer: n=%d err=%v, want 0 and no error", n, err)
	}
}

// A response followed by bytes that answer no request in the same TLS record, behind a body
// long enough that its last bytes are read straight into the caller's buffer (past the
// bufio.Reader, which is empty then): the bytes after it stay in the tls.Conn's plaintext,
// which neither the bufio.Reader nor a peek at the socket sees. The connection must not be
// reused, and the probe (see unread) must leave a connection it finds quiet usable: a
// connection without such bytes is.
func TestClientStaleBytesInTLSRecord(t *testing.T) {
	hs := httptest.NewUnstartedServer(http.NotFoundHandler()) // for its certificate
	hs.StartTLS()
	hs.Close()
	body := strings.Repeat("b", 10000) // < one record, > two bufio.Readers' worth
	var conns atomic.Int32
	srv := newRawServer(t, false, func(conn net.Conn) {
		conns.Add(1)
		tc := tls.Server(conn, &tls.Config{
			Certificates:                hs.TLS.Certificates,
			NextProtos:                  []string{"http/1.1"},
			DynamicRecordSizingDisabled: true, // one write, one record
		})
		br := bufio.NewReader(tc)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			resp := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			if req.URL.Path == "/extra" {
				resp += "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale"
			}
			if _, err := io.WriteString(tc, resp); err != nil {
				return
			}
		}
	})
	c := newClient(t, hs.Certificate())
	url := strings.Replace(srv.URL, "http://", "https://", 1)
	get := func(path string) {
		t.Helper()
		resp, err := c.RoundTrip(request(t, http.MethodGet, url+path, nil), testPool)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		n, err := io.Copy(io.Discard, resp.Body) // 8 KiB reads: past the bufio.Reader
		if err != nil || n != int64(len(body)) {
			t.Fatalf("GET %s read %d bytes, %v; want %d", path, n, err, len(body))
		}
	}
	get("/")
	get("/quiet") // the probed connection is reused
	if n := conns.Load(); n != 1 {
		t.Fatalf("server accepted %d connections, want 1: a quiet connection was not reused", n)
	}
	get("/extra")
	get("/after")
	if n := conns.Load(); n != 2 {
		t.Fatalf("server accepted %d connections, want 2: the stale bytes' connection was reused", n)
	}
}

// The header timeout bounds the wait for a response's head only: a body that comes after the
// deadline has passed is read, and a connection whose last deadline passed while it waited in
// the pool (over TLS it is taken off only when the socket is next read: see probeConn.clear)
// carries the next exchange.
func TestClientHeaderDeadlineNotOnBody(t *testing.T) {
	for _, useTLS := range []bool{true, false} {
		t.Run(fmt.Sprintf("tls=%v", useTLS), func(t *testing.T) {
			sendBody := make(chan struct{})
			srv := newRawServer(t, useTLS, func(conn net.Conn) {
				br := bufio.NewReader(conn)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					if req.URL.Path == "/late" {
						io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n")
						<-sendBody
						io.WriteString(conn, "late")
						continue
					}
					io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			})
			c := newClient(t, srv.cert)
			c.headerTimeout = 50 * time.Millisecond
			// pastDeadline waits until a deadline set at start has passed.
			pastDeadline := func(start time.Time) {
				time.Sleep(time.Until(start.Add(2 * c.headerTimeout)))
			}

			start := time.Now()
			resp, err := c.RoundTrip(request(t, http.MethodGet, srv.URL+"/late", nil), testPool)
			if err != nil {
				t.Fatal(err)
			}
			pastDeadline(start)
			close(sendBody)
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || string(b) != "late" {
				t.Fatalf("the late body read %q, %v; want \"late\"", b, err)
			}

			start = time.Now()
			mustGet(t, c, srv.URL+"/", "ok") // the body comes with the head
			pastDeadline(start)              // while the connection waits in the pool
			mustGet(t, c, srv.URL+"/", "ok")
			if n := srv.accepted.Load(); n != 1 {
				t.Fatalf("server accepted %d connections, want 1", n)
			}
		})
	}
}
