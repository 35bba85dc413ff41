//go:build !linux

package transparent

import (
	"errors"
	"net"
	"net/netip"
)

// OriginalDst is available on Linux only (netfilter's SO_ORIGINAL_DST).
func OriginalDst(net.Conn) (netip.AddrPort, error) {
	return netip.AddrPort{}, errors.New("original destination: transparent mode needs Linux (netfilter)")
}
