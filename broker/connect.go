package broker

import (
	"context"
	"fmt"
	"github.com/capbroker/capbroker/broker/upstream"
	"net"
	"net/http"
	"net/netip"
	"sync"

	"github.com/elazarl/goproxy"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/identity"
	"github.com/capbroker/capbroker/broker/policy"
)

// tunnel is what a CONNECT established: who asked, and where to. Every request read from an
// intercepted tunnel is served with it (see intercept).
type tunnel struct {
	agent  identity.Agent
	target target
	// sniMismatch is the TLS server name the agent sent when it is not the CONNECT host.
	// Set during the handshake, before any request is read.
	sniMismatch string
	// gen is the config the CONNECT was decided under, and proxyAuth and source what
	// identified the agent then: a request served under a newer config identifies the agent
	// again with them (reidentify). proxyAuth is never logged.
	gen       *generation
	proxyAuth string
	source    netip.Addr
	// mode is how the tunnel's connection came: audit.ModeExplicit (a CONNECT) or
	// audit.ModeTransparent (a redirected connection). Its requests carry it.
	mode string
	// prepare, set by interceptConn, has the agent's TLS handshake dial the upstream ahead
	// of its first request (not a refused redirected connection's).
	prepare bool
}

// reidentify returns the tunnel's agent as g knows it. Under the generation of the CONNECT
// that is the agent the CONNECT identified; under a newer one (a reload), the same proxy
// credentials or source address must still identify the same agent id, whose labels are
// then the new ones. A tunnel whose agent was removed, or whose token changed, serves no more
// requests: its agent must connect again with the new token.
func (t *tunnel) reidentify(g *generation) (identity.Agent, error) {
	if g == t.gen {
		return t.agent, nil
	}
	a, err := g.agents.Identify(t.proxyAuth, t.source)
	if err != nil || a.ID != t.agent.ID {
		return identity.Agent{}, denial{fmt.Sprintf("agent %q is no longer configured with the credentials this tunnel was opened with (config reloaded); connect again", t.agent.ID)}
	}
	return a, nil
}

// handleConnect decides a CONNECT that net/http's server read (goproxy's handler: one sent
// after another request on a kept-alive connection; the front reads every connection's first
// request, see front.go): refuse (403/407 before any TLS), intercept, or tunnel.
func (b *Broker) handleConnect(host string, ctx *goproxy.ProxyCtx) (*goproxy.ConnectAction, string) {
	r := ctx.Req
	x := b.begin(policy.PhaseConnect, r)
	open, err := b.connect(x, r)
	if err != nil {
		ctx.Resp = x.fail(r, err)
		return &goproxy.ConnectAction{Action: goproxy.ConnectReject}, host
	}
	return &goproxy.ConnectAction{
		Action: goproxy.ConnectHijack,
		Hijack: func(_ *http.Request, client net.Conn, _ *goproxy.ProxyCtx) { open(client) },
	}, host
}

// connectEstablished is a CONNECT's answer once its tunnel is open: one write, no copy.
var connectEstablished = []byte("HTTP/1.1 200 Connection established\r\n\r\n")

// connect decides the CONNECT r. An error is refused (x.fail); otherwise the function returned
// serves the tunnel on the agent's connection, once the server has let go of it: intercepted,
// or piped opaquely.
func (b *Broker) connect(x *exchange, r *http.Request) (func(client net.Conn), error) {
	// The target is recorded before the agent is identified: a 407's event names where the
	// agent was going.
	host, port, splitErr := splitHost(r.Host, 443)
	if splitErr == nil {
		x.ev.Host, x.ev.Port = host, port
	}
	proxyAuth, err := proxyAuthorization(r)
	if err != nil {
		return nil, err
	}
	agent, err := x.g.agents.Identify(proxyAuth, sourceAddr(r))
	if err != nil {
		return nil, err
	}
	x.identify(agent)
	conn, err := claimConn(r.Context(), agent.ID)
	if err != nil {
		return nil, err
	}
	if splitErr != nil {
		return nil, fmt.Errorf("%w: %v", errBadRequest, splitErr)
	}
	t := newTarget("https", host, port)

	d, err := b.connectDecision(x, r, agent, host, port)
	if err != nil {
		return nil, err
	}

	if d.Intercept || x.ev.WouldDeny {
		if err := b.checkCA(); err != nil {
			return nil, err
		}
		x.ev.Status = http.StatusOK
		x.finish()
		tun := &tunnel{agent: agent, target: t, gen: x.g, proxyAuth: proxyAuth, source: sourceAddr(r), mode: audit.ModeExplicit}
		// The tunnel keeps the slot its connection was charged to, until it ends.
		return func(client net.Conn) { b.intercept(client, tun, conn.release) }, nil
	}
	return func(client net.Conn) {
		defer conn.release()
		b.pipe(x, r, client, t)
	}, nil
}

// connectDecision decides whether agent may open a tunnel to host:port (a CONNECT, or a
// redirected connection in transparent mode: x.ev.Mode says which): the policy's connect
// phase, a person when it asks, and the decision applied (authorize).
func (b *Broker) connectDecision(x *exchange, r *http.Request, agent identity.Agent, host string, port int) (policy.Decision, error) {
	in := connectInput(x.g, agent, x.ev.SourceIP, x.ev.Mode, host, port)
	policySpan := x.step("policy")
	d, err := b.policy.Decide(r.Context(), in)
	policySpan.Finish()
	if err == nil && d.Ask != nil {
		d, err = b.ask(x, r, in, d, nil, &policyBody{}) // before any TLS
	}
	if err == nil && opaqueWithCredentials(d) {
		d.Allow, d.Reason = false, "credentials cannot be injected into an opaque tunnel (intercept: false)"
	}
	_, err = b.authorize(x, in, d, err)
	return d, err
}

// connectInput is the policy input of the connect phase, of a CONNECT, a redirected
// connection, or a name the sandbox's resolver is asked for: the agent, host and port, and the
// credentials bound to the host.
func connectInput(g *generation, agent identity.Agent, source, mode, host string, port int) *policy.Input {
	return &policy.Input{
		Phase:       policy.PhaseConnect,
		AgentID:     agent.ID,
		Labels:      agent.Labels,
		SourceIP:    source,
		Mode:        mode,
		Method:      http.MethodConnect,
		Host:        host,
		Port:        port,
		Credentials: g.bindings.Matching(host),
	}
}

// opaqueWithCredentials reports an allowed opaque tunnel granted credentials, which the
// broker refuses: nothing could be injected into it.
func opaqueWithCredentials(d policy.Decision) bool {
	return d.Allow && !d.Intercept && len(d.Credentials) > 0
}

// pipe is an opaque tunnel: bytes are copied both ways, uninspected, to the checked address.
// Its audit event is written when both directions have ended.
func (b *Broker) pipe(x *exchange, req *http.Request, client net.Conn, t target) {
	b.pipeConn(x, req, client, t, true)
}

// pipeConn is pipe; greet false leaves out the 200 line and the refusal a failed dial would
// get (a redirected connection, in transparent mode, did not ask for a tunnel).
func (b *Broker) pipeConn(x *exchange, req *http.Request, client net.Conn, t target, greet bool) {
	defer client.Close()
	ctx := context.Background()
	if x.route != nil {
		ctx = upstream.WithRoute(ctx, x.route)
	}
	up, err := x.g.dialer.DialContext(ctx, "tcp", t.hostPort())
	if err != nil {
		resp := x.fail(req, fmt.Errorf("tunnel dial: %w", err))
		if greet {
			_ = resp.Write(client)
		}
		return
	}
	defer up.Close()
	b.metrics.tunnelOpened()
	defer b.metrics.tunnelClosed()
	x.ev.Status = http.StatusOK
	if greet {
		if _, err := client.Write(connectEstablished); err != nil {
			x.finish()
			return
		}
	}
	var wg sync.WaitGroup
	clock, agent := newIdleClock(tunnelIdleTimeout), tunnelSide(client)
	wg.Add(2)
	go func() { defer wg.Done(); copyHalf(up, agent, &x.bytesIn, clock) }()
	go func() { defer wg.Done(); copyHalf(agent, up, &x.bytesOut, clock) }()
	wg.Wait()
	x.finish()
}

// proxyAuthorization is the Proxy-Authorization the agent is identified by. Given more than
// once (several field lines, or names differing only in letter case) it is ambiguous: the
// broker would pick one and a proxy before it may have picked another. It is refused, 400
// ambiguous_request, before any of them is tried.
func proxyAuthorization(r *http.Request) (string, error) {
	switch vs := r.Header["Proxy-Authorization"]; len(vs) {
	case 0:
		return "", nil
	case 1:
		return vs[0], nil
	}
	return "", ambiguous{"Proxy-Authorization is given more than once; the agent would be identified by one of them"}
}
