package integration

import (
	"bufio"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestFrontConnect drives the explicit proxy's front, which reads each connection's first
// request: a CONNECT is served there, anything else by net/http's server as before. A
// hostile agent's odd CONNECTs must be answered exactly as net/http's server answers them,
// and ordinary ones (sent byte by byte, with the TLS ClientHello in the same write, after a
// plain request, held for a person's approval) must work as they did.
func TestFrontConnect(t *testing.T) {
	e, a := askEnv(t, "")
	hostport := e.up.Listener.Addr().String()
	auth := "Proxy-Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(agentID+":"+e.token)) + "\r\n"
	connect := func(target, extra string) string {
		return fmt.Sprintf("CONNECT %s HTTP/1.1\r\nHost: %s\r\n%s%s\r\n", target, target, auth, extra)
	}
	dial := func(t *testing.T) net.Conn {
		c, err := net.Dial("tcp", e.broker.proxyAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(waitTimeout))
		return c
	}
	// get sends a GET through the tunnel on c (TLS, with the broker's CA) and returns the body.
	get := func(t *testing.T, c net.Conn, path string) string {
		tc := tls.Client(c, &tls.Config{RootCAs: e.broker.caPool(t), ServerName: "127.0.0.1", NextProtos: []string{"http/1.1"}})
		fmt.Fprintf(tc, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, hostport)
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s in the tunnel: %s %s", path, resp.Status, b)
		}
		return string(b)
	}

	// What net/http's server answers itself, before any handler: the same bytes as before.
	for name, tc := range map[string]struct{ raw, status string }{
		"malformed Host field": {strings.Replace(connect(hostport, ""), "Host: "+hostport, "Host: a b", 1), "HTTP/1.1 400 Bad Request: malformed Host header"},
		"Expect":               {connect(hostport, "Expect: nothing\r\n"), "HTTP/1.1 417 Expectation Failed"},
		"HTTP/2.0":             {strings.Replace(connect(hostport, ""), "HTTP/1.1", "HTTP/2.0", 1), "HTTP/1.1 505 HTTP Version Not Supported: unsupported protocol version"},
		"head too large":       {connect(hostport, "X-A: "+strings.Repeat("a", 70<<10)+"\r\n"), "HTTP/1.1 400 Bad Request"}, // the framing guard's
		"bad request line":     {"CONNECT " + hostport + "\r\n\r\n", "HTTP/1.1 400 Bad Request"},
	} {
		t.Run(name, func(t *testing.T) {
			c := dial(t)
			if _, err := io.WriteString(c, tc.raw); err != nil {
				t.Fatal(err)
			}
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil || strings.TrimRight(line, "\r\n") != tc.status {
				t.Fatalf("answer %q (%v), want %q", line, err, tc.status)
			}
		})
	}

	// Heads in the one shape the front's own parser takes, or a byte away from it, that a
	// hostile agent sends to be let through on less than a well-formed CONNECT from a known
	// agent to an allowed place: none is answered 200.
	other := "Proxy-Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("intruder:guess")) + "\r\n"
	_, port, _ := net.SplitHostPort(hostport)
	for name, raw := range map[string]string{
		"a second agent's credentials before the first": fmt.Sprintf("CONNECT %s HTTP/1.1\r\nHost: %s\r\n%s%s\r\n", hostport, hostport, other, auth),
		"the agent's own credentials, then another's":   fmt.Sprintf("CONNECT %s HTTP/1.1\r\nHost: %s\r\n%s%s\r\n", hostport, hostport, auth, other),
		"credentials folded onto the Host line":         fmt.Sprintf("CONNECT %s HTTP/1.1\r\nHost: %s\r\n %s\r\n", hostport, hostport, auth),
		"a loopback address left out of allow_private":  connect("127.0.0.2:"+port, ""),
		"lower-case method":                             strings.Replace(connect(hostport, ""), "CONNECT", "connect", 1),
		"a bare LF ending the request line":             strings.Replace(connect(hostport, ""), "HTTP/1.1\r\n", "HTTP/1.1\n", 1),
	} {
		t.Run("hostile: "+name, func(t *testing.T) {
			c := dial(t)
			if _, err := io.WriteString(c, raw); err != nil {
				t.Fatal(err)
			}
			line, err := bufio.NewReader(c).ReadString('\n')
			if err == nil && strings.HasPrefix(line, "HTTP/1.1 2") {
				t.Fatalf("answered %q", line)
			}
		})
	}

	// The agent is identified by one Proxy-Authorization: two, even the agent's own twice, are
	// ambiguous (a proxy before the broker may have read the other) and refused before either
	// is tried, on a CONNECT as on a plain request.
	for name, raw := range map[string]string{
		"CONNECT, own credentials twice": connect(hostport, auth),
		"CONNECT, own then another's":    connect(hostport, other),
		"plain GET, own then another's":  fmt.Sprintf("GET http://%s/open/plain HTTP/1.1\r\nHost: %s\r\n%s%s\r\n", hostport, hostport, auth, other),
	} {
		t.Run("two Proxy-Authorization: "+name, func(t *testing.T) {
			c := dial(t)
			if _, err := io.WriteString(c, raw); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: strings.Fields(raw)[0]})
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), `"ambiguous_request"`) {
				t.Fatalf("answered %s %s, want 400 ambiguous_request", resp.Status, body)
			}
			if strings.Contains(string(body), e.token) {
				t.Fatalf("the answer holds the agent's token: %s", body)
			}
		})
	}

	t.Run("byte by byte", func(t *testing.T) {
		c := dial(t)
		for _, b := range []byte(connect(hostport, "")) {
			if _, err := c.Write([]byte{b}); err != nil {
				t.Fatal(err)
			}
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("CONNECT: %v %v", resp, err)
		}
		if body := get(t, c, "/open/slow"); !strings.Contains(body, "path=/open/slow") {
			t.Fatalf("body %q", body)
		}
	})

	t.Run("ClientHello in the CONNECT's write", func(t *testing.T) {
		c := &eagerConn{Conn: dial(t), head: connect(hostport, "")}
		if body := get(t, c, "/open/eager"); !strings.Contains(body, "path=/open/eager") {
			t.Fatalf("body %q", body)
		}
	})

	t.Run("CONNECT after a plain request", func(t *testing.T) {
		c := dial(t)
		br := bufio.NewReader(c)
		// To a port where nothing listens: a 502, after which the connection is kept (a
		// refusal closes it).
		fmt.Fprintf(c, "GET http://127.0.0.1:1/open/plain HTTP/1.1\r\nHost: 127.0.0.1:1\r\n%s\r\n", auth)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway || resp.Close {
			t.Fatalf("plain request: %s, close %v", resp.Status, resp.Close)
		}
		io.WriteString(c, connect(hostport, ""))
		if resp, err = http.ReadResponse(br, &http.Request{Method: http.MethodConnect}); err != nil || resp.StatusCode != 200 {
			t.Fatalf("CONNECT on a kept-alive connection: %v %v", resp, err)
		}
		if body := get(t, c, "/open/after"); !strings.Contains(body, "path=/open/after") {
			t.Fatalf("body %q", body)
		}
	})

	t.Run("no credentials", func(t *testing.T) {
		c := dial(t)
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", hostport, hostport)
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
		if err != nil || resp.StatusCode != 407 || resp.Header.Get("Proxy-Authenticate") == "" {
			t.Fatalf("CONNECT without credentials: %v %v", resp, err)
		}
	})

	// An agent that leaves while its CONNECT is held for a person's approval withdraws it (the
	// event stream reports to this test, not a subtest).
	ev := a.events()
	c := dial(t)
	io.WriteString(c, connect(strings.Replace(hostport, "127.0.0.1", "localhost", 1), ""))
	id := ev.approval("pending")
	c.Close()
	if got := ev.approval("withdrawn"); got != id {
		t.Fatalf("withdrawn %s, want %s", got, id)
	}
}

// eagerConn sends head (a CONNECT) with the first write on it (the TLS ClientHello), in one
// write, and reads the CONNECT's answer before the first read.
type eagerConn struct {
	net.Conn
	head string
	br   *bufio.Reader
}

func (c *eagerConn) Write(p []byte) (int, error) {
	if c.head != "" {
		all := append([]byte(c.head), p...)
		c.head = ""
		if _, err := c.Conn.Write(all); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *eagerConn) Read(p []byte) (int, error) {
	if c.br == nil {
		c.br = bufio.NewReader(c.Conn)
		resp, err := http.ReadResponse(c.br, &http.Request{Method: http.MethodConnect})
		if err != nil {
			return 0, err
		}
		if resp.StatusCode != 200 {
			return 0, fmt.Errorf("CONNECT: %s", resp.Status)
		}
	}
	return c.br.Read(p)
}
