//go:build linux

package transparent

import (
	"net"
	"net/netip"
	"testing"
)

// A connection that no rule redirected has no original destination other than the listener:
// the caller refuses it either way (the redirected case is tested in integration/).
func TestOriginalDstNotRedirected(t *testing.T) {
	for _, network := range []string{"tcp4", "tcp6"} {
		ln, err := net.Listen(network, map[string]string{"tcp4": "127.0.0.1:0", "tcp6": "[::1]:0"}[network])
		if err != nil {
			t.Skipf("%s: %v", network, err)
		}
		defer ln.Close()
		c, err := net.Dial(network, ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		dst, err := OriginalDst(s)
		if err == nil && dst != netip.MustParseAddrPort(ln.Addr().String()) {
			t.Errorf("%s: original destination %v of a connection to %v", network, dst, ln.Addr())
		}
	}
}
