package config

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/capbroker/capbroker/broker/transparent/rules"
)

// Transparent makes the broker the sandbox's network path for clients that ignore proxy
// settings (docs/transparent.md): TCP connections redirected to Listen by the sandbox's
// firewall rules (`broker transparent rules`) are served like a CONNECT to their original
// destination, and DNS answers names from the broker's own resolver. Agents are identified
// by source address (agents[].addresses): a redirected connection carries no proxy token.
type Transparent struct {
	// Listen is where redirected TCP connections arrive ("" = transparent mode off).
	Listen string `yaml:"listen"`
	// Ports are the destination ports served (default [80, 443]); a redirected connection to
	// any other port is refused and audited.
	Ports []int          `yaml:"ports"`
	DNS   TransparentDNS `yaml:"dns"`
	// LogGroup is the netfilter log group (nflog) the rules send refused packets to (UDP
	// other than DNS, QUIC among it): the broker reads it and writes one audit event per
	// refused flow. 0 = not read (the packets are still refused by the rules).
	LogGroup int `yaml:"log_group"`
	// Interfaces are the interfaces the sandbox's packets arrive on, where the broker is the
	// sandbox's gateway (a veth, a bridge; "veth*" for every name with that start): the
	// rules' --sandbox-iface (`broker transparent rules`). The broker itself does not read it.
	Interfaces []string `yaml:"interfaces"`
}

// TransparentDNS is the sandbox's resolver. It never forwards a query: a name the policy
// could allow is answered with an address from Pool, which the transparent listener maps
// back to the name; every other query is refused and audited.
type TransparentDNS struct {
	// Listen is the resolver's address, UDP and TCP ("" = no resolver).
	Listen string `yaml:"listen"`
	// Pool holds the addresses names are answered with (default 198.18.0.0/15 and
	// fd00:cb::/64: the IPv4 range set aside for benchmarks, and a unique-local IPv6 one).
	// Nothing is ever dialled on them; the sandbox must route them to the broker.
	Pool []string `yaml:"pool"`
	// TTL of the answers (default 30s).
	TTL time.Duration `yaml:"ttl"`
	// QueriesPerSecond bounds one source address's queries (default 20, bursts of twice
	// that); queries over it are refused, so DNS cannot carry data out at any useful rate.
	QueriesPerSecond int `yaml:"queries_per_second"`
}

// Transparent mode defaults.
var (
	DefaultTransparentPorts = []int{80, 443}
	DefaultDNSPool          = []string{"198.18.0.0/15", "fd00:cb::/64"}
)

const (
	DefaultDNSTTL              = 30 * time.Second
	DefaultDNSQueriesPerSecond = 20
)

// Prefixes returns Pool parsed (entries that do not parse are left out: Validate reports them).
func (d TransparentDNS) Prefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range d.Pool {
		if p, err := ParsePrefix(s); err == nil {
			out = append(out, p)
		}
	}
	return out
}

func (t *Transparent) defaults() {
	if t.Listen == "" && t.DNS.Listen == "" {
		return
	}
	if len(t.Ports) == 0 {
		t.Ports = append([]int(nil), DefaultTransparentPorts...)
	}
	if len(t.DNS.Pool) == 0 {
		t.DNS.Pool = append([]string(nil), DefaultDNSPool...)
	}
	if t.DNS.TTL == 0 {
		t.DNS.TTL = DefaultDNSTTL
	}
	if t.DNS.QueriesPerSecond == 0 {
		t.DNS.QueriesPerSecond = DefaultDNSQueriesPerSecond
	}
}

func (c *Config) validateTransparent(e *errs) {
	t := &c.Transparent
	for key, addr := range map[string]string{"transparent.listen": t.Listen, "transparent.dns.listen": t.DNS.Listen} {
		if addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			e.add(key, "%q is not host:port: %v", addr, err)
		}
	}
	seen := map[int]bool{}
	for i, p := range t.Ports {
		if p < 1 || p > 65535 {
			e.add(fmt.Sprintf("transparent.ports[%d]", i), "%d is not a TCP port", p)
		}
		if seen[p] {
			e.add(fmt.Sprintf("transparent.ports[%d]", i), "%d is listed twice", p)
		}
		seen[p] = true
	}
	for i, s := range t.DNS.Pool {
		p, err := ParsePrefix(s)
		switch {
		case err != nil:
			e.add(fmt.Sprintf("transparent.dns.pool[%d]", i), "%v", err)
		case p.Addr().Is4() && p.Bits() > 24, p.Addr().Is6() && p.Bits() > 120:
			e.add(fmt.Sprintf("transparent.dns.pool[%d]", i), "%s is too small for a pool of names (at most /24 for IPv4, /120 for IPv6)", s)
		}
	}
	if t.DNS.TTL < 0 {
		e.add("transparent.dns.ttl", "must not be negative")
	}
	if t.DNS.QueriesPerSecond < 0 {
		e.add("transparent.dns.queries_per_second", "must not be negative")
	}
	if t.LogGroup < 0 || t.LogGroup > 65535 {
		e.add("transparent.log_group", "%d is not a netfilter log group (0-65535)", t.LogGroup)
	}
	for i, n := range t.Interfaces {
		if err := rules.CheckInterface(n); err != nil {
			e.add(fmt.Sprintf("transparent.interfaces[%d]", i), "%v", err)
		}
	}
	if t.Listen != "" || t.DNS.Listen != "" {
		c.validateTransparentAdmin(e)
		byAddress := false
		for _, a := range c.Agents {
			byAddress = byAddress || len(a.Addresses) > 0
		}
		if !byAddress {
			e.add("transparent", "transparent mode identifies agents by source address, and no agent has addresses")
		}
	}
}

// validateTransparentAdmin refuses an admin listener without authentication that an agent
// can reach: whoever reaches it approves held requests. Off loopback, the admin section's
// own check refuses it in every mode. On loopback, it is the agent's too when the agent
// shares the broker's network namespace, as transparent mode's pod form has it: a listener
// of the rules' on loopback (the rules can only redirect there from inside the namespace),
// or an agent whose addresses cover loopback (its connections come from there).
func (c *Config) validateTransparentAdmin(e *errs) {
	ad := c.Admin
	if ad.TokenEnv != "" || ad.TokenFile != "" || ad.TLS != nil || !LoopbackListen(ad.Listen) {
		return
	}
	var why string
	for _, l := range []struct{ key, addr string }{{"transparent.listen", c.Transparent.Listen}, {"transparent.dns.listen", c.Transparent.DNS.Listen}} {
		if l.addr != "" && LoopbackListen(l.addr) {
			why = fmt.Sprintf("%s %q is on loopback, so the agent shares the broker's network namespace", l.key, l.addr)
			break
		}
	}
	for i, a := range c.Agents {
		if why != "" {
			break
		}
		if slices.ContainsFunc(a.Addresses, func(s string) bool {
			p, err := ParsePrefix(s)
			return err == nil && (p.Contains(netip.AddrFrom4([4]byte{127, 0, 0, 1})) || p.Contains(netip.IPv6Loopback()) || p.Addr().IsLoopback())
		}) {
			why = fmt.Sprintf("agents[%d] (%s) is known by an address on loopback, so it connects from there", i, a.ID)
		}
	}
	if why != "" {
		e.add("admin.listen", "%q has no authentication, and in transparent mode an agent reaches it: %s, and whoever reaches the admin API approves held requests. Set admin.token_file (a file the agent cannot read), admin.token_env or admin.tls", ad.Listen, why)
	}
}
