package egress

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// NoProxy matches the destinations that never go through a proxy.
//
// Entries, matched case-insensitively, a trailing dot ignored:
//
//	host.example.com          exactly this name (not its subdomains)
//	.corp.example             corp.example and every name under it (as curl
//	*.corp.example            does for a leading dot); both spellings are equal
//	10.0.0.0/8, fd00::/8      a CIDR, matched on the destination's address
//	10.1.2.3, fd00::1         one address (a /32 or /128)
//	host:8443                 any of the above, only on this port; IPv6 with a
//	[fd00::1]:8443            port in brackets, a CIDR too: [fd00::/8]:8443
//	*                         everything (also *:8443: everything on a port)
//
// Names match names only: an entry "10.1.2.3" matches a destination whose
// checked address is 10.1.2.3 whatever name was asked for, and a name entry
// never matches an address literal.
type NoProxy struct {
	entries []noProxyEntry
}

type entryKind uint8

const (
	kindAll entryKind = iota
	kindExact
	kindSuffix
	kindPrefix
)

type noProxyEntry struct {
	kind   entryKind
	name   string       // kindExact, kindSuffix: lower case, no trailing dot
	prefix netip.Prefix // kindPrefix
	port   int          // 0: any port
}

// ParseNoProxy parses the operator's no_proxy entries. The error names the
// first bad entry by index and says why.
func ParseNoProxy(entries []string) (*NoProxy, error) {
	n := &NoProxy{entries: make([]noProxyEntry, 0, len(entries))}
	for i, raw := range entries {
		e, err := parseNoProxyEntry(raw)
		if err != nil {
			return nil, fmt.Errorf("no_proxy[%d] %q: %s", i, raw, err)
		}
		n.entries = append(n.entries, e)
	}
	return n, nil
}

func parseNoProxyEntry(raw string) (noProxyEntry, error) {
	s := strings.ToLower(strings.TrimSpace(raw))
	if s == "" {
		return noProxyEntry{}, fmt.Errorf("empty entry")
	}
	host, port := s, 0
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return noProxyEntry{}, fmt.Errorf("missing ]")
		}
		host = s[1:end]
		if rest := s[end+1:]; rest != "" {
			p, ok := strings.CutPrefix(rest, ":")
			if !ok {
				return noProxyEntry{}, fmt.Errorf("unexpected %q after ]", rest)
			}
			var err error
			if port, err = parsePort(p); err != nil {
				return noProxyEntry{}, err
			}
		}
		if _, err := netip.ParseAddr(host); err != nil {
			if _, err := netip.ParsePrefix(host); err != nil {
				return noProxyEntry{}, fmt.Errorf("brackets hold no IPv6 address or CIDR")
			}
		}
	case strings.Count(s, ":") == 1:
		h, p, _ := strings.Cut(s, ":")
		var err error
		if port, err = parsePort(p); err != nil {
			return noProxyEntry{}, err
		}
		host = h
	}
	// Two colons or more without brackets: an IPv6 address or CIDR, no port.
	switch {
	case host == "*":
		return noProxyEntry{kind: kindAll, port: port}, nil
	case strings.Contains(host, "/"):
		p, err := netip.ParsePrefix(host)
		if err != nil {
			return noProxyEntry{}, fmt.Errorf("not a CIDR: %v", err)
		}
		if p.Addr().Zone() != "" {
			return noProxyEntry{}, fmt.Errorf("zones are not supported")
		}
		return noProxyEntry{kind: kindPrefix, prefix: unmapPrefix(p).Masked(), port: port}, nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return noProxyEntry{}, fmt.Errorf("zones are not supported")
		}
		a = a.Unmap()
		return noProxyEntry{kind: kindPrefix, prefix: netip.PrefixFrom(a, a.BitLen()), port: port}, nil
	} else if strings.Contains(host, ":") {
		return noProxyEntry{}, fmt.Errorf("not an IPv6 address: %v", err)
	}
	kind := kindExact
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		kind, host = kindSuffix, rest
	} else if rest, ok := strings.CutPrefix(host, "."); ok {
		kind, host = kindSuffix, rest
	}
	host = strings.TrimSuffix(host, ".")
	if err := checkName(host); err != nil {
		return noProxyEntry{}, err
	}
	return noProxyEntry{kind: kind, name: host, port: port}, nil
}

// unmapPrefix turns ::ffff:10.0.0.0/104 into 10.0.0.0/8, so that an
// IPv4-mapped CIDR matches the (unmapped) address it means.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p
}

func parsePort(p string) (int, error) {
	if p == "" || len(p) > 5 || strings.TrimLeft(p, "0123456789") != "" {
		return 0, fmt.Errorf("port %q is not a number", p)
	}
	n, _ := strconv.Atoi(p)
	if n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %d is out of range 1-65535", n)
	}
	return n, nil
}

// checkName accepts a DNS name: labels of letters, digits, '-' and '_'.
func checkName(h string) error {
	if h == "" || len(h) > 253 {
		return fmt.Errorf("not a host name")
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("empty or over-long label in host name")
		}
		for _, c := range []byte(label) {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				if c == '*' {
					return fmt.Errorf("a wildcard is only allowed as a leading *. or alone")
				}
				return fmt.Errorf("%q is not allowed in a host name (no schemes or paths)", c)
			}
		}
	}
	return nil
}

// Match reports whether a connection to host:port, whose checked address is
// addr, goes direct. host is the name the client asked for (or an address
// literal, brackets allowed); port 0 means unknown and matches only entries
// without a port; addr may be invalid when no address is known yet, and then
// only an address literal in host can match a CIDR.
func (n *NoProxy) Match(host string, port int, addr netip.Addr) bool {
	if n == nil || len(n.entries) == 0 {
		return false
	}
	host = normalizeHost(host)
	hostIsAddr := false
	if a, err := netip.ParseAddr(host); err == nil {
		hostIsAddr = true
		if !addr.IsValid() {
			addr = a.WithZone("")
		}
	}
	addr = addr.Unmap()
	for _, e := range n.entries {
		if e.port != 0 && e.port != port {
			continue
		}
		switch e.kind {
		case kindAll:
			return true
		case kindPrefix:
			if addr.IsValid() && e.prefix.Contains(addr) {
				return true
			}
		case kindExact:
			if !hostIsAddr && host == e.name {
				return true
			}
		case kindSuffix:
			if !hostIsAddr && (host == e.name ||
				len(host) > len(e.name) && strings.HasSuffix(host, e.name) && host[len(host)-len(e.name)-1] == '.') {
				return true
			}
		}
	}
	return false
}

// normalizeHost lower-cases host and drops a trailing dot and IPv6 brackets.
func normalizeHost(host string) string {
	host = strings.ToLower(host)
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	return strings.TrimSuffix(host, ".")
}
