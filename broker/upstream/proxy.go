package upstream

// Chaining through the network's own proxies (upstream.proxy): a property of the one checked
// Dialer, so that every outbound connection, whichever path asks for it, leaves the same way.
// The origin is resolved and its every address checked before any proxy is asked; the proxy
// is then asked for the checked address (or, with ConnectByName, for the name), and is the
// only destination that may be private without allow_private covering it.

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/capbroker/capbroker/broker/upstream/egress"
)

// Direct is the route, and the "via", of a connection made without a proxy.
const Direct = "direct"

// ErrProxyRefused is wrapped by a refusal from an upstream proxy (an answer other than 2xx to
// CONNECT, a 407, or an error page the proxy wrote itself).
var ErrProxyRefused = errors.New("upstream proxy refused")

// ErrProxyUnreachable is wrapped when no configured proxy could be connected to.
var ErrProxyUnreachable = errors.New("upstream proxy unreachable")

// ErrUnknownProxy is wrapped when a route names a proxy that is not configured.
var ErrUnknownProxy = errors.New("unknown upstream proxy")

// ErrPACRefused is wrapped when the PAC file gave no usable route (it threw, timed out,
// returned nothing usable or named an unconfigured proxy) and its fallback is PACRefuse.
var ErrPACRefused = errors.New("the PAC file gave no usable route and its fallback is refuse")

// PACRefuse is the PAC fallback that refuses the connection.
const PACRefuse = "refuse"

// ProxyRefusedError is a proxy's refusal: its name, status and reason (the status line and,
// from squid, its X-Squid-Error). It holds nothing the broker sent.
type ProxyRefusedError struct {
	Proxy  string
	Status int
	Reason string
}

func (e *ProxyRefusedError) Error() string {
	return fmt.Sprintf("upstream proxy %s refused: %d %s", e.Proxy, e.Status, e.Reason)
}

func (e *ProxyRefusedError) Unwrap() error { return ErrProxyRefused }

// ProxyServer is one upstream proxy.
type ProxyServer struct {
	Name string
	URL  *url.URL    // http://host:port or https://host:port
	TLS  *tls.Config // for an https:// proxy: the roots its certificate is verified against
	// Username, and Password, called for every connection to the proxy (a rotated password is
	// used at once): Basic authentication. Nil Password: none.
	Username string
	Password func(ctx context.Context) (string, error)
}

// ProxyOptions configures the chaining.
type ProxyOptions struct {
	Proxies       []ProxyServer
	NoProxy       []string
	ConnectByName bool
	// InspectionCAFile, when set, holds the roots of a proxy that inspects TLS: trusted for
	// origins reached through a proxy, never for others.
	InspectionCAFile string
	// Observe, when set, is called after every attempt to use a proxy, with its name and
	// whether it failed (unreachable or refused), and after every direct connection
	// DialService makes for no_proxy, with Direct.
	Observe func(proxy string, failed bool)
}

// proxies is the Dialer's chaining state; nil when no proxy is configured.
type proxies struct {
	list    []*ProxyServer
	byName  map[string]*ProxyServer
	noProxy *egress.NoProxy
	pac     *egress.PAC // nil: no PAC file
	// pacFallback is what a failed PAC evaluation gives: a proxy's name, Direct or PACRefuse.
	pacFallback string
	byName2     bool // ConnectByName
	observe     func(string, bool)
	dialer      net.Dialer // to the proxies themselves, which need not pass the destination check
}

// Route is what a request's policy decided about proxies, carried in its context: Name is ""
// (the configuration's choice: the proxies in order, or direct for no_proxy), Direct, or a
// proxy's name. The dial records the proxy it used in Via.
type Route struct {
	Name      string
	via       atomic.Pointer[string]
	inspected atomic.Bool
}

// Via is the proxy the request's connection went through ("direct" when none); "" before any.
func (r *Route) Via() string {
	if r == nil {
		return ""
	}
	if p := r.via.Load(); p != nil {
		return *p
	}
	return ""
}

// Inspected reports whether the origin's certificate on the request's connection verified
// only through the TLS-inspection CA (ProxyOptions.InspectionCAFile): a proxy on the way
// re-signed it.
func (r *Route) Inspected() bool { return r != nil && r.inspected.Load() }

func (r *Route) setVia(name string) { r.setWay(name, false) }

// setWay records the connection a request went over: its proxy, and whether its origin
// was trusted through the TLS-inspection CA.
func (r *Route) setWay(via string, inspected bool) {
	if r != nil {
		r.via.Store(&via)
		r.inspected.Store(inspected)
	}
}

type routeKey struct{}

// WithRoute returns ctx carrying r: every connection dialled with it follows r.
func WithRoute(ctx context.Context, r *Route) context.Context {
	return context.WithValue(ctx, routeKey{}, r)
}

// RouteOf returns ctx's route, nil when it has none (the configuration's choice).
func RouteOf(ctx context.Context) *Route {
	r, _ := ctx.Value(routeKey{}).(*Route)
	return r
}

func routeName(ctx context.Context) string {
	if r := RouteOf(ctx); r != nil {
		return r.Name
	}
	return ""
}

// proxiedConn is a connection to a proxy: a CONNECT tunnel to the origin, or (fwd set) one
// for absolute-form requests.
type proxiedConn struct {
	net.Conn
	br  *bufio.Reader // bytes the proxy sent after its CONNECT answer; nil when none
	via string
	fwd *forward
}

func (c *proxiedConn) Read(p []byte) (int, error) {
	if c.br != nil {
		if c.br.Buffered() > 0 {
			return c.br.Read(p)
		}
		c.br = nil
	}
	return c.Conn.Read(p)
}

// SyscallConn is the TCP connection to the proxy, for the pool's liveness peek (conn.alive):
// the proxy relays the origin's bytes and its close over it, so a peek there sees what it
// would on a direct connection. Through an https:// proxy it is the TCP connection under the
// proxy's TLS: a close, or bytes after a response, still show; records the proxy's tls.Conn
// has already read do not (nor, on a direct connection, do those under the origin's TLS,
// which conn.unread looks at instead).
func (c *proxiedConn) SyscallConn() (syscall.RawConn, error) {
	under := c.Conn
	if tc, ok := under.(*tls.Conn); ok {
		under = tc.NetConn()
	}
	sc, ok := under.(syscall.Conn)
	if !ok {
		return nil, errors.New("upstream proxy connection: no socket")
	}
	return sc.SyscallConn()
}

// forward is what an absolute-form request through a proxy needs: the authority the proxy is
// asked for, and the proxy's Authorization.
type forward struct {
	target string
	auth   string
}

// Via returns the upstream proxy a connection the Dialer made goes through, Direct when none.
func Via(c net.Conn) string { return viaOf(c) }

// viaOf returns the proxy conn goes through, Direct when none.
func viaOf(c net.Conn) string {
	if pc, ok := c.(*proxiedConn); ok {
		return pc.via
	}
	return Direct
}

// ConfigureProxies makes the Dialer chain through opts.Proxies. It is called once, before the
// Dialer is used.
func (d *Dialer) ConfigureProxies(opts ProxyOptions) error {
	if len(opts.Proxies) == 0 {
		return nil
	}
	np, err := egress.ParseNoProxy(opts.NoProxy)
	if err != nil {
		return err
	}
	p := &proxies{byName: map[string]*ProxyServer{}, noProxy: np, byName2: opts.ConnectByName, observe: opts.Observe}
	p.dialer = net.Dialer{Timeout: d.dialer.Timeout}
	for i := range opts.Proxies {
		s := opts.Proxies[i]
		if s.URL == nil || (s.URL.Scheme != "http" && s.URL.Scheme != "https") || s.URL.Port() == "" {
			return fmt.Errorf("upstream proxy %s: URL must be http(s)://host:port", s.Name)
		}
		p.list = append(p.list, &s)
		p.byName[s.Name] = &s
	}
	d.proxies = p
	return nil
}

// ConfigurePAC makes the Dialer ask script, a PAC file, which way each connection leaves
// (after the policy's route and no_proxy, before the proxies list). The script's "PROXY
// host:port" entries name the configured proxies by their URL's host:port; a failed
// evaluation (a throw, timeout > timeout, an unusable result, an unconfigured proxy) gives
// fallback: a configured proxy's name, Direct or PACRefuse. It is called once, after
// ConfigureProxies and before the Dialer serves requests.
func (d *Dialer) ConfigurePAC(script []byte, timeout time.Duration, fallback string) error {
	p := d.proxies
	if p == nil {
		return errors.New("pac: no upstream proxy configured")
	}
	if fallback != Direct && fallback != PACRefuse && p.byName[fallback] == nil {
		return fmt.Errorf("pac: fallback %q is not a configured proxy, %q or %q", fallback, Direct, PACRefuse)
	}
	addrs := make(map[string]string, len(p.list))
	for _, s := range p.list {
		if _, dup := addrs[strings.ToLower(s.URL.Host)]; !dup {
			addrs[strings.ToLower(s.URL.Host)] = s.Name
		}
	}
	pac, err := egress.NewPAC(script, egress.PACOptions{Timeout: timeout, Proxies: addrs})
	if err != nil {
		return err
	}
	p.pac, p.pacFallback = pac, fallback
	return nil
}

// Proxies returns the configured proxies' names and addresses (host:port), in order.
func (d *Dialer) Proxies() [][2]string {
	if d.proxies == nil {
		return nil
	}
	var out [][2]string
	for _, s := range d.proxies.list {
		out = append(out, [2]string{s.Name, s.URL.Host})
	}
	return out
}

// Chains reports whether upstream proxies are configured.
func (d *Dialer) Chains() bool { return d.proxies != nil }

// HasProxy reports whether name is a configured proxy or Direct.
func (d *Dialer) HasProxy(name string) bool {
	if name == Direct {
		return true
	}
	if d.proxies == nil {
		return false
	}
	_, ok := d.proxies.byName[name]
	return ok
}

// CheckProxy dials the proxy named name and closes the connection: for /readyz.
func (d *Dialer) CheckProxy(ctx context.Context, name string) error {
	if d.proxies == nil || d.proxies.byName[name] == nil {
		return ErrUnknownProxy
	}
	c, err := d.proxies.dialer.DialContext(ctx, "tcp", d.proxies.byName[name].URL.Host)
	if err != nil {
		return err
	}
	return c.Close()
}

// plan returns the ways to try for addr under ctx's route, in order: a proxy, or nil for
// direct; none at all means direct. With proxies to try, it has resolved addr's host and
// checked every address, and returns the one to ask for. The order of precedence: the
// policy's route, no_proxy, the PAC file, the proxies list. scheme is what the PAC file sees
// ("http" for absolute-form requests, "https" for tunnels).
func (d *Dialer) plan(ctx context.Context, scheme, addr string) (list []*ProxyServer, target netip.AddrPort, err error) {
	p := d.proxies
	route := routeName(ctx)
	if route == Direct {
		return nil, target, nil
	}
	if p == nil {
		if route != "" {
			return nil, target, fmt.Errorf("%w %q", ErrUnknownProxy, route)
		}
		return nil, target, nil
	}
	host, port, ips, err := resolve(ctx, addr)
	if err != nil {
		return nil, target, err
	}
	// Every address must pass, as it would direct: the proxy never reaches one the broker
	// would not.
	for _, ip := range ips {
		if err := d.check(netip.AddrPortFrom(ip.Unmap(), uint16(port)).String()); err != nil {
			return nil, target, err
		}
	}
	target = netip.AddrPortFrom(ips[0].Unmap(), uint16(port))
	switch route {
	case "":
		for _, ip := range ips {
			if p.noProxy.Match(host, port, ip.Unmap()) {
				return nil, target, nil
			}
		}
		if p.pac != nil {
			list, err := p.pacPlan(ctx, scheme, host, port)
			return list, target, err
		}
		return p.list, target, nil
	default:
		s := p.byName[route]
		if s == nil {
			return nil, target, fmt.Errorf("%w %q", ErrUnknownProxy, route)
		}
		return []*ProxyServer{s}, target, nil
	}
}

// pacPlan asks the PAC file for host:port: its entries in order (nil for DIRECT), or, when it
// fails, the fallback. A plan of DIRECT alone is none (direct).
func (p *proxies) pacPlan(ctx context.Context, scheme, host string, port int) ([]*ProxyServer, error) {
	routes, err := p.pac.Find(ctx, scheme+"://"+net.JoinHostPort(host, strconv.Itoa(port))+"/", host)
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err() // the request's own deadline, not the PAC file's failure
	}
	if err != nil {
		switch p.pacFallback {
		case Direct:
			return nil, nil
		case PACRefuse:
			return nil, fmt.Errorf("%w: %w", ErrPACRefused, err)
		default:
			return []*ProxyServer{p.byName[p.pacFallback]}, nil
		}
	}
	var list []*ProxyServer
	for _, r := range routes {
		if r.Proxy == "" {
			list = append(list, nil)
			continue
		}
		s := p.byName[r.Proxy]
		if s == nil { // NewPAC was given only configured proxies
			return nil, fmt.Errorf("%w %q", ErrUnknownProxy, r.Proxy)
		}
		list = append(list, s)
	}
	if len(list) == 1 && list[0] == nil {
		return nil, nil
	}
	return list, nil
}

// dialProxied connects through the first of list that can be connected to: a CONNECT tunnel
// to target, or, with fwd, a connection for absolute-form requests.
func (d *Dialer) dialProxied(ctx context.Context, list []*ProxyServer, addr string, target netip.AddrPort, fwd bool) (net.Conn, error) {
	p := d.proxies
	host, port, _ := net.SplitHostPort(addr)
	ask := target.String()
	if p.byName2 {
		ask = net.JoinHostPort(host, port)
	}
	var errs []error
	for _, s := range list {
		if s == nil { // DIRECT, from a PAC file
			conn, err := d.dialDirect(ctx, "tcp", addr)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", Direct, err))
				continue
			}
			return conn, nil
		}
		conn, err := d.dialProxy(ctx, s)
		if err != nil {
			if p.observe != nil {
				p.observe(s.Name, true)
			}
			errs = append(errs, fmt.Errorf("%s: %w", s.Name, err))
			continue
		}
		auth, err := s.authorization(ctx)
		if err != nil {
			conn.Close()
			return nil, &ProxyRefusedError{Proxy: s.Name, Reason: "the broker could not read the proxy's password"}
		}
		if fwd {
			if p.observe != nil {
				p.observe(s.Name, false)
			}
			RouteOf(ctx).setVia(s.Name)
			return &proxiedConn{Conn: conn, via: s.Name, fwd: &forward{target: ask, auth: auth}}, nil
		}
		pc, err := connect(ctx, conn, s.Name, ask, net.JoinHostPort(host, port), auth, d.dialer.Timeout)
		if p.observe != nil {
			p.observe(s.Name, err != nil)
		}
		if err != nil {
			return nil, err // a proxy that answered has decided: the next one is not asked
		}
		RouteOf(ctx).setVia(s.Name)
		return pc, nil
	}
	return nil, fmt.Errorf("dial %s: %w: %w", addr, ErrProxyUnreachable, errors.Join(errs...))
}

// dialProxy opens a connection to s, with TLS for an https:// proxy.
func (d *Dialer) dialProxy(ctx context.Context, s *ProxyServer) (net.Conn, error) {
	conn, err := d.proxies.dialer.DialContext(ctx, "tcp", s.URL.Host)
	if err != nil {
		return nil, err
	}
	if s.URL.Scheme != "https" {
		return conn, nil
	}
	cfg := s.TLS.Clone()
	if cfg == nil {
		cfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	cfg.ServerName = s.URL.Hostname()
	cfg.NextProtos = nil
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		conn.Close()
		return nil, err
	}
	return tc, nil
}

func (s *ProxyServer) authorization(ctx context.Context) (string, error) {
	if s.Password == nil {
		return "", nil
	}
	pw, err := s.Password(ctx)
	if err != nil {
		return "", err
	}
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(s.Username+":"+pw)), nil
}

// connect asks the proxy on conn for a tunnel to ask (host:port), with hostHeader as Host.
func connect(ctx context.Context, conn net.Conn, name, ask, hostHeader, auth string, timeout time.Duration) (net.Conn, error) {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = conn.SetDeadline(deadline)
	var b strings.Builder
	b.WriteString("CONNECT " + ask + " HTTP/1.1\r\nHost: " + hostHeader + "\r\n")
	if auth != "" {
		b.WriteString("Proxy-Authorization: " + auth + "\r\n")
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(conn, b.String()); err != nil {
		conn.Close()
		return nil, fmt.Errorf("%w: %s: %w", ErrProxyUnreachable, name, err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("%w: %s: reading its answer to CONNECT: %w", ErrProxyUnreachable, name, err)
	}
	if resp.StatusCode/100 != 2 {
		conn.Close()
		return nil, refusal(name, resp)
	}
	_ = conn.SetDeadline(time.Time{})
	pc := &proxiedConn{Conn: conn, via: name}
	if br.Buffered() > 0 {
		pc.br = br
	}
	return pc, nil
}

// refusal makes a proxy's answer a ProxyRefusedError, with the status line and squid's
// X-Squid-Error (sanitised: printable ASCII only, bounded).
func refusal(name string, resp *http.Response) *ProxyRefusedError {
	reason := http.StatusText(resp.StatusCode)
	if _, text, ok := strings.Cut(resp.Status, " "); ok && text != "" {
		reason = text
	}
	if e := resp.Header.Get("X-Squid-Error"); e != "" {
		reason += " (" + e + ")"
	}
	return &ProxyRefusedError{Proxy: name, Status: resp.StatusCode, Reason: printable(reason, 200)}
}

func printable(s string, max int) string {
	var b strings.Builder
	for _, r := range s {
		if b.Len() >= max {
			break
		}
		if r >= 0x20 && r < 0x7f {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// isProxyRefusal reports whether resp, read over a forwarding connection to a proxy, is the
// proxy's own refusal rather than the origin's answer: a 407, or an error page squid wrote.
func isProxyRefusal(resp *http.Response) bool {
	return resp.StatusCode == http.StatusProxyAuthRequired || resp.Header.Get("X-Squid-Error") != ""
}

// DialForward dials for a plain-HTTP request to addr: a connection to a proxy, on which the
// request goes in absolute form, or a direct one.
func (d *Dialer) dialForward(ctx context.Context, _, addr string) (net.Conn, error) {
	list, target, err := d.plan(ctx, "http", addr)
	if err != nil {
		return nil, err
	}
	if len(list) == 0 {
		return d.dialDirect(ctx, "tcp", addr)
	}
	return d.dialProxied(ctx, list, addr, target, true)
}

// write sends req to the proxy in absolute form, naming f.target, with the proxy's
// Authorization and the origin's name in Host.
func (f *forward) write(w io.Writer, req *http.Request) error {
	r := *req
	u := *req.URL
	if r.Host == "" {
		r.Host = u.Host
	}
	u.Host = f.target
	r.URL = &u
	r.Header = req.Header.Clone()
	if r.Header == nil {
		r.Header = http.Header{}
	}
	r.Header.Del("Proxy-Authorization")
	if f.auth != "" {
		r.Header.Set("Proxy-Authorization", f.auth)
	}
	return r.WriteProxy(w)
}
