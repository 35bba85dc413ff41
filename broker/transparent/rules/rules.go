// Package rules writes the nftables rules that make the broker a sandbox's only network path
// in transparent mode (`broker transparent rules`, docs/transparent.md): every DNS query goes
// to the broker's resolver, every TCP connection to its transparent listener (explicit-proxy
// clients excepted), and every other packet is refused, and logged to a netfilter log group
// the broker reads, so that each refusal is audited.
//
// The rules deny by default. The gateway form knows the sandbox by the interfaces its packets
// arrive on, never by their source address alone, and for both address families: a packet
// whose source the sandbox could forge (NET_RAW) or add (NET_ADMIN) is still the sandbox's,
// and gets no further than one the rules expected. A source address the sandbox may not use
// (not routed back through the interface the packet came in on, or outside the sandbox's
// prefixes) is dropped before anything else, and logged with LogPrefixSource.
//
// The rules live in one table, inet capbroker, which the script replaces as a whole: applying
// it twice leaves one copy, and removing the table removes everything.
package rules

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Table is the nftables table the rules live in (family inet).
const Table = "capbroker"

// Hook says where the rules sit.
type Hook string

const (
	// Prerouting is the gateway form: the sandbox's packets arrive on an interface of the
	// broker's host (a veth, a bridge, a container network) and are redirected as they come in.
	Prerouting Hook = "prerouting"
	// Output is the pod form (the Istio pattern): the agent and the broker share a network
	// namespace, and every socket but the broker's user's is redirected as its packets leave.
	Output Hook = "output"
)

// LogPrefixSource is the log prefix of packets dropped for their source address, so that the
// broker's audit can say why (the other refused packets carry no prefix).
const LogPrefixSource = "capbroker: source"

// Options are what the rules need to know. Ports are the broker's: TCP connections go to
// TransparentPort, DNS queries (UDP and TCP port 53) to DNSPort, and connections to ProxyPort
// on the broker's own addresses are left alone (explicit-proxy clients).
type Options struct {
	Hook Hook
	// Interfaces are the interfaces the sandbox's packets arrive on (gateway form; at least
	// one): a veth, a bridge, "veth*" for every name with that start. Every packet arriving
	// on them is the sandbox's, whatever its addresses.
	Interfaces []string
	// Sandbox are the source prefixes the sandbox may use (gateway form; optional): a packet
	// from its interfaces with any other source is dropped and logged. Without them, the
	// reverse-path check alone holds the sources to what is routed through the interfaces.
	Sandbox []netip.Prefix
	// TransparentPort is the transparent listener's port (required). TransparentAddr, when
	// valid and specified, is its address: only its family is redirected (gateway form), the
	// other's TCP is refused like the rest.
	TransparentPort uint16
	TransparentAddr netip.Addr
	// DNSPort is the resolver's port; 0 = no resolver: DNS is refused like other UDP.
	// DNSAddr narrows the redirect to its family, as TransparentAddr does.
	DNSPort uint16
	DNSAddr netip.Addr
	// ProxyPort is the explicit proxy's port; 0 = none. ProxyAddr, when valid and specified,
	// narrows the exception to that address; else any of the broker host's own addresses.
	ProxyPort uint16
	ProxyAddr netip.Addr
	// LogGroup is the netfilter log group refused packets are logged to; 0 = not logged.
	LogGroup uint16
	// BrokerUID is the broker's user (pod form; not root): its sockets are neither
	// redirected nor refused. The gateway form ignores it.
	BrokerUID int
	// AdminPort is the broker's admin listener's port (pod form; 0 = unknown): no other user
	// of the namespace connects to it, on any address.
	AdminPort uint16
}

// InterfaceMatches says whether the interface name is one pattern (a name, or a start and
// '*') names, as nftables' iifname matches it.
func InterfaceMatches(pattern, name string) bool {
	if start, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(name, start)
	}
	return pattern == name
}

// CheckInterface says whether name can be an interface's name in the rules: what Linux
// allows (at most 15 bytes, no '/', ':' or white space), restricted to letters, digits and
// "_.-", with an optional '*' at the end for every name that starts with the rest.
func CheckInterface(name string) error {
	base := strings.TrimSuffix(name, "*")
	switch {
	case base == "":
		return fmt.Errorf("interface %q: a name is needed (a wildcard needs a start: \"veth*\")", name)
	case len(base) > 15:
		return fmt.Errorf("interface %q: longer than 15 bytes, no interface has that name", name)
	case base == "." || base == "..":
		return fmt.Errorf("interface %q is not a name", name)
	}
	for _, r := range base {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-') {
			return fmt.Errorf("interface %q: %q is not allowed (letters, digits, '_', '.', '-', and '*' at the end)", name, r)
		}
	}
	return nil
}

// SnapLen is how much of a refused packet the rules copy to the log group: the network and
// transport headers (IPv6 40 bytes and TCP at most 60), nothing of the payload worth having.
const SnapLen = 128

func (o Options) check() error {
	var errs []error
	switch o.Hook {
	case Prerouting:
		if len(o.Interfaces) == 0 {
			errs = append(errs, errors.New("the gateway form (hook prerouting) needs the sandbox's interface (--sandbox-iface, transparent.interfaces): the sandbox is known by where its packets arrive, not by the source addresses it could forge"))
		}
		for _, n := range o.Interfaces {
			if err := CheckInterface(n); err != nil {
				errs = append(errs, err)
			}
		}
		for _, p := range o.Sandbox {
			if !p.IsValid() {
				errs = append(errs, fmt.Errorf("sandbox prefix %v is not valid", p))
			}
		}
	case Output:
		if len(o.Sandbox) > 0 || len(o.Interfaces) > 0 {
			errs = append(errs, errors.New("the pod form (hook output) takes no sandbox prefix or interface: it covers every socket of the namespace but the broker's"))
		}
		if o.BrokerUID <= 0 {
			// Not root either: its exception would cover every root process of the namespace.
			errs = append(errs, errors.New("the pod form (hook output) needs the broker's uid (not 0), whose sockets are left alone"))
		}
	default:
		errs = append(errs, fmt.Errorf("hook %q is not prerouting or output", o.Hook))
	}
	if o.TransparentPort == 0 {
		errs = append(errs, errors.New("the transparent listener's port is required"))
	}
	return errors.Join(errs...)
}

// Script returns the nftables script (for `nft -f -`), with comments saying what each rule
// is for.
func Script(o Options) (string, error) {
	if err := o.check(); err != nil {
		return "", err
	}
	w := &writer{}
	w.line(0, "#!/usr/sbin/nft -f")
	w.line(0, "# capbroker transparent mode, %s form: written by `broker transparent rules`.", map[Hook]string{Prerouting: "gateway", Output: "pod"}[o.Hook])
	w.line(0, "# Remove with `broker transparent rules --remove` (nft delete table inet %s).", Table)
	w.line(0, "")
	w.line(0, "# Replace the table as a whole: declaring it first makes the delete succeed when it is new.")
	w.line(0, "table inet %s", Table)
	w.line(0, "delete table inet %s", Table)
	w.line(0, "")
	w.line(0, "table inet %s {", Table)
	if o.Hook == Prerouting {
		gateway(w, o)
	} else {
		pod(w, o)
	}
	w.line(0, "}")
	return w.String(), nil
}

// RemoveScript deletes the table; declaring it first makes removal succeed when the rules
// are not there.
func RemoveScript() string {
	return fmt.Sprintf("table inet %[1]s\ndelete table inet %[1]s\n", Table)
}

func gateway(w *writer, o Options) {
	var v4, v6 []string
	for _, p := range o.Sandbox {
		if p.Addr().Is4() {
			v4 = append(v4, p.Masked().String())
		} else {
			v6 = append(v6, p.Masked().String())
		}
	}
	slices.Sort(v4)
	v4 = slices.Compact(v4)
	slices.Sort(v6)
	v6 = slices.Compact(v6)
	ifaces := slices.Clone(o.Interfaces)
	slices.Sort(ifaces)
	ifaces = slices.Compact(ifaces)
	quoted := make([]string, len(ifaces))
	for i, n := range ifaces {
		quoted[i] = `"` + n + `"`
	}
	// Every packet arriving on the sandbox's interfaces, IPv4 and IPv6, whatever its source.
	fromSandbox := fmt.Sprintf("iifname { %s }", strings.Join(quoted, ", "))
	logRule := func(indent int, prefix string) {
		if o.LogGroup == 0 {
			return
		}
		if prefix != "" {
			w.line(indent, "log prefix %q group %d snaplen %d", prefix, o.LogGroup, SnapLen)
		} else {
			w.line(indent, "log group %d snaplen %d", o.LogGroup, SnapLen)
		}
	}

	if len(v4) > 0 {
		w.line(1, "# The source addresses the sandbox may use; any other is dropped.")
		w.line(1, "set sandbox4 {")
		w.line(2, "type ipv4_addr; flags interval")
		w.line(2, "elements = { %s }", strings.Join(v4, ", "))
		w.line(1, "}")
	}
	if len(v6) > 0 {
		w.line(1, "set sandbox6 {")
		w.line(2, "type ipv6_addr; flags interval")
		w.line(2, "elements = { %s }", strings.Join(v6, ", "))
		w.line(1, "}")
	}

	w.line(0, "")
	w.line(1, "# First of all (priority raw): the sandbox is known by the interfaces its packets arrive")
	w.line(1, "# on, and a source address it could forge (NET_RAW) or add (NET_ADMIN) gets nothing.")
	w.line(1, "chain guard {")
	w.line(2, "type filter hook prerouting priority raw; policy accept;")
	w.line(2, "%s jump sandbox_source", fromSandbox)
	w.line(1, "}")
	w.line(1, "chain sandbox_source {")
	w.line(2, "# Neighbour discovery from link-local sources, or none (duplicate address detection):")
	w.line(2, "# hop limit 255, never routed. From any other source it is checked as the rest.")
	w.line(2, "ip6 saddr { ::, fe80::/10 } icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit } ip6 hoplimit 255 return")
	w.line(2, "# Reverse path: the source must be routed back through the interface the packet came in on.")
	w.line(2, "fib saddr . iif oif missing jump sandbox_bad_source")
	if len(o.Sandbox) > 0 {
		w.line(2, "# And be one of the sandbox's prefixes; a family without any is refused whole.")
		if len(v4) > 0 {
			w.line(2, "ip saddr != @sandbox4 jump sandbox_bad_source")
		} else {
			w.line(2, "meta nfproto ipv4 jump sandbox_bad_source")
		}
		if len(v6) > 0 {
			w.line(2, "ip6 saddr != @sandbox6 jump sandbox_bad_source")
		} else {
			w.line(2, "meta nfproto ipv6 jump sandbox_bad_source")
		}
	}
	w.line(1, "}")
	w.line(1, "chain sandbox_bad_source {")
	w.line(2, "# Dropped, not answered: an answer would go to the forged address. Logged for the")
	w.line(2, "# broker's audit, but for the link's own multicast and broadcast chatter.")
	w.line(2, "fib daddr type { broadcast, multicast } drop")
	logRule(2, LogPrefixSource)
	w.line(2, "drop")
	w.line(1, "}")

	w.line(0, "")
	w.line(1, "# Where the sandbox's packets are sent, before routing.")
	w.line(1, "chain prerouting {")
	w.line(2, "type nat hook prerouting priority dstnat; policy accept;")
	w.line(2, "%s jump sandbox_nat", fromSandbox)
	w.line(1, "}")
	w.line(1, "chain sandbox_nat {")
	if o.DNSPort != 0 {
		w.line(2, "# Every DNS query, to any server: to the broker's resolver.")
		w.line(2, "%smeta l4proto { tcp, udp } th dport 53 redirect to :%d", family(o.DNSAddr), o.DNSPort)
	}
	if o.ProxyPort != 0 {
		w.line(2, "# Explicit-proxy clients reach the broker's proxy unchanged.")
		switch {
		case o.ProxyAddr.IsValid() && !o.ProxyAddr.IsUnspecified() && o.ProxyAddr.Unmap().Is4():
			w.line(2, "ip daddr %s tcp dport %d return", o.ProxyAddr.Unmap(), o.ProxyPort)
		case o.ProxyAddr.IsValid() && !o.ProxyAddr.IsUnspecified():
			w.line(2, "ip6 daddr %s tcp dport %d return", o.ProxyAddr, o.ProxyPort)
		default:
			w.line(2, "fib daddr type local tcp dport %d return", o.ProxyPort)
		}
	}
	w.line(2, "# Every other TCP connection: to the transparent listener, which reads the original")
	w.line(2, "# destination from the socket and refuses, audited, what it does not serve.")
	w.line(2, "%smeta l4proto tcp redirect to :%d", family(o.TransparentAddr), o.TransparentPort)
	w.line(1, "}")

	if o.LogGroup != 0 {
		w.line(0, "")
		w.line(1, "# What is left is not for the broker: log it once, here, whether or not it has a")
		w.line(1, "# route (a packet without one never reaches the forward chain), for the broker's audit.")
		w.line(1, "chain prerouting_log {")
		w.line(2, "type filter hook prerouting priority dstnat + 10; policy accept;")
		w.line(2, "%s jump sandbox_log", fromSandbox)
		w.line(1, "}")
		w.line(1, "chain sandbox_log {")
		w.line(2, "fib daddr type { local, broadcast, multicast } return")
		logRule(2, "")
		w.line(1, "}")
	}

	w.line(0, "")
	w.line(1, "# Nothing from the sandbox is routed past the broker: UDP (QUIC among it), ICMP, all.")
	w.line(1, "chain forward {")
	w.line(2, "type filter hook forward priority filter; policy accept;")
	w.line(2, "%s jump sandbox_reject", fromSandbox)
	w.line(1, "}")
	w.line(1, "chain sandbox_reject {")
	w.line(2, "meta l4proto tcp reject with tcp reset")
	w.line(2, "reject with icmpx admin-prohibited")
	w.line(1, "}")

	w.line(0, "")
	w.line(1, "# Of the broker host's own services, the sandbox reaches the broker's listeners only")
	w.line(1, "# (not its admin port, not Vault, not anything else listening there).")
	w.line(1, "chain input {")
	w.line(2, "type filter hook input priority filter; policy accept;")
	w.line(2, "%s jump sandbox_input", fromSandbox)
	w.line(1, "}")
	w.line(1, "chain sandbox_input {")
	ports := []string{fmt.Sprint(o.TransparentPort)}
	if o.ProxyPort != 0 && o.ProxyPort != o.TransparentPort {
		ports = append(ports, fmt.Sprint(o.ProxyPort))
	}
	w.line(2, "tcp dport { %s } accept", strings.Join(ports, ", "))
	if o.DNSPort != 0 {
		w.line(2, "meta l4proto { tcp, udp } th dport %d accept", o.DNSPort)
	}
	w.line(2, "# Neighbour discovery and ICMP errors about the broker's own packets (path MTU).")
	w.line(2, "icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit } accept")
	w.line(2, "ct state related accept")
	w.line(2, "fib daddr type { broadcast, multicast } drop")
	logRule(2, "")
	w.line(2, "jump sandbox_reject")
	w.line(1, "}")
}

// family is the match that narrows a redirect to a listener's address family: none for a
// wildcard (Go listens on both) or an unknown address.
func family(a netip.Addr) string {
	switch {
	case !a.IsValid() || a.IsUnspecified():
		return ""
	case a.Unmap().Is4():
		return "meta nfproto ipv4 "
	default:
		return "meta nfproto ipv6 "
	}
}

func pod(w *writer, o Options) {
	w.line(1, "# Where the namespace's packets are sent as they leave. The broker's own sockets")
	w.line(1, "# (uid %d) are left alone: the broker reaches upstreams. Ahead of other NAT rules", o.BrokerUID)
	w.line(1, "# (priority dstnat - 10), so that no resolver on loopback (Docker's 127.0.0.11)")
	w.line(1, "# answers the namespace's other users before the broker's does.")
	w.line(1, "chain output_nat {")
	w.line(2, "type nat hook output priority -110; policy accept;")
	w.line(2, "meta skuid %d return", o.BrokerUID)
	if o.DNSPort != 0 {
		w.line(2, "# Every DNS query, to any server: to the broker's resolver.")
		w.line(2, "meta l4proto { tcp, udp } th dport 53 redirect to :%d", o.DNSPort)
	}
	w.line(2, "# Loopback's first address is the namespace's own (the broker's listeners, the agent's")
	w.line(2, "# local servers); the rest of 127.0.0.0/8 is not.")
	w.line(2, "ip daddr 127.0.0.1 return")
	w.line(2, "ip6 daddr ::1 return")
	w.line(2, "# Every other TCP connection: to the transparent listener, which reads the original")
	w.line(2, "# destination from the socket and refuses, audited, what it does not serve.")
	w.line(2, "meta l4proto tcp redirect to :%d", o.TransparentPort)
	w.line(1, "}")
	w.line(0, "")
	w.line(1, "# Nothing else leaves but the broker's: UDP (QUIC among it), ICMP, all.")
	w.line(1, "chain output {")
	w.line(2, "type filter hook output priority filter; policy accept;")
	w.line(2, "meta skuid %d accept", o.BrokerUID)
	if o.AdminPort != 0 {
		w.line(2, "# The broker's admin listener is the broker's user's alone: an agent that reached it")
		w.line(2, "# could approve its own held requests.")
		w.line(2, "tcp dport %d reject with tcp reset", o.AdminPort)
	}
	w.line(2, "ip daddr 127.0.0.1 accept")
	w.line(2, "ip6 daddr ::1 accept")
	w.line(2, "# Replies on connections made to the pod (probes, services), ICMP errors, and the")
	w.line(2, "# kernel's own neighbour discovery and multicast listener reports.")
	w.line(2, "ct state established,related accept")
	w.line(2, "icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit, mld-listener-report, mld2-listener-report } accept")
	if o.LogGroup != 0 {
		w.line(2, "log group %d snaplen %d", o.LogGroup, SnapLen)
	}
	w.line(2, "meta l4proto tcp reject with tcp reset")
	w.line(2, "reject with icmpx admin-prohibited")
	w.line(1, "}")
}

type writer struct{ strings.Builder }

func (w *writer) line(indent int, format string, args ...any) {
	if format == "" {
		w.WriteString("\n")
		return
	}
	w.WriteString(strings.Repeat("\t", indent))
	fmt.Fprintf(w, format, args...)
	w.WriteString("\n")
}
