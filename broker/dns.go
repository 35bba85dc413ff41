package broker

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/broker/transparent"
	sandboxdns "github.com/capbroker/capbroker/broker/transparent/dns"
)

// PhaseDNS is the audit phase of the sandbox resolver's events.
const PhaseDNS = "dns"

// ReasonNoAgentAddress is why a query from an address no agent has is refused.
const ReasonNoAgentAddress = "no agent is configured with this source address"

// StartResolver serves the sandbox's resolver (transparent.dns) on l's sockets, answering
// names with the addresses the transparent listener maps back. Close the server to stop it.
func (b *Broker) StartResolver(l *sandboxdns.Listener, t config.Transparent) *sandboxdns.Server {
	s := sandboxdns.Serve(l, sandboxdns.Options{
		Policy:           resolverPolicy{b: b},
		Names:            b.names,
		TTL:              t.DNS.TTL,
		QueriesPerSecond: t.DNS.QueriesPerSecond,
		HostNames:        ownHostNames(),
		Log:              b.log,
	})
	b.log.Info().Str("dns", l.Addr().String()).Msg("resolver listening")
	return s
}

// ownHostNames are the host name of the broker's machine, as the sandbox's own name: a
// sandbox in a network namespace, or a container beside the broker in a pod, shares the
// broker's UTS namespace, and so its host name.
func ownHostNames() []string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return nil
	}
	return []string{transparent.Canonical(h)}
}

// resolverPolicy is the broker's side of the resolver: whether a name could be allowed, and
// the audit events.
type resolverPolicy struct {
	b *Broker
}

var _ sandboxdns.Policy = resolverPolicy{}

// Decide identifies the agent by the query's source address and asks the policy the
// connect-phase question a redirected connection to the name would ask (input.source.mode
// "transparent", method CONNECT), for each port the transparent listener serves (of the
// config being served, as the listener reads them): the name
// is answered when any of them is allowed or asked about. In monitor mode a denied name is
// answered too (WouldDeny).
func (p resolverPolicy) Decide(ctx context.Context, q sandboxdns.Query) sandboxdns.Verdict {
	g := p.b.gen.Load()
	agent, err := g.agents.Identify("", q.Source)
	if err != nil {
		return sandboxdns.Verdict{Reason: ReasonNoAgentAddress}
	}
	v := sandboxdns.Verdict{Agent: agent.ID}
	ports := g.transparentPorts // transparent.ports, defaulted when the resolver is configured
	for _, port := range ports {
		d, err := p.b.policy.Decide(ctx, connectInput(g, agent, q.Source.String(), audit.ModeTransparent, q.Name, port))
		if err != nil {
			p.b.log.Warn().Err(err).Str("agent", agent.ID).Str("host", q.Name).Msg("resolver: policy evaluation failed")
			if v.Reason == "" {
				v.Reason = "the policy could not be evaluated"
			}
			continue
		}
		v.Revision, v.DecisionID = d.Revision, d.ID
		if (d.Allow && !opaqueWithCredentials(d)) || d.Ask != nil {
			v.Allow, v.Reason = true, d.Reason
			return v
		}
		if v.Reason == "" || port == ports[0] {
			v.Reason = d.Reason
		}
	}
	if v.Reason == "" {
		v.Reason = policy.ReasonNoAllow
	}
	if g.mode == config.ModeMonitor {
		v.Allow, v.WouldDeny = true, true
	}
	return v
}

// Audit writes the event of a refused query, or of a name's answer.
func (p resolverPolicy) Audit(e sandboxdns.Event) {
	g := p.b.gen.Load()
	agent := e.Agent
	if agent == "" {
		if a, err := g.agents.Identify("", e.Source); err == nil {
			agent = a.ID
		}
	}
	decision := audit.Deny
	if e.Allow {
		decision = audit.Allow
	}
	reason := e.Reason
	if reason == "" && !e.Allow {
		reason = fmt.Sprintf("refused by the resolver (%s)", e.Proto)
	}
	ev := audit.Event{
		RequestID:      newRequestID(),
		Agent:          agent,
		SourceIP:       e.Source.String(),
		Phase:          PhaseDNS,
		Method:         e.Type,
		Scheme:         "dns",
		Host:           e.Name,
		Port:           53,
		Decision:       decision,
		Reason:         reason,
		Start:          time.Now(),
		Mode:           audit.ModeTransparent,
		PolicyMode:     g.mode,
		WouldDeny:      e.WouldDeny,
		PolicyRevision: e.Revision,
		DecisionID:     e.DecisionID,
	}
	p.b.metrics.requests.WithLabelValues(PhaseDNS, decision).Add(float64(max(e.Count, 1)))
	p.b.audit.Write(&ev)
}
