package upstream

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"net/url"
	"testing"
)

// A destination no_proxy names is dialled direct, still checked; any other goes to the
// proxies, and with all of them down fails without going direct.
func TestDialerNoProxyAndUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	deadURL, _ := url.Parse("http://" + dead.Addr().String())
	dead.Close()
	newDialer := func(noProxy ...string) *Dialer {
		d := NewDialer([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, 0)
		if err := d.ConfigureProxies(ProxyOptions{Proxies: []ProxyServer{{Name: "corp", URL: deadURL}}, NoProxy: noProxy}); err != nil {
			t.Fatal(err)
		}
		return d
	}
	r := &Route{}
	c, err := newDialer("127.0.0.0/8").DialContext(WithRoute(context.Background(), r), "tcp", l.Addr().String())
	if err != nil {
		t.Fatalf("no_proxy destination: %v", err)
	}
	c.Close()
	if r.Via() != Direct {
		t.Fatalf("via = %q, want direct", r.Via())
	}
	_, err = newDialer().DialContext(context.Background(), "tcp", l.Addr().String())
	if !errors.Is(err, ErrProxyUnreachable) {
		t.Fatalf("every proxy down: %v, want ErrProxyUnreachable", err)
	}
	// A destination the check refuses is refused before any proxy is asked.
	_, err = newDialer().DialContext(context.Background(), "tcp", "10.1.2.3:443")
	if !errors.Is(err, ErrForbiddenDestination) {
		t.Fatalf("private destination: %v, want ErrForbiddenDestination", err)
	}
	_, err = newDialer().DialContext(WithRoute(context.Background(), &Route{Name: "nope"}), "tcp", l.Addr().String())
	if !errors.Is(err, ErrUnknownProxy) {
		t.Fatalf("unknown route: %v", err)
	}
}
