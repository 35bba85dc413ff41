package broker

import (
	"net/netip"
	"strings"
	"time"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/policy"
)

// Flow is traffic of the sandbox's that the broker refuses without an HTTP exchange: a
// redirected connection to a port it does not serve or in a protocol it does not speak, or a
// packet the sandbox's rules refused and logged (UDP, QUIC among it).
type Flow struct {
	Proto  string // "tcp" or "udp"
	Source netip.AddrPort
	Dest   netip.AddrPort
	// Host names the destination when it is known (a TLS server name); else the audit event
	// names the name the resolver answered the pool address for, or the address.
	Host string
	// Forged is set when the rules dropped the packet for its source address: the address
	// names no agent then, whoever it belongs to.
	Forged bool
}

// RefuseFlow writes the audit event of a refused flow (decision deny, mode transparent,
// phase connect, method and scheme the protocol), naming the agent when the source address
// identifies one.
func (b *Broker) RefuseFlow(f Flow, reason string) {
	g := b.gen.Load()
	host := f.Host
	if host == "" {
		host = f.Dest.Addr().Unmap().String()
		if name, ok := b.names.Name(f.Dest.Addr()); ok {
			host = name // a pool address the resolver answered for this name
		}
	}
	ev := audit.Event{
		RequestID:  newRequestID(),
		SourceIP:   f.Source.Addr().Unmap().String(),
		Phase:      policy.PhaseConnect,
		Method:     strings.ToUpper(f.Proto),
		Scheme:     f.Proto,
		Host:       host,
		Port:       int(f.Dest.Port()),
		Decision:   audit.Deny,
		Reason:     reason,
		Start:      time.Now(),
		Mode:       audit.ModeTransparent,
		PolicyMode: g.mode,
	}
	if a, err := g.agents.Identify("", f.Source.Addr().Unmap()); err == nil && !f.Forged {
		ev.Agent = a.ID
	}
	b.metrics.requests.WithLabelValues(ev.Phase, audit.Deny).Inc()
	b.audit.Write(&ev)
}
