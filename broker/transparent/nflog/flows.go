package nflog

import (
	"net/netip"
	"time"
)

// Window is how long a flow is reported once: a QUIC client retrying, or a stream of
// datagrams, makes one audit event per Window, not one per packet.
const Window = 10 * time.Second

// maxFlows bounds the flows remembered at once (a scan of many ports or addresses): past it,
// expired flows are forgotten, and when none has expired, everything is, so a flood costs at
// most one event per flow per Window and bounded memory.
const maxFlows = 1 << 14

type flowKey struct {
	proto    string
	src, dst netip.AddrPort
}

// Flows says which packets start a flow worth reporting: the first of its 5-tuple (protocol,
// addresses, ports) in Window. Not safe for concurrent use.
type Flows struct {
	seen map[flowKey]time.Time
}

// First reports whether p is the first packet of its flow since Window before now.
func (f *Flows) First(p Packet, now time.Time) bool {
	if f.seen == nil {
		f.seen = map[flowKey]time.Time{}
	}
	k := flowKey{p.Proto, p.Source, p.Dest}
	if t, ok := f.seen[k]; ok && now.Sub(t) < Window {
		return false
	}
	if len(f.seen) >= maxFlows {
		for k, t := range f.seen {
			if now.Sub(t) >= Window {
				delete(f.seen, k)
			}
		}
		if len(f.seen) >= maxFlows {
			clear(f.seen)
		}
	}
	f.seen[k] = now
	return true
}
