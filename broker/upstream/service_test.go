package upstream

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"
)

// connectProxy is a minimal CONNECT proxy that records the targets it was asked for.
type connectProxy struct {
	ln      net.Listener
	mu      sync.Mutex
	targets []string
	closed  chan struct{} // one value each time the proxy has closed a tunnel's client side
}

func newConnectProxy(t *testing.T) *connectProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &connectProxy{ln: ln, closed: make(chan struct{}, 16)}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *connectProxy) serve(c net.Conn) {
	defer func() {
		c.Close()
		select {
		case p.closed <- struct{}{}:
		default:
		}
	}()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil || req.Method != http.MethodConnect {
		return
	}
	p.mu.Lock()
	p.targets = append(p.targets, req.Host)
	p.mu.Unlock()
	up, err := net.Dial("tcp", req.Host)
	if err != nil {
		io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
		return
	}
	defer up.Close()
	io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
	go io.Copy(up, br)
	io.Copy(c, up)
}

func (p *connectProxy) asked() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.targets...)
}

// echoOnce answers one line on each connection with "ok\n".
func echoListener(t *testing.T) net.Listener {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "ok\n")
			c.Close()
		}
	}()
	return l
}

func readOK(t *testing.T, c net.Conn) {
	t.Helper()
	defer c.Close()
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "ok\n" {
		t.Fatalf("read %q, %v", line, err)
	}
}

// DialService reaches the broker's own (private, loopback) services the destination check
// refuses to agents; through upstream.proxy unless no_proxy names them, whatever the
// request's route says, without touching the request's via.
func TestDialServiceFollowsProxyConfigOnly(t *testing.T) {
	svc := echoListener(t)
	ctx := context.Background()

	plain := NewDialer(nil, 0)
	if _, err := plain.DialContext(ctx, "tcp", svc.Addr().String()); !errors.Is(err, ErrForbiddenDestination) {
		t.Fatalf("agent-facing dial to loopback: %v, want ErrForbiddenDestination", err)
	}
	c, err := plain.DialService(ctx, "tcp", svc.Addr().String())
	if err != nil {
		t.Fatalf("service dial without proxies: %v", err)
	}
	readOK(t, c)

	proxy := newConnectProxy(t)
	u, _ := url.Parse("http://" + proxy.ln.Addr().String())
	var seen []string // what Observe was told, "via failed"
	observe := func(via string, failed bool) { seen = append(seen, fmt.Sprint(via, " ", failed)) }
	newDialer := func(noProxy ...string) *Dialer {
		d := NewDialer(nil, 0)
		if err := d.ConfigureProxies(ProxyOptions{Proxies: []ProxyServer{{Name: "corp", URL: u}}, NoProxy: noProxy, Observe: observe}); err != nil {
			t.Fatal(err)
		}
		return d
	}
	route := &Route{Name: Direct} // a policy's route is not the service's
	c, err = newDialer().DialService(WithRoute(ctx, route), "tcp", svc.Addr().String())
	if err != nil {
		t.Fatalf("service dial through the proxy: %v", err)
	}
	readOK(t, c)
	if got := proxy.asked(); len(got) != 1 || got[0] != svc.Addr().String() {
		t.Fatalf("proxy was asked for %v, want [%s]", got, svc.Addr())
	}
	if route.Via() != "" {
		t.Fatalf("the request's via was set to %q by a service dial", route.Via())
	}
	if Via(c) != "corp" {
		t.Fatalf("Via = %q, want corp", Via(c))
	}

	c, err = newDialer("127.0.0.0/8").DialService(ctx, "tcp", svc.Addr().String())
	if err != nil {
		t.Fatalf("service dial in no_proxy: %v", err)
	}
	readOK(t, c)
	if got := proxy.asked(); len(got) != 1 {
		t.Fatalf("no_proxy service went through the proxy: %v", got)
	}
	if Via(c) != Direct {
		t.Fatalf("Via = %q, want direct", Via(c))
	}
	// Each connection is observed, through the proxy or direct; a proxy that cannot be
	// connected to is a failure.
	dead := NewDialer(nil, 0)
	du, _ := url.Parse("http://127.0.0.1:1")
	if err := dead.ConfigureProxies(ProxyOptions{Proxies: []ProxyServer{{Name: "down", URL: du}}, Observe: observe}); err != nil {
		t.Fatal(err)
	}
	if _, err := dead.DialService(ctx, "tcp", svc.Addr().String()); !errors.Is(err, ErrProxyUnreachable) {
		t.Fatalf("through a dead proxy: %v", err)
	}
	if want := []string{"corp false", "direct false", "down true"}; fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("observed %q, want %q", seen, want)
	}

	if _, err := newDialer().DialService(ctx, "udp", svc.Addr().String()); err == nil {
		t.Fatal("udp service dial accepted")
	}
}
