package nflog

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"
)

func ipv4(proto byte, src, dst string, l4 []byte) []byte {
	b := make([]byte, 20)
	b[0] = 0x45
	b[9] = proto
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	return append(b, l4...)
}

func ipv6(next byte, src, dst string, rest []byte) []byte {
	b := make([]byte, 40)
	b[0] = 0x60
	b[6] = next
	s, d := netip.MustParseAddr(src).As16(), netip.MustParseAddr(dst).As16()
	copy(b[8:], s[:])
	copy(b[24:], d[:])
	return append(b, rest...)
}

func ports(s, d uint16) []byte {
	b := binary.BigEndian.AppendUint16(nil, s)
	return binary.BigEndian.AppendUint16(append(b, 0, 0)[:2], d)
}

func TestParseIP(t *testing.T) {
	hopByHop := append([]byte{17, 0, 0, 0, 0, 0, 0, 0}, ports(5353, 443)...)
	fragFirst := append([]byte{17, 0, 0, 0, 0, 0, 0, 1}, ports(1, 2)...)
	fragLater := append([]byte{17, 0, 0x05, 0xc8, 0, 0, 0, 1}, ports(1, 2)...)
	v4frag := ipv4(17, "10.0.0.1", "10.0.0.2", ports(1, 2))
	v4frag[6], v4frag[7] = 0x00, 0xb9 // offset 185*8: no UDP header here
	for name, c := range map[string]struct {
		pkt  []byte
		want string // Proto Source Dest, "" when it does not parse
	}{
		"v4 udp":            {ipv4(17, "10.250.0.2", "198.18.3.4", ports(40000, 443)), "udp 10.250.0.2:40000 198.18.3.4:443"},
		"v4 tcp":            {ipv4(6, "10.250.0.2", "10.250.0.1", ports(40000, 9090)), "tcp 10.250.0.2:40000 10.250.0.1:9090"},
		"v4 icmp":           {ipv4(1, "10.250.0.2", "10.250.1.1", []byte{8, 0, 0, 0}), "icmp 10.250.0.2:0 10.250.1.1:0"},
		"v4 options":        {append([]byte{0x46}, ipv4(17, "10.0.0.1", "10.0.0.2", append([]byte{1, 1, 1, 1}, ports(7, 8)...))[1:]...), "udp 10.0.0.1:7 10.0.0.2:8"},
		"v4 later fragment": {v4frag, "udp 10.0.0.1:0 10.0.0.2:0"},
		"v4 truncated l4":   {ipv4(17, "10.0.0.1", "10.0.0.2", []byte{1}), "udp 10.0.0.1:0 10.0.0.2:0"},
		"v6 udp":            {ipv6(17, "fd00:250::2", "fd00:cb::7", ports(50000, 443)), "udp [fd00:250::2]:50000 [fd00:cb::7]:443"},
		"v6 hop-by-hop":     {ipv6(0, "fd00:250::2", "fd00:cb::7", hopByHop), "udp [fd00:250::2]:5353 [fd00:cb::7]:443"},
		"v6 first fragment": {ipv6(44, "fd00::1", "fd00::2", fragFirst), "udp [fd00::1]:1 [fd00::2]:2"},
		"v6 later fragment": {ipv6(44, "fd00::1", "fd00::2", fragLater), "udp [fd00::1]:0 [fd00::2]:0"},
		"v6 icmpv6":         {ipv6(58, "fd00::1", "fd00::2", []byte{128, 0}), "icmpv6 [fd00::1]:0 [fd00::2]:0"},
		"v6 other":          {ipv6(99, "fd00::1", "fd00::2", nil), "ip-proto-99 [fd00::1]:0 [fd00::2]:0"},
		"empty":             {nil, ""},
		"short v4":          {[]byte{0x45, 0, 0}, ""},
		"short v6":          {make([]byte, 39), ""},
		"bad ihl":           {append([]byte{0x44}, make([]byte, 30)...), ""},
		"not ip":            {[]byte{0x20, 1, 2, 3}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			p, ok := ParseIP(c.pkt)
			got := ""
			if ok {
				got = p.Proto + " " + p.Source.String() + " " + p.Dest.String()
			}
			if got != c.want {
				t.Fatalf("ParseIP = %q, want %q", got, c.want)
			}
		})
	}
}

func TestFlowsOncePerWindow(t *testing.T) {
	var f Flows
	t0 := time.Unix(1000, 0)
	a := Packet{Proto: "udp", Source: netip.MustParseAddrPort("10.250.0.2:4000"), Dest: netip.MustParseAddrPort("198.18.0.1:443")}
	b := a
	b.Source = netip.MustParseAddrPort("10.250.0.2:4001") // another socket: another flow
	c := a
	c.Proto = "tcp"
	steps := []struct {
		p    Packet
		at   time.Duration
		want bool
	}{
		{a, 0, true}, {a, time.Second, false}, {b, time.Second, true}, {c, time.Second, true},
		{a, Window - time.Nanosecond, false}, {a, Window + time.Second, true}, {a, Window + 2*time.Second, false},
	}
	for i, s := range steps {
		if got := f.First(s.p, t0.Add(s.at)); got != s.want {
			t.Fatalf("step %d (%v at %v): First = %v, want %v", i, s.p, s.at, got, s.want)
		}
	}
}

func TestFlowsBounded(t *testing.T) {
	var f Flows
	now := time.Unix(1000, 0)
	for i := range maxFlows * 3 {
		p := Packet{Proto: "udp", Source: netip.MustParseAddrPort("10.0.0.1:1"), Dest: netip.AddrPortFrom(netip.MustParseAddr("10.0.0.2"), uint16(i))}
		if i >= 65536 {
			p.Source = netip.AddrPortFrom(p.Source.Addr(), uint16(i/65536+1))
		}
		if !f.First(p, now) {
			t.Fatalf("packet %d: a new flow was not reported", i)
		}
		if len(f.seen) > maxFlows {
			t.Fatalf("%d flows remembered, at most %d", len(f.seen), maxFlows)
		}
	}
}
