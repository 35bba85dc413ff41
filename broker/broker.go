// Package broker is the request pipeline: listener and MITM (goproxy) -> identity -> policy
// decision -> credential injection -> upstream -> response scrubbing -> audit.
package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elazarl/goproxy"
	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker/approvals"
	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/budget"
	"github.com/capbroker/capbroker/broker/certs"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/identity"
	"github.com/capbroker/capbroker/broker/inject"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/broker/rpc"
	"github.com/capbroker/capbroker/broker/transparent"
	"github.com/capbroker/capbroker/broker/upstream"
	"github.com/capbroker/capbroker/broker/usage"
	"github.com/capbroker/capbroker/credentials"
)

// Decider decides one request. *policy.Engine implements it.
type Decider interface {
	Decide(ctx context.Context, in *policy.Input) (policy.Decision, error)
}

// upstreamClient sends requests upstream. *upstream.Client implements it.
type upstreamClient interface {
	// RoundTrip sends the request over a connection of pool (see poolFor); connections are
	// never shared between pools.
	RoundTrip(req *http.Request, pool upstream.Pool) (*http.Response, error)
	// Prepare dials the https address (host:port) ahead of a request, when no connection that
	// has carried none is waiting; the first request of any pool claims it. http1: for an
	// agent that speaks HTTP/1.1, offering only http/1.1 (see upstream.WithHTTP1).
	Prepare(addr string, http1 bool)
	CloseIdleConnections()
}

// Secrets returns credential values by name. *credentials.Store implements it.
type Secrets interface {
	Get(ctx context.Context, name string) (credentials.Secret, error)
	// Known returns, without reading the source, the values of the credential it holds (the
	// current one and those a rotation replaced recently). They join the registry of known
	// secrets (Deps.Known) as soon as a response from a host they are bound to is scrubbed,
	// before any is sent: the upstream that issued a key may show it without being sent it.
	Known(name string) []credentials.Secret
}

var (
	_ Decider = (*policy.Engine)(nil)
	_ Secrets = (*credentials.Store)(nil)
)

// Deps are the broker's collaborators, built by the caller.
type Deps struct {
	Policy  Decider
	Secrets Secrets
	CA      *certs.CA
	Audit   *audit.Logger
	Metrics *Metrics
	Log     zerolog.Logger
	// Self lists the broker's own listeners and its Vault: never dialled for an agent.
	Self []netip.AddrPort
	// Approvals holds the requests a decision asks a person about; nil refuses them.
	Approvals *approvals.Queue
	// Budgets checks requests against the policy's budgets (broker/budget); nil: none.
	Budgets *budget.Budgets
	// Recorder is given the usage of each metered LLM call (broker/llm) and prices it; nil
	// meters for the audit event and metrics alone, at cost 0.
	Recorder usage.Recorder
	// Known is the registry of the secret values the broker sends, for the whole process:
	// responses are scrubbed of them across reloads, and minters ask it for room before
	// minting (inject.Known). Nil: a registry with the default bounds.
	Known *inject.Known
	// Tracer makes the spans of each request (broker/tracing.go); nil: none.
	Tracer Tracer
	// MCPSessions remembers which agent each MCP session was issued to; nil: this broker's
	// memory. A fleet shares them (rpc.SharedSessions).
	MCPSessions MCPSessions
	// DrainHold, when set, keeps the requests held for approval this long into a drain (to
	// be decided, from any replica of a fleet) before they are answered approval_interrupted.
	DrainHold time.Duration
	// Caps, when set, cap each agent's requests per second and connections across a fleet
	// (budget.Caps).
	Caps *budget.Caps
}

// Limits of the agent-facing side.
const (
	maxHeaderBytes    = 64 << 10
	readHeaderTimeout = 10 * time.Second
	idleTimeout       = 90 * time.Second
	// maxSmallBody is the largest request body of known length read whole with its headers
	// (readSmallBody) and the largest POST form body checked for a method override.
	maxSmallBody  = 64 << 10
	certCacheSize = 10000
)

// Broker is the proxy. Create with New, serve with Serve.
type Broker struct {
	// gen is the config being served (see generation); Reload replaces it.
	gen      atomic.Pointer[generation]
	reloadMu sync.Mutex // serialises Reload
	self     []netip.AddrPort

	policy    Decider
	certs     *certs.Cache
	mitmTLS   *tls.Config // the agent-facing TLS config of every intercepted tunnel
	audit     *audit.Logger
	metrics   *Metrics
	log       zerolog.Logger
	proxy     *goproxy.ProxyHttpServer
	admission *admission
	approvals *approvals.Queue
	budgets   *budget.Budgets
	recorder  usage.Recorder
	tracer    Tracer      // nil: requests are not traced
	sessions  MCPSessions // which agent each MCP session was issued to (broker/mcp.go)
	drainHold time.Duration
	// names maps the addresses the sandbox's resolver answered to their names (transparent
	// mode): shared by the resolver and the transparent listener.
	names *transparent.Names
	// sshDoor is the git-over-SSH front door redirected SSH connections go to (SetSSHDoor).
	sshDoor atomic.Pointer[sshDoorRef]
	// origDst and lookup are transparent.OriginalDst and the system resolver, unless a test
	// replaces them (see broker/transparent.go).
	origDst func(net.Conn) (netip.AddrPort, error)
	lookup  func(ctx context.Context, host string) ([]netip.Addr, error)
	// explicit is the explicit proxy's listener while Serve runs: a redirected connection
	// to its address is handed to it (see handOff).
	explicit atomic.Pointer[handoffListener]

	inflight sync.WaitGroup // requests in the pipeline, for draining
	// tunnels holds the server of every intercepted tunnel (a shutdowner: the *http.Server of
	// an HTTP/2 tunnel, the *http1.Conn of an HTTP/1.1 one), so that a drain waits for their
	// responses to end, not only for the pipeline to let go of them.
	tunnels  sync.Map
	draining atomic.Bool
}

// New builds the broker from a validated config.
func New(cfg *config.Config, deps Deps) (*Broker, error) {
	if deps.Policy == nil || deps.Secrets == nil || deps.CA == nil || deps.Audit == nil {
		return nil, errors.New("broker: Policy, Secrets, CA and Audit are required")
	}
	known := deps.Known
	if known == nil {
		known = inject.NewKnown(inject.KnownOptions{})
	}
	g, err := newGeneration(cfg, deps.Secrets, known, deps.Self, nil)
	if err != nil {
		return nil, err
	}
	m := deps.Metrics
	if m == nil {
		m = NewMetrics(nil)
	}
	b := &Broker{
		self:      deps.Self,
		policy:    deps.Policy,
		certs:     certs.NewCache(deps.CA, certCacheSize),
		audit:     deps.Audit,
		metrics:   m,
		log:       deps.Log,
		approvals: deps.Approvals,
		budgets:   deps.Budgets,
		recorder:  deps.Recorder,
		tracer:    deps.Tracer,
		sessions:  deps.MCPSessions,
		drainHold: deps.DrainHold,
		names:     transparent.NewNames(cfg.Transparent.DNS.Prefixes()),
		admission: newAdmission(cfg.Proxy.MaxConnections, cfg.Proxy.MaxConnectionsPerAgent, cfg.Proxy.MaxRequestsPerAgent),
	}
	if b.sessions == nil {
		b.sessions = localSessions{rpc.NewSessions(mcpSessionsMax)}
	}
	if deps.Caps != nil {
		b.admission.fleet = deps.Caps
	}
	b.gen.Store(g)
	b.mitmTLS = b.newMitmTLS()
	b.mitmTLS.CurvePreferences = cfg.TLS.Curves()
	m.configure(cfg)
	m.watch(b.certs.Len, b.audit.Lost, b.openTunnels, func() Secrets { return b.gen.Load().secrets })
	m.watchCA(deps.CA)
	m.proxyCheck.Store(&proxyChecker{b.checkProxies})
	b.proxy = b.newProxy()
	return b, nil
}

// newProxy configures goproxy with every unsafe default replaced: our transport (verified TLS,
// no proxy environment, checked dialer), our dialer for tunnels, our CA and certificate cache,
// and our handlers for every request and CONNECT.
func (b *Broker) newProxy() *goproxy.ProxyHttpServer {
	p := goproxy.NewProxyHttpServer()
	// p.Tr is never used: every request handler returns a response. It is a transport that
	// cannot dial, rather than goproxy's default.
	p.Tr = &http.Transport{Proxy: nil, DialContext: func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("broker: goproxy must not dial on its own")
	}}
	p.ConnectDial = nil
	p.ConnectDialWithReq = func(*http.Request, string, string) (net.Conn, error) {
		return nil, errors.New("broker: goproxy must not dial on its own") // every tunnel is ours
	}
	p.CertStore = nil
	p.Verbose = false
	p.Logger = goproxyLogger{b.log}
	p.KeepHeader = false
	p.AllowHTTP2 = false
	p.NonproxyHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "capbroker is a forward proxy: send absolute-form requests or CONNECT", http.StatusBadRequest)
	})
	p.OnRequest().HandleConnectFunc(b.handleConnect)
	p.OnRequest().DoFunc(b.handleRequest)
	return p
}

// Agents is the running config's agent identities, for the broker's other front doors: they
// follow reloads as the proxy does.
func (b *Broker) Agents() *identity.Identifier {
	return b.gen.Load().agents
}

// DialUpstream dials out as every upstream connection does, through the running config's one
// Dialer (destination checks, upstream.proxy): for the broker's other front doors (SSH).
func (b *Broker) DialUpstream(ctx context.Context, network, addr string) (net.Conn, error) {
	return b.gen.Load().dialer.DialContext(ctx, network, addr)
}

// Serve accepts agent connections on ln until ctx ends, then drains: it stops accepting,
// waits up to grace for requests in flight, and returns.
func (b *Broker) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	srv := &http.Server{
		Handler:           b.proxy,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          nil,
		TLSNextProto:      map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ConnContext:       withAdmitted,
	}
	errc := make(chan error, 1)
	if len(b.gen.Load().transparentPorts) > 0 {
		ln = b.acceptHandoffs(ln) // transparent mode: a connection redirected to ln is handed back
	}
	// The front reads each connection's first request: a CONNECT is served there, anything
	// else by srv.
	f := b.newFront(admittingListener{Listener: ln, a: b.admission})
	go func() { errc <- srv.Serve(f) }()
	select {
	case err := <-errc:
		_ = f.Close()
		return err
	case <-ctx.Done():
	}
	b.log.Info().Msg("draining requests in flight")
	if b.approvals != nil {
		// Held requests are answered now (a drain does not wait for a person), or, in a
		// fleet, after drainHold, in which any replica's console may still decide them.
		if b.drainHold <= 0 {
			b.approvals.Interrupt()
		} else {
			b.approvals.Close()
			stop := time.AfterFunc(min(b.drainHold, grace/2), b.approvals.Interrupt)
			defer func() {
				if stop.Stop() {
					b.approvals.Interrupt()
				}
			}()
		}
	}
	drainCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	_ = srv.Shutdown(drainCtx) // stops accepting; waits for non-hijacked connections
	f.wait(drainCtx)           // and for the CONNECTs the front is deciding
	b.draining.Store(true)
	done := make(chan struct{})
	go func() {
		// Each tunnel's server ends its idle connections and waits for its responses to
		// be written to the end (the last chunk is written after the pipeline is done).
		var tunnels sync.WaitGroup
		b.tunnels.Range(func(k, _ any) bool {
			tunnels.Go(func() { _ = k.(shutdowner).Shutdown(drainCtx) })
			return true
		})
		tunnels.Wait()
		b.inflight.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-drainCtx.Done():
		b.log.Warn().Msg("drain timed out with requests in flight")
	}
	b.gen.Load().transport.CloseIdleConnections()
	return nil
}

// goproxyLogger sends goproxy's own messages to the debug level: they may contain URLs.
type goproxyLogger struct{ log zerolog.Logger }

func (l goproxyLogger) Printf(format string, v ...any) { l.log.Debug().Msgf(format, v...) }
