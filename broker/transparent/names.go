// Package transparent serves the sandbox's connections that were redirected to the broker
// instead of asking it as a proxy (docs/transparent.md).
package transparent

import (
	"encoding/binary"
	"hash/fnv"
	"net/netip"
	"strings"
	"sync"
)

// Names is the table shared by the sandbox's resolver and the transparent listener: the
// resolver answers a name with an address from a pool that nothing is dialled on, and a
// connection redirected from that address names its destination by it. A name's address is
// derived from the name (a hash into the pool, probing past taken ones), so a broker started
// again gives the names it had answered the same addresses and a sandbox's cached answers
// stay good.
type Names struct {
	v4, v6 *pool
	mu     sync.Mutex
	byAddr map[netip.Addr]string
	byName map[string][2]netip.Addr // [0] IPv4, [1] IPv6
	order  []netip.Addr             // assignment order, for eviction
}

// maxNames bounds the table; past it the oldest assignments are forgotten (a connection to a
// forgotten address is checked as after a restart: see Matches).
const maxNames = 1 << 16

// maxProbe is how far past a name's hashed address Assign looks for a free one.
const maxProbe = 64

// NewNames returns the table over pools: the first IPv4 and the first IPv6 prefix are used.
func NewNames(pools []netip.Prefix) *Names {
	n := &Names{byAddr: map[netip.Addr]string{}, byName: map[string][2]netip.Addr{}}
	for _, p := range pools {
		p = p.Masked()
		if p.Addr().Is4() && n.v4 == nil {
			n.v4 = newPool(p)
		}
		if p.Addr().Is6() && n.v6 == nil {
			n.v6 = newPool(p)
		}
	}
	return n
}

// Canonical is name as the table keys it: lower case, without the root's trailing dot.
func Canonical(name string) string {
	return strings.TrimSuffix(strings.ToLower(name), ".")
}

// InPool reports whether a is in one of the pools: a connection to it was to a name the
// resolver answered (or to an address nothing else may be reached at).
func (n *Names) InPool(a netip.Addr) bool {
	a = a.Unmap()
	return (n.v4 != nil && n.v4.prefix.Contains(a)) || (n.v6 != nil && n.v6.prefix.Contains(a))
}

// Assign returns name's address in the IPv4 (v6 false) or IPv6 pool, assigning one if it
// has none; ok is false when there is no pool of that family or no free address near the
// name's hash.
func (n *Names) Assign(name string, v6 bool) (netip.Addr, bool) {
	name = Canonical(name)
	p, i := n.v4, 0
	if v6 {
		p, i = n.v6, 1
	}
	if p == nil {
		return netip.Addr{}, false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if a := n.byName[name][i]; a.IsValid() {
		return a, true
	}
	for k := 0; k < maxProbe; k++ {
		a := p.at(name, k)
		if owner, taken := n.byAddr[a]; !taken || owner == name {
			n.record(name, a, i)
			return a, true
		}
	}
	return netip.Addr{}, false
}

// Name returns the name a pool address was assigned to.
func (n *Names) Name(a netip.Addr) (string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	name, ok := n.byAddr[a.Unmap()]
	return name, ok
}

// Matches reports whether a connection to pool address a may be for name: a was assigned to
// name, or (after a restart, or once forgotten) a is free and is where Assign puts name first.
// The second case assigns it.
func (n *Names) Matches(name string, a netip.Addr) bool {
	name, a = Canonical(name), a.Unmap()
	p, i := n.v4, 0
	if a.Is6() {
		p, i = n.v6, 1
	}
	if p == nil || !p.prefix.Contains(a) {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if owner, taken := n.byAddr[a]; taken {
		return owner == name
	}
	if p.at(name, 0) != a {
		return false
	}
	n.record(name, a, i)
	return true
}

// record assigns a to name; n.mu is held.
func (n *Names) record(name string, a netip.Addr, family int) {
	if len(n.order) >= maxNames {
		old := n.order[0]
		n.order = n.order[1:]
		if owner, ok := n.byAddr[old]; ok {
			delete(n.byAddr, old)
			addrs := n.byName[owner]
			for j := range addrs {
				if addrs[j] == old {
					addrs[j] = netip.Addr{}
				}
			}
			if addrs == ([2]netip.Addr{}) {
				delete(n.byName, owner)
			} else {
				n.byName[owner] = addrs
			}
		}
	}
	n.byAddr[a] = name
	addrs := n.byName[name]
	addrs[family] = a
	n.byName[name] = addrs
	n.order = append(n.order, a)
}

// pool is one prefix's addresses, the first and last left out (network and broadcast forms).
type pool struct {
	prefix netip.Prefix // masked
	size   uint64       // usable addresses, at most 2^32
}

func newPool(p netip.Prefix) *pool {
	hostBits := p.Addr().BitLen() - p.Bits()
	if hostBits > 32 {
		hostBits = 32
	}
	size := uint64(1)<<hostBits - 2
	return &pool{prefix: p.Masked(), size: size}
}

// at is name's k-th candidate address: the prefix's, plus an offset under 2^32 (and under the
// prefix's size) added to its last four bytes, whose host bits are zero: no carry leaves them.
func (p *pool) at(name string, k int) netip.Addr {
	h := fnv.New64a()
	h.Write([]byte(name))
	var kb [8]byte
	binary.BigEndian.PutUint64(kb[:], uint64(k))
	h.Write(kb[:])
	off := 1 + h.Sum64()%p.size
	b := p.prefix.Addr().AsSlice()
	low := b[len(b)-4:]
	binary.BigEndian.PutUint32(low, binary.BigEndian.Uint32(low)+uint32(off))
	a, _ := netip.AddrFromSlice(b)
	return a
}
