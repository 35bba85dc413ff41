package broker

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// target is where a request is sent: a normalised host (lower-case, no brackets, no
// trailing dot, numeric IPv4 forms as dotted quads) and port. newTarget makes one.
type target struct {
	scheme string
	host   string
	port   int
	// hostPort and hostHeader, worked out once: a tunnel's requests use them all the time.
	authority, header string
}

func newTarget(scheme, host string, port int) target {
	t := target{scheme: scheme, host: host, port: port, authority: net.JoinHostPort(host, strconv.Itoa(port))}
	t.header = t.authority
	if (scheme == "https" && port == 443) || (scheme == "http" && port == 80) {
		t.header = host
		if strings.Contains(host, ":") {
			t.header = "[" + host + "]"
		}
	}
	return t
}

// hostPort is "host:port", with an IPv6 host in brackets.
func (t target) hostPort() string { return t.authority }

// hostHeader is the Host header upstream: the port only when it is not the scheme's default.
func (t target) hostHeader() string { return t.header }

// names reports whether h, a Host header or an absolute URL's host, names t exactly as t
// writes itself, which is how nearly every request names it; anything else is parsed.
func (t target) names(h string) bool { return h == t.authority || h == t.header }

// splitHost parses "host[:port]" into a normalised host and a port (defPort when absent).
// The policy, the credential bindings and the dialer all see the normalised host, so
// "0x7f.1", "2130706433" and "127.0.0.1" are one and the same.
func splitHost(hostport string, defPort int) (string, int, error) {
	host, portStr := hostport, ""
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		host, portStr = h, p
	} else if strings.HasPrefix(hostport, "[") && strings.HasSuffix(hostport, "]") {
		host = hostport[1 : len(hostport)-1]
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	host, err := normaliseHost(host)
	if err != nil {
		return "", 0, fmt.Errorf("%w in %q", err, hostport)
	}
	port := defPort
	if portStr != "" {
		p, err := strconv.Atoi(portStr)
		if err != nil || p < 1 || p > 65535 || portStr[0] == '+' {
			return "", 0, fmt.Errorf("invalid port in %q", hostport)
		}
		port = p
	}
	return host, port, nil
}

// normaliseHost accepts DNS names (letters, digits, '-', '_', '.'), IPv6 literals and IPv4 in
// any form inet_aton(3) accepts, returned as the canonical address text.
func normaliseHost(h string) (string, error) {
	if h == "" || len(h) > 253 {
		return "", fmt.Errorf("invalid host")
	}
	if strings.Contains(h, ":") {
		a, err := netip.ParseAddr(h)
		if err != nil || a.Zone() != "" {
			return "", fmt.Errorf("invalid IPv6 host")
		}
		if a.Is4In6() {
			return a.Unmap().String(), nil
		}
		return a.String(), nil
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return "", fmt.Errorf("invalid character in host")
		}
	}
	if strings.Contains(h, "..") || h[0] == '.' || h[len(h)-1] == '.' {
		return "", fmt.Errorf("invalid host")
	}
	if numericHost(h) {
		a, ok := inetAton(h)
		if !ok {
			return "", fmt.Errorf("invalid numeric host")
		}
		return a.String(), nil
	}
	return h, nil
}

// numericHost reports whether every label starts with a digit and holds only hex digits and
// 'x': a form that inet_aton, and so some clients and resolvers, read as an IPv4 address.
func numericHost(h string) bool {
	for _, label := range strings.Split(h, ".") {
		if label == "" || label[0] < '0' || label[0] > '9' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c == 'x') {
				return false
			}
		}
	}
	return true
}

// inetAton parses 1 to 4 parts, each decimal, 0x-hexadecimal or 0-octal; the last part fills
// the remaining bytes ("127.1" is 127.0.0.1, "2130706433" is 127.0.0.1).
func inetAton(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	var vals []uint64
	for _, p := range parts {
		base, digits := 10, p
		switch {
		case strings.HasPrefix(p, "0x"):
			base, digits = 16, p[2:]
		case len(p) > 1 && p[0] == '0':
			base, digits = 8, p[1:]
		}
		if digits == "" && base == 16 {
			return netip.Addr{}, false
		}
		v, err := strconv.ParseUint(digits, base, 32)
		if err != nil && digits != "" {
			return netip.Addr{}, false
		}
		vals = append(vals, v)
	}
	var ip uint64
	for i, v := range vals[:len(vals)-1] {
		if v > 255 {
			return netip.Addr{}, false
		}
		ip |= v << (8 * (3 - i))
	}
	last := vals[len(vals)-1]
	if last >= 1<<(8*(5-len(vals))) {
		return netip.Addr{}, false
	}
	ip |= last
	return netip.AddrFrom4([4]byte{byte(ip >> 24), byte(ip >> 16), byte(ip >> 8), byte(ip)}), true
}
