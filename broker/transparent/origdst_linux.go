//go:build linux

package transparent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/ip6_tables.h), the IPv6
// form of SO_ORIGINAL_DST: the same number, at level SOL_IPV6.
const ip6tSOOriginalDst = 80

// OriginalDst returns the destination a connection redirected by netfilter (nat REDIRECT or
// DNAT) was sent to before the redirect, from the connection tracking entry of the accepted
// socket c. A connection that was not redirected has no such entry (an error) or names the
// listener itself.
func OriginalDst(c net.Conn) (netip.AddrPort, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return netip.AddrPort{}, errors.New("original destination: not a socket")
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	local, _ := netip.ParseAddrPort(c.LocalAddr().String())
	var dst netip.AddrPort
	var opErr error
	cerr := raw.Control(func(fd uintptr) {
		if local.Addr().Unmap().Is4() {
			// An IPv4 connection, also when it was accepted on a dual-stack IPv6 socket
			// (an IPv4-mapped address): its tracking entry is IPv4.
			// struct sockaddr_in is 16 bytes; IPv6Mreq (20) holds it.
			m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
			if err != nil {
				opErr = err
				return
			}
			b := m.Multiaddr[:]
			port := binary.BigEndian.Uint16(b[2:4])
			dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), port)
			return
		}
		// struct sockaddr_in6 is 28 bytes; IPv6MTUInfo (32) holds it.
		m, err := unix.GetsockoptIPv6MTUInfo(int(fd), unix.SOL_IPV6, ip6tSOOriginalDst)
		if err != nil {
			opErr = err
			return
		}
		var pb [2]byte
		binary.NativeEndian.PutUint16(pb[:], m.Addr.Port) // network byte order in memory
		dst = netip.AddrPortFrom(netip.AddrFrom16(m.Addr.Addr), binary.BigEndian.Uint16(pb[:]))
	})
	if cerr != nil {
		return netip.AddrPort{}, cerr
	}
	if opErr != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", opErr)
	}
	return netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port()), nil
}
