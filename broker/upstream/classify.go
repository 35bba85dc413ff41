// Package upstream is the broker's way out: it decides which IP addresses may be dialled,
// dials only those, and builds the Client every forwarded request goes through.
package upstream

import "net/netip"

// classRange names one special-purpose range. Tables are checked in order, first match wins,
// so narrower or more telling classes come before broader ones.
type classRange struct {
	prefix netip.Prefix
	class  string
}

func r(cidr, class string) classRange {
	return classRange{netip.MustParsePrefix(cidr), class}
}

// metadataAddrs are cloud instance-metadata and host-agent endpoints. They hand out credentials
// and instance identity, so they are named explicitly; most also sit inside a broader refused
// class, but 168.63.129.16 is in Microsoft's public space and is only caught here.
var metadataAddrs = map[netip.Addr]bool{
	netip.MustParseAddr("169.254.169.254"): true, // AWS, GCP, Azure, OCI, OpenStack, DigitalOcean, ...
	netip.MustParseAddr("169.254.170.2"):   true, // AWS ECS task metadata and credentials
	netip.MustParseAddr("169.254.170.23"):  true, // AWS EKS Pod Identity agent
	netip.MustParseAddr("169.254.0.23"):    true, // Tencent Cloud
	netip.MustParseAddr("100.100.100.200"): true, // Alibaba Cloud
	netip.MustParseAddr("168.63.129.16"):   true, // Azure WireServer / host agent
	netip.MustParseAddr("192.0.0.192"):     true, // Oracle Cloud (legacy)
	netip.MustParseAddr("fd00:ec2::254"):   true, // AWS IMDS over IPv6
	netip.MustParseAddr("fd00:ec2::23"):    true, // AWS EKS Pod Identity over IPv6
	netip.MustParseAddr("fd20:ce::254"):    true, // GCP metadata over IPv6
}

var v4Classes = []classRange{
	r("0.0.0.0/32", "unspecified"), // Linux treats a dial to 0.0.0.0 as a dial to the local host
	r("255.255.255.255/32", "broadcast"),
	r("127.0.0.0/8", "loopback"),
	r("10.0.0.0/8", "private"),
	r("172.16.0.0/12", "private"),
	r("192.168.0.0/16", "private"),
	r("169.254.0.0/16", "link-local"),
	r("100.64.0.0/10", "cgnat"),
	r("224.0.0.0/4", "multicast"),
	r("0.0.0.0/8", "reserved"),
	r("240.0.0.0/4", "reserved"),
	r("192.0.0.0/24", "reserved"),    // IETF protocol assignments
	r("192.0.2.0/24", "reserved"),    // TEST-NET-1
	r("192.88.99.0/24", "reserved"),  // deprecated 6to4 relay anycast
	r("198.18.0.0/15", "reserved"),   // benchmarking
	r("198.51.100.0/24", "reserved"), // TEST-NET-2
	r("203.0.113.0/24", "reserved"),  // TEST-NET-3
}

// v6Classes is checked after the forms that embed an IPv4 address (see Classify).
var v6Classes = []classRange{
	r("2001::/32", "teredo"), // refused outright: the relay, not us, decides where it goes
	r("ff00::/8", "multicast"),
	r("fe80::/10", "link-local"),
	r("fec0::/10", "site-local"),
	r("fc00::/7", "ula"),
	r("2001::/23", "reserved"), // IETF protocol assignments (after Teredo, which it contains)
	r("2001:db8::/32", "reserved"),
	r("3fff::/20", "reserved"), // documentation (RFC 9637)
	r("5f00::/16", "reserved"), // SRv6 SIDs
}

// globalUnicast is 2000::/3, the only IPv6 space IANA allocates for public unicast. Everything
// outside it that was not matched above (discard-only 100::/64, unallocated space, ...) is
// refused as reserved rather than enumerated.
var globalUnicast = netip.MustParsePrefix("2000::/3")

// Forms that carry an IPv4 address inside an IPv6 one. A dial to them may end up at the
// embedded IPv4 address (through the kernel, a NAT64 gateway or a 6to4 relay), so the
// embedded address is what gets classified.
var (
	v4Compatible = netip.MustParsePrefix("::/96")          // deprecated IPv4-compatible
	nat64        = netip.MustParsePrefix("64:ff9b::/96")   // RFC 6052 well-known prefix
	nat64Local   = netip.MustParsePrefix("64:ff9b:1::/48") // RFC 8215 local-use prefix
	sixToFour    = netip.MustParsePrefix("2002::/16")      // embedded v4 in bits 16..48
)

// Classify returns "" when ip is an ordinary public unicast address, otherwise a short class
// name saying why it must not be dialled (see the tables above). An invalid address is
// refused as "invalid". IPv6 forms that embed an IPv4 address return the class of the
// embedded address; Teredo is always refused.
func Classify(ip netip.Addr) string {
	if !ip.IsValid() {
		return "invalid"
	}
	// A zone only selects the interface; the address decides the class (fe80::1%eth0 is link-local).
	ip = ip.WithZone("")
	if metadataAddrs[ip] {
		return "metadata"
	}
	if ip.Is4In6() {
		return Classify(ip.Unmap())
	}
	if ip.Is4() {
		return lookup(v4Classes, ip)
	}

	b := ip.As16()
	switch {
	// :: and ::1 lie inside ::/96 and must be named before it is decoded.
	case ip == netip.IPv6Unspecified():
		return "unspecified"
	case ip == netip.IPv6Loopback():
		return "loopback"
	case v4Compatible.Contains(ip), nat64.Contains(ip):
		return Classify(netip.AddrFrom4([4]byte(b[12:16])))
	case nat64Local.Contains(ip):
		// The operator picks the prefix length inside 64:ff9b:1::/48, which moves the embedded
		// address (RFC 6052 section 2.2). Only the /96 layout, with bits 48..95 zero, can be
		// read without guessing; any other layout is refused rather than misread.
		if b[6]|b[7]|b[8]|b[9]|b[10]|b[11] != 0 {
			return "reserved"
		}
		return Classify(netip.AddrFrom4([4]byte(b[12:16])))
	case sixToFour.Contains(ip):
		return Classify(netip.AddrFrom4([4]byte(b[2:6])))
	}
	if c := lookup(v6Classes, ip); c != "" {
		return c
	}
	if !globalUnicast.Contains(ip) {
		return "reserved"
	}
	return ""
}

func lookup(table []classRange, ip netip.Addr) string {
	for _, cr := range table {
		if cr.prefix.Contains(ip) {
			return cr.class
		}
	}
	return ""
}
