package broker

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/identity"
	"github.com/capbroker/capbroker/broker/inject"
	"github.com/capbroker/capbroker/broker/llm"
	"github.com/capbroker/capbroker/broker/upstream"
)

// generation is everything the broker serves with that comes from one config: who the agents
// are, which credentials exist and where they may go, where their values come from, how
// upstreams are reached, the policy mode. It is immutable; a reload builds a new one and the
// broker swaps it in atomically (Broker.Reload).
//
// Each exchange takes the current generation once, when it begins, and uses it to the end, so
// a request in flight during a reload finishes under the config it started with: its agent,
// its credential values (the old store), its upstream client. A tunnel is served request by
// request, each taking the then-current generation; the identity its CONNECT proved is checked
// again under a newer generation (tunnel.reidentify), so a token removed by a reload stops
// working in tunnels that are already open too.
type generation struct {
	mode       string
	auditInput audit.Level
	// maxPolicyBody is the largest JSON request body the policy sees (policy.max_body_bytes);
	// bodies bounds the bytes of bodies each agent holds for it.
	maxPolicyBody int64
	bodies        *bodyBudget
	agents        *identity.Identifier
	bindings      *inject.Set
	// known is the broker's registry of the secret values it has sent, shared by every
	// generation: what a response is scrubbed of does not depend on the config it is served
	// with (see inject.Known).
	known     *inject.Known
	secrets   Secrets
	derived   Derivers // the minters and signers among secrets
	transport upstreamClient
	dialer    *upstream.Dialer
	// transparentPorts are the destination ports redirected connections may go to.
	transparentPorts []int
	// llm recognises the LLM APIs metered (llm.openai_compatible).
	llm *llm.Endpoints
	// graphql are the GraphQL endpoints (protocols.graphql), whose requests the policy sees
	// as input.graphql.
	graphql []config.ProtocolEndpoint
	// protocols are the endpoints whose meaning the policy sees (broker/mcp.go).
	protocols config.Protocols

	// upstream is what transport and dialer were built from: a new generation keeps them
	// (and their pools of connections) when it has not changed.
	upstream upstreamKey
}

// upstreamKey is the part of a config the upstream client is built from, with the content of
// upstream.ca_file: a CA file rewritten in place is a change.
type upstreamKey struct {
	caFile            string
	caPEM             []byte
	allowPrivate      []netip.Prefix
	perHost, maxConns int
}

func (k upstreamKey) equal(o upstreamKey) bool {
	return k.caFile == o.caFile && bytes.Equal(k.caPEM, o.caPEM) && slices.Equal(k.allowPrivate, o.allowPrivate) &&
		k.perHost == o.perHost && k.maxConns == o.maxConns
}

// newGeneration builds a generation from a validated config. prev, when not nil, is the one it
// replaces: its upstream client is kept if the upstream settings are the same.
func newGeneration(cfg *config.Config, secrets Secrets, known *inject.Known, self []netip.AddrPort, prev *generation) (*generation, error) {
	if secrets == nil {
		return nil, errors.New("broker: Secrets is required")
	}
	agents, err := identity.New(cfg.Agents)
	if err != nil {
		return nil, err
	}
	key := upstreamKey{caFile: cfg.Upstream.CAFile, perHost: cfg.Proxy.MaxConnectionsPerAgent, maxConns: cfg.Proxy.MaxConnections}
	for i, s := range cfg.Upstream.AllowPrivate {
		p, err := config.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("upstream.allow_private[%d]: %w", i, err)
		}
		key.allowPrivate = append(key.allowPrivate, p)
	}
	if key.caFile != "" {
		if key.caPEM, err = os.ReadFile(key.caFile); err != nil {
			return nil, fmt.Errorf("upstream.ca_file: %w", err)
		}
	}
	g := &generation{
		mode:       cfg.Policy.Mode,
		auditInput: cfg.Audit.IncludeInput,
		agents:     agents,
		bindings:   inject.NewSet(cfg.Credentials),
		llm:        llm.NewEndpoints(cfg.LLM),
		graphql:    cfg.Protocols.GraphQL,
		protocols:  cfg.Protocols,
		known:      known,
		secrets:    secrets,
		upstream:   key,
		derived:    staticOnly{},

		maxPolicyBody: cfg.Policy.MaxBodyBytes,
		bodies:        newBodyBudget(cfg.Policy.MaxBodyBytes),
	}
	g.transparentPorts = cfg.Transparent.Ports
	if d, ok := secrets.(Derivers); ok {
		g.derived = d
	}
	proxyOpts, err := proxyOptions(cfg.Upstream.Proxy, secrets)
	if err != nil {
		return nil, err
	}
	// With upstream proxies the client is made anew: its proxies' passwords are read from
	// this generation's secrets.
	if prev != nil && prev.upstream.equal(key) && proxyOpts == nil && prev.dialer != nil && !prev.dialer.Chains() {
		g.transport, g.dialer = prev.transport, prev.dialer
		return g, nil
	}
	tr, dialer, err := upstream.New(upstream.Options{
		CAFile: key.caFile, AllowPrivate: key.allowPrivate, Deny: self,
		// Pools as deep as the concurrency the proxy admits, so requests reuse upstream connections.
		MaxIdleConnsPerHost: key.perHost,
		MaxIdleConns:        key.maxConns,
		Proxy:               proxyOpts,
	})
	if err != nil {
		return nil, err
	}
	if err := loadPAC(cfg.Upstream.Proxy, key.caFile, dialer); err != nil {
		return nil, err
	}
	g.transport, g.dialer = tr, dialer
	return g, nil
}

// Reload makes cfg, with secrets as its credential store, the config every exchange that
// begins from now on is served with. Exchanges already running finish with the generation
// they began with. cfg must be validated; an error (an agent's token that cannot be read, an
// unreadable upstream.ca_file) leaves the running config in place.
//
// What cannot change without a restart (listener addresses, the CA, the policy source, the
// audit destination) is the caller's to detect: Reload ignores those keys.
func (b *Broker) Reload(cfg *config.Config, secrets Secrets) error {
	b.reloadMu.Lock()
	defer b.reloadMu.Unlock()
	prev := b.gen.Load()
	g, err := newGeneration(cfg, secrets, prev.known, b.self, prev)
	if err != nil {
		return err
	}
	b.admission.setLimits(cfg.Proxy.MaxConnections, cfg.Proxy.MaxConnectionsPerAgent, cfg.Proxy.MaxRequestsPerAgent)
	b.gen.Store(g)
	b.metrics.configure(cfg)
	if g.transport != prev.transport {
		// Requests still running on the old client keep their connections; the idle ones
		// would never be used again.
		prev.transport.CloseIdleConnections()
	}
	return nil
}
