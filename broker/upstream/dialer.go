package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"time"
)

// ErrForbiddenDestination is wrapped by every dial refused by the destination check.
var ErrForbiddenDestination = errors.New("destination address not allowed")

// ErrOwnService is wrapped too when the refused destination is one of the broker's own
// listeners or services (NewDialer's deny): whatever the policy said, a request there is
// refused as a deny, not reported as an upstream failure.
var ErrOwnService = errors.New("the broker's own service")

const defaultDialTimeout = 10 * time.Second

// forbiddenError is a refused dial. Addresses are not secret, so the text names the address
// and the class to make denials debuggable from the logs.
type forbiddenError struct {
	addr  string
	class string
}

func (e *forbiddenError) Error() string {
	return fmt.Sprintf("dial %s: %v (%s)", e.addr, ErrForbiddenDestination, e.class)
}

func (e *forbiddenError) Unwrap() []error {
	if e.class == ownService {
		return []error{ErrForbiddenDestination, ErrOwnService}
	}
	return []error{ErrForbiddenDestination}
}

const ownService = "the broker's own service"

// Dialer dials TCP only to addresses that pass Classify, or that fall inside allowPrivate.
// The check runs in net.Dialer.ControlContext, i.e. on the resolved "ip:port" of every
// address attempted, after DNS and just before connect(2). A name that resolves to a public
// address once and a private one the next time (DNS rebinding) is therefore still refused,
// and so is a name with one public and one private address.
type Dialer struct {
	allow  []netip.Prefix
	deny   []netip.AddrPort
	dialer net.Dialer
	// service dials the broker's own services: no destination check (DialService).
	service net.Dialer
	// proxies, when set, chain connections through the upstream proxies (proxy.go).
	proxies *proxies
}

// NewDialer returns a Dialer that may additionally reach the prefixes in allowPrivate, but
// never the addresses in deny: the broker's own listeners and its Vault, which an agent must
// not reach through the broker even where allow_private covers them. A deny entry with an
// unspecified address (a listener on 0.0.0.0:8080) refuses that port on every address that is
// not public. A timeout <= 0 means 10s.
func NewDialer(allowPrivate []netip.Prefix, timeout time.Duration, deny ...netip.AddrPort) *Dialer {
	if timeout <= 0 {
		timeout = defaultDialTimeout
	}
	d := &Dialer{allow: normalisePrefixes(allowPrivate)}
	for _, ap := range deny {
		d.deny = append(d.deny, netip.AddrPortFrom(ap.Addr().WithZone("").Unmap(), ap.Port()))
	}
	d.dialer = net.Dialer{Timeout: timeout, ControlContext: d.control}
	d.service = net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	return d
}

// DialContext dials addr over "tcp", "tcp4" or "tcp6". A refused destination returns an
// error wrapping ErrForbiddenDestination; no connection attempt is made to it. With upstream
// proxies configured, the connection is a CONNECT tunnel through one of them, as ctx's Route
// and no_proxy say (see proxy.go); the destination is checked all the same, first.
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, fmt.Errorf("dial %s: network %q not supported", addr, network)
	}
	list, target, err := d.plan(ctx, "https", addr)
	if err != nil {
		return nil, err
	}
	if len(list) > 0 {
		return d.dialProxied(ctx, list, addr, target, false)
	}
	return d.dialDirect(ctx, network, addr)
}

// DialService dials one of the broker's own services, which the operator configured and no
// agent chose: Vault, OAuth2/GitHub/Google token endpoints, the approvals webhook, policy
// bundle servers, Redis. It follows upstream.proxy only: through the proxies in order, or
// directly when no_proxy matches addr (by name, suffix, CIDR of any of its addresses, port)
// or no proxy is configured. It never takes a policy's route (a request's Route in ctx is
// ignored and left untouched), and the agent-facing destination check does not apply: Vault
// and Redis are usually private or loopback, and the operator lists them in no_proxy.
func (d *Dialer) DialService(ctx context.Context, network, addr string) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, fmt.Errorf("dial %s: network %q not supported", addr, network)
	}
	ctx = WithRoute(ctx, nil) // not the request's route, nor its via
	p := d.proxies
	if p == nil {
		return d.service.DialContext(ctx, network, addr)
	}
	host, port, ips, err := resolve(ctx, addr)
	if err != nil {
		return nil, err
	}
	for _, ip := range ips {
		if p.noProxy.Match(host, port, ip) {
			conn, err := d.service.DialContext(ctx, network, addr)
			if p.observe != nil {
				p.observe(Direct, err != nil)
			}
			return conn, err
		}
	}
	return d.dialProxied(ctx, p.list, addr, netip.AddrPortFrom(ips[0], uint16(port)), false)
}

// resolve splits addr and resolves its host (an IP literal as itself), unmapped.
func resolve(ctx context.Context, addr string) (host string, port int, ips []netip.Addr, err error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, nil, err
	}
	port, err = strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, nil, fmt.Errorf("dial %s: bad port", addr)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip}
	} else if ips, err = net.DefaultResolver.LookupNetIP(ctx, "ip", host); err != nil {
		return "", 0, nil, err
	}
	if len(ips) == 0 {
		return "", 0, nil, fmt.Errorf("dial %s: no address", addr)
	}
	for i := range ips {
		ips[i] = ips[i].Unmap()
	}
	return host, port, ips, nil
}

// dialDirect dials addr itself, checking every address attempted.
func (d *Dialer) dialDirect(ctx context.Context, network, addr string) (net.Conn, error) {
	RouteOf(ctx).setVia(Direct)
	conn, err := d.dialer.DialContext(ctx, network, addr)
	var fe *forbiddenError
	if errors.As(err, &fe) {
		// Drop net's *OpError wrapper so the message reads "dial ip:port: ... (class)" once.
		return nil, fe
	}
	return conn, err
}

// control runs once per address attempted, after resolution and before connect(2).
func (d *Dialer) control(_ context.Context, network, address string, _ syscall.RawConn) error {
	if network != "tcp4" && network != "tcp6" {
		return &forbiddenError{addr: address, class: "network " + network}
	}
	return d.check(address)
}

// check decides one resolved "ip:port". Anything that does not parse is refused.
func (d *Dialer) check(address string) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &forbiddenError{addr: address, class: "unparseable"}
	}
	ip := ap.Addr()
	class := Classify(ip)
	if d.denied(ap, class) {
		return &forbiddenError{addr: address, class: ownService}
	}
	if class == "" || d.allowed(ip) {
		return nil
	}
	return &forbiddenError{addr: address, class: class}
}

// denied reports whether ap is one of the broker's own services.
func (d *Dialer) denied(ap netip.AddrPort, class string) bool {
	ip := ap.Addr().WithZone("").Unmap()
	for _, x := range d.deny {
		if x.Port() != ap.Port() {
			continue
		}
		if x.Addr() == ip || (x.Addr().IsUnspecified() && class != "") {
			return true
		}
	}
	return false
}

// allowed reports whether ip is inside an allowPrivate prefix. The zone is ignored and the
// IPv4-mapped form is unmapped, so an allow of 127.0.0.1/32 also covers ::ffff:127.0.0.1.
func (d *Dialer) allowed(ip netip.Addr) bool {
	ip = ip.WithZone("").Unmap()
	for _, p := range d.allow {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// normalisePrefixes masks each prefix and rewrites IPv4-mapped prefixes (::ffff:a.b.c.d/n,
// n >= 96) as the IPv4 prefix they mean, to match the unmapped addresses allowed() compares.
// Invalid prefixes are dropped: they can never contain an address anyway.
func normalisePrefixes(in []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(in))
	for _, p := range in {
		if !p.IsValid() {
			continue
		}
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	return out
}
