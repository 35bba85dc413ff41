package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dop251/goja"
	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/sync/singleflight"
)

// Route is one way out: through the configured proxy named Proxy, or direct
// when Proxy == "".
type Route struct{ Proxy string }

// Errors a PAC evaluation wraps; every one means "apply the fallback".
var (
	ErrPACTimeout      = errors.New("pac: evaluation timed out")
	ErrPACScript       = errors.New("pac: script failed")
	ErrPACResult       = errors.New("pac: unusable result")
	ErrPACUnconfigured = errors.New("pac: result names a proxy that is not configured")
)

const (
	defaultPACTimeout = 100 * time.Millisecond
	pacCacheSize      = 4096
	pacCacheTTL       = 5 * time.Minute
	pacMaxCallStack   = 512
	pacMaxResultLen   = 4096
)

// PACOptions configure a PAC script's evaluation.
type PACOptions struct {
	// Timeout bounds one evaluation of FindProxyForURL; default 100ms.
	Timeout time.Duration
	// Proxies maps "host:port" as the script writes it (after PROXY,
	// HTTP or HTTPS) to the name of a configured proxy. A result naming
	// any other proxy is an error: an unconfigured proxy is never dialled.
	Proxies map[string]string
	// Resolve backs dnsResolve, isResolvable and isInNet for names. Nil:
	// the script gets no DNS (dnsResolve returns null, the others false).
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// MyIP is what myIpAddress() returns; unset: 127.0.0.1.
	MyIP netip.Addr
}

// PAC evaluates a proxy auto-config script. It is safe for concurrent use:
// each evaluation borrows a runtime of its own from a bounded pool.
type PAC struct {
	prog    *goja.Program
	timeout time.Duration
	proxies map[string]string // lower-case host:port -> name
	resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	myIP    string
	now     func() time.Time // tests replace it

	cache *lru.Cache[string, cachedRoutes]
	group singleflight.Group

	// The pool: slots bounds the runtimes in use or idle; a runtime is
	// taken only with a slot held, and an interrupted one is dropped.
	slots chan struct{}
	mu    sync.Mutex
	idle  []*pacVM
}

type cachedRoutes struct {
	routes  []Route
	expires time.Time
}

// pacVM is one runtime with the script loaded. ctx is the context of the
// evaluation under way, read by the DNS helpers.
type pacVM struct {
	rt  *goja.Runtime
	fn  goja.Callable
	ctx context.Context
}

// NewPAC compiles script and checks that it defines FindProxyForURL.
func NewPAC(script []byte, opts PACOptions) (*PAC, error) {
	prog, err := goja.Compile("pac", string(script), false)
	if err != nil {
		return nil, fmt.Errorf("pac: compile: %w", err)
	}
	p := &PAC{
		prog:    prog,
		timeout: opts.Timeout,
		proxies: make(map[string]string, len(opts.Proxies)),
		resolve: opts.Resolve,
		myIP:    "127.0.0.1",
		now:     time.Now,
		slots:   make(chan struct{}, max(2, runtime.GOMAXPROCS(0))),
	}
	if p.timeout <= 0 {
		p.timeout = defaultPACTimeout
	}
	// A plain LRU with the expiry checked on read: expirable.LRU runs a
	// goroutine that never ends, one per PAC loaded.
	p.cache, _ = lru.New[string, cachedRoutes](pacCacheSize)
	if opts.MyIP.IsValid() {
		p.myIP = opts.MyIP.Unmap().String()
	}
	for hp, name := range opts.Proxies {
		if name == "" {
			return nil, fmt.Errorf("pac: proxies[%q]: empty proxy name", hp)
		}
		if h, port, err := net.SplitHostPort(hp); err != nil || h == "" || port == "" {
			return nil, fmt.Errorf("pac: proxies[%q]: not host:port as a PAC file writes it", hp)
		}
		p.proxies[strings.ToLower(hp)] = name
	}
	vm, err := p.newVM()
	if err != nil {
		return nil, err
	}
	p.idle = append(p.idle, vm)
	return p, nil
}

// newVM makes a runtime with the helpers installed and the script run.
// Loading the script is bounded by the timeout as an evaluation is.
func (p *PAC) newVM() (*pacVM, error) {
	rt := goja.New()
	rt.SetMaxCallStackSize(pacMaxCallStack)
	rt.SetTimeSource(func() time.Time { return p.now() })
	vm := &pacVM{rt: rt, ctx: context.Background()}
	if err := p.installHelpers(vm); err != nil {
		return nil, fmt.Errorf("pac: %w", err)
	}
	t := time.AfterFunc(p.timeout, func() { rt.Interrupt(ErrPACTimeout) })
	_, err := rt.RunProgram(p.prog)
	if !t.Stop() {
		return nil, fmt.Errorf("%w: loading the script", ErrPACTimeout)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: loading: %s", ErrPACScript, scriptError(err))
	}
	fn, ok := goja.AssertFunction(rt.Get("FindProxyForURL"))
	if !ok {
		return nil, fmt.Errorf("pac: the script defines no function FindProxyForURL")
	}
	vm.fn = fn
	return vm, nil
}

// get borrows a runtime: an idle one, else a new one.
func (p *PAC) get(ctx context.Context) (*pacVM, error) {
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		vm := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return vm, nil
	}
	p.mu.Unlock()
	vm, err := p.newVM()
	if err != nil {
		<-p.slots
		return nil, err
	}
	return vm, nil
}

// put returns a runtime to the pool.
func (p *PAC) put(vm *pacVM) {
	vm.ctx = context.Background()
	p.mu.Lock()
	p.idle = append(p.idle, vm)
	p.mu.Unlock()
	<-p.slots
}

// discard drops a runtime that an interrupt may have reached.
func (p *PAC) discard() { <-p.slots }

// Find returns the routes the script chooses for rawURL, in order. host is
// the destination's name (or address literal). The script sees only the
// URL's scheme and authority (scheme://host:port/): no path or query, which
// may carry secrets, reaches it. Results are cached per (scheme, host, port)
// for a few minutes; errors are not cached.
//
// SOCKS entries are skipped (the broker does not speak SOCKS), as a client
// skips a proxy it cannot use; a result left with no usable entry is an
// error. A proxy not in PACOptions.Proxies is an error, never dialled.
func (p *PAC) Find(ctx context.Context, rawURL, host string) ([]Route, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return nil, fmt.Errorf("pac: %q is not an absolute URL", rawURL)
	}
	// host is the agent's choice: the script only ever sees a DNS name
	// or an address literal, at most 253 bytes.
	host = normalizeHost(host)
	if _, err := netip.ParseAddr(host); err != nil && checkName(host) != nil {
		return nil, fmt.Errorf("pac: %s is not a host name or address", quoteShort(host))
	}
	scriptURL := strings.ToLower(u.Scheme) + "://" + strings.ToLower(u.Host) + "/"
	key := scriptURL + " " + host
	if c, ok := p.cache.Get(key); ok && p.now().Before(c.expires) {
		return slices.Clone(c.routes), nil
	}
	// Concurrent misses on one key share one evaluation; each caller still
	// waits only as long as its own ctx allows.
	ch := p.group.DoChan(key, func() (any, error) {
		routes, err := p.eval(context.WithoutCancel(ctx), scriptURL, host)
		if err == nil {
			p.cache.Add(key, cachedRoutes{routes, p.now().Add(pacCacheTTL)})
		}
		return routes, err
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		return slices.Clone(r.Val.([]Route)), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// eval runs FindProxyForURL once on a pooled runtime, bounded by p.timeout.
func (p *PAC) eval(ctx context.Context, scriptURL, host string) ([]Route, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	vm, err := p.get(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: waiting for a runtime", ErrPACTimeout)
		}
		return nil, err
	}
	vm.ctx = ctx
	stop := context.AfterFunc(ctx, func() { vm.rt.Interrupt(ErrPACTimeout) })
	v, err := p.call(vm, scriptURL, host)
	if !stop() {
		// The interrupt fired (or is firing): the runtime may be left
		// interrupted mid-way; never reuse it.
		p.discard()
		return nil, fmt.Errorf("%w after %v", ErrPACTimeout, p.timeout)
	}
	if ctx.Err() != nil {
		// The time ran out before the interrupt could fire: a resolver cut
		// short made dnsResolve answer null, so the result is not the one
		// the script would give. The operator's fallback decides instead.
		p.put(vm)
		return nil, fmt.Errorf("%w after %v", ErrPACTimeout, p.timeout)
	}
	if errors.Is(err, errPACPanic) {
		p.discard()
		return nil, fmt.Errorf("%w: %w", ErrPACScript, err)
	}
	if err != nil {
		// A throw leaves the runtime usable: the script's globals are as
		// the throwing call left them, as in a browser.
		p.put(vm)
		return nil, fmt.Errorf("%w: %s", ErrPACScript, scriptError(err))
	}
	p.put(vm)
	s, ok := v.Export().(string)
	if !ok {
		return nil, fmt.Errorf("%w: FindProxyForURL returned %s, not a string", ErrPACResult, typeName(v))
	}
	return p.parseResult(s)
}

var errPACPanic = errors.New("pac: evaluation panicked")

// call runs FindProxyForURL, turning a panic (from a Resolve function, say)
// into an error: the runtime is then discarded.
func (p *PAC) call(vm *pacVM, scriptURL, host string) (v goja.Value, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = errPACPanic
		}
	}()
	return vm.fn(goja.Undefined(), vm.rt.ToValue(scriptURL), vm.rt.ToValue(host))
}

// parseResult turns "PROXY a:1; HTTPS b:2; DIRECT" into routes, in order,
// without duplicates.
func (p *PAC) parseResult(s string) ([]Route, error) {
	if len(s) > pacMaxResultLen {
		return nil, fmt.Errorf("%w: result longer than %d bytes", ErrPACResult, pacMaxResultLen)
	}
	var routes []Route
	seen := make(map[string]bool)
	skipped := 0
	for item := range strings.SplitSeq(s, ";") {
		fields := strings.Fields(item)
		if len(fields) == 0 {
			continue
		}
		var r Route
		switch kw := strings.ToUpper(fields[0]); kw {
		case "DIRECT":
			if len(fields) != 1 {
				return nil, fmt.Errorf("%w: DIRECT takes no argument", ErrPACResult)
			}
		case "PROXY", "HTTP", "HTTPS":
			if len(fields) != 2 {
				return nil, fmt.Errorf("%w: %s needs one host:port", ErrPACResult, kw)
			}
			name, ok := p.proxies[strings.ToLower(fields[1])]
			if !ok {
				return nil, fmt.Errorf("%w: %s %s", ErrPACUnconfigured, kw, quoteShort(fields[1]))
			}
			r.Proxy = name
		case "SOCKS", "SOCKS4", "SOCKS5":
			skipped++
			continue
		default:
			return nil, fmt.Errorf("%w: unknown entry %s", ErrPACResult, quoteShort(fields[0]))
		}
		if !seen[r.Proxy] {
			seen[r.Proxy] = true
			routes = append(routes, r)
		}
	}
	if len(routes) == 0 {
		if skipped > 0 {
			return nil, fmt.Errorf("%w: only SOCKS entries, which are not supported", ErrPACResult)
		}
		return nil, fmt.Errorf("%w: empty result", ErrPACResult)
	}
	return routes, nil
}

func quoteShort(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return fmt.Sprintf("%q", s)
}

func typeName(v goja.Value) string {
	if v == nil || goja.IsUndefined(v) {
		return "undefined"
	}
	if goja.IsNull(v) {
		return "null"
	}
	return v.ExportType().String()
}

// scriptError keeps a script error's message short: the script's own
// exception text and where it was thrown.
func scriptError(err error) string {
	var ex *goja.Exception
	if errors.As(err, &ex) {
		msg := ex.Value().String()
		if len(msg) > 200 {
			msg = msg[:200] + "..."
		}
		return msg
	}
	var ie *goja.InterruptedError
	if errors.As(err, &ie) {
		return "interrupted"
	}
	s := err.Error()
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}
