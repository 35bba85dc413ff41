package nflog

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// Packet is one refused packet, as the log group reported it.
type Packet struct {
	Proto  string // "udp", "tcp", "icmp", "icmpv6", or "ip-proto-N"
	Source netip.AddrPort
	Dest   netip.AddrPort // the port is 0 for protocols without ports
	Prefix string         // the log rule's prefix, if it has one
}

// IP protocol numbers.
const (
	ipprotoICMP    = 1
	ipprotoTCP     = 6
	ipprotoUDP     = 17
	ipprotoICMPv6  = 58
	ipprotoSCTP    = 132
	ipprotoUDPLite = 136
)

// ParseIP reads the addresses, protocol and ports of an IPv4 or IPv6 packet's headers.
func ParseIP(b []byte) (Packet, bool) {
	var p Packet
	if len(b) < 1 {
		return p, false
	}
	var proto byte
	var src, dst netip.Addr
	var l4 []byte
	switch b[0] >> 4 {
	case 4:
		if len(b) < 20 {
			return p, false
		}
		ihl := int(b[0]&0x0f) * 4
		if ihl < 20 {
			return p, false
		}
		proto = b[9]
		src = netip.AddrFrom4([4]byte(b[12:16]))
		dst = netip.AddrFrom4([4]byte(b[16:20]))
		// A fragment after the first has no transport header.
		if binary.BigEndian.Uint16(b[6:])&0x1fff == 0 && len(b) > ihl {
			l4 = b[ihl:]
		}
	case 6:
		if len(b) < 40 {
			return p, false
		}
		proto = b[6]
		src = netip.AddrFrom16([16]byte(b[8:24]))
		dst = netip.AddrFrom16([16]byte(b[24:40]))
		l4 = b[40:]
		// Extension headers the sandbox's traffic may carry before the transport header.
		for proto == 0 || proto == 43 || proto == 60 {
			if len(l4) < 8 {
				l4 = nil
				break
			}
			proto, l4 = l4[0], l4[min((int(l4[1])+1)*8, len(l4)):]
		}
		if proto == 44 { // a fragment header
			if len(l4) < 8 {
				l4 = nil
			} else {
				off := binary.BigEndian.Uint16(l4[2:]) &^ 7
				proto, l4 = l4[0], l4[8:]
				if off != 0 {
					l4 = nil
				}
			}
		}
	default:
		return p, false
	}
	var sport, dport uint16
	switch proto {
	case ipprotoUDP, ipprotoTCP, ipprotoSCTP, ipprotoUDPLite:
		if len(l4) >= 4 {
			sport, dport = binary.BigEndian.Uint16(l4), binary.BigEndian.Uint16(l4[2:])
		}
	}
	p.Proto = protoName(proto)
	p.Source = netip.AddrPortFrom(src, sport)
	p.Dest = netip.AddrPortFrom(dst, dport)
	return p, true
}

func protoName(p byte) string {
	switch p {
	case ipprotoUDP:
		return "udp"
	case ipprotoTCP:
		return "tcp"
	case ipprotoICMP:
		return "icmp"
	case ipprotoICMPv6:
		return "icmpv6"
	case ipprotoSCTP:
		return "sctp"
	case ipprotoUDPLite:
		return "udplite"
	}
	return fmt.Sprintf("ip-proto-%d", p)
}
