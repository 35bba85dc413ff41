package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"

	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/transparent/nflog"
	"github.com/capbroker/capbroker/broker/transparent/rules"
)

const transparentRulesSynopsis = `transparent rules [--sandbox-iface NAME]... [--sandbox-cidr CIDR]... [--config FILE] [--hook prerouting|output]
         [--broker-uid UID] [--transparent-port N] [--dns-port N] [--admin-port N] [--proxy-addr HOST:PORT]
         [--log-group N] [--apply | --remove]`

func cmdTransparent(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "rules" {
		fmt.Fprintf(stderr, "Usage: broker %s\n", transparentRulesSynopsis)
		return errUsage
	}
	return cmdTransparentRules(args[1:], stdout, stderr)
}

// prefixList is a repeatable --sandbox-cidr.
type prefixList []netip.Prefix

func (p *prefixList) String() string { return fmt.Sprint(*p) }
func (p *prefixList) Set(s string) error {
	for _, f := range strings.Split(s, ",") {
		pr, err := config.ParsePrefix(strings.TrimSpace(f))
		if err != nil {
			return err
		}
		*p = append(*p, pr)
	}
	return nil
}

// ifaceList is a repeatable --sandbox-iface.
type ifaceList []string

func (l *ifaceList) String() string { return strings.Join(*l, ",") }
func (l *ifaceList) Set(s string) error {
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if err := rules.CheckInterface(f); err != nil {
			return err
		}
		*l = append(*l, f)
	}
	return nil
}

// cmdTransparentRules prints (or applies, or removes) the nftables rules of transparent
// mode. Ports and the log group come from the broker's config when --config is given; flags
// override it; without either, the defaults of docs/transparent.md.
func cmdTransparentRules(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("transparent rules", transparentRulesSynopsis, stderr)
	var sandbox prefixList
	var ifaces ifaceList
	fs.Var(&ifaces, "sandbox-iface", "the interface the sandbox's packets arrive on; \"veth*\" for every name with that start (repeatable; gateway form; default: transparent.interfaces)")
	fs.Var(&sandbox, "sandbox-cidr", "a source prefix the sandbox may use, IPv4 or IPv6; any other source is dropped (repeatable; gateway form)")
	path := fs.String("config", "", "the broker's config: ports (and families) of transparent.listen, transparent.dns.listen and proxy.listen; transparent.log_group and transparent.interfaces; admin.listen's port (hook output)")
	hook := fs.String("hook", string(rules.Prerouting), "prerouting (the broker is the sandbox's gateway) or output (agent and broker share a network namespace: a pod)")
	uid := fs.Int("broker-uid", -1, "the broker's user, whose sockets are left alone (hook output)")
	tport := fs.Int("transparent-port", -1, "the transparent listener's port (default: transparent.listen's, else 15001)")
	dport := fs.Int("dns-port", -1, "the resolver's port, 0 for none (default: transparent.dns.listen's, else 53)")
	aport := fs.Int("admin-port", -1, "the admin listener's port, which no user but the broker's reaches, 0 for none (hook output; default: admin.listen's)")
	proxy := fs.String("proxy-addr", "", "the explicit proxy's address, left alone (default: proxy.listen, else :8080)")
	group := fs.Int("log-group", -1, "the netfilter log group refused packets go to, 0 for none (default: transparent.log_group, else 0)")
	apply := fs.Bool("apply", false, "load the rules (nft -f -) instead of printing them")
	remove := fs.Bool("remove", false, "delete the rules (the table inet capbroker)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *apply && *remove {
		fmt.Fprintln(stderr, "--apply and --remove exclude each other")
		fs.Usage()
		return errUsage
	}
	if *aport != -1 && rules.Hook(*hook) != rules.Output {
		fmt.Fprintln(stderr, "--admin-port is for --hook output (the gateway form lets the sandbox reach the broker's listeners only)")
		fs.Usage()
		return errUsage
	}
	if *uid != -1 && rules.Hook(*hook) != rules.Output {
		fmt.Fprintln(stderr, "--broker-uid is for --hook output")
		fs.Usage()
		return errUsage
	}
	if *remove {
		if err := runNft(rules.RemoveScript()); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "removed table inet %s\n", rules.Table)
		return nil
	}

	o := rules.Options{Hook: rules.Hook(*hook), Interfaces: ifaces, Sandbox: sandbox, BrokerUID: *uid, TransparentPort: 15001, DNSPort: 53, ProxyPort: 8080}
	if *path != "" {
		cfg, err := config.Load(*path)
		if err != nil {
			return configError(*path, err)
		}
		t := cfg.Transparent
		if t.Listen == "" {
			return fmt.Errorf("%s: transparent.listen is not set: transparent mode is off", *path)
		}
		if o.TransparentPort, err = listenPort("transparent.listen", t.Listen); err != nil {
			return err
		}
		o.TransparentAddr = listenAddr(t.Listen)
		o.DNSPort = 0
		if t.DNS.Listen != "" {
			if o.DNSPort, err = listenPort("transparent.dns.listen", t.DNS.Listen); err != nil {
				return err
			}
			o.DNSAddr = listenAddr(t.DNS.Listen)
		}
		o.LogGroup = uint16(t.LogGroup)
		if len(o.Interfaces) == 0 && o.Hook == rules.Prerouting {
			o.Interfaces = t.Interfaces
		}
		if o.Hook == rules.Output {
			// The admin listener shares the pod's namespace: other users keep off its port.
			o.AdminPort, _ = listenPort("admin.listen", cfg.Admin.Listen)
		}
		if *proxy == "" {
			*proxy = cfg.Proxy.Listen
		}
	}
	var err error
	if *proxy != "" {
		if o.ProxyPort, err = listenPort("--proxy-addr", *proxy); err != nil {
			return err
		}
		host, _, _ := net.SplitHostPort(*proxy)
		o.ProxyAddr, _ = netip.ParseAddr(host) // a name or "": any of the host's own addresses
	}
	for _, f := range []struct {
		name string
		v    int
		max  int
		dst  *uint16
	}{{"transparent-port", *tport, 65535, &o.TransparentPort}, {"dns-port", *dport, 65535, &o.DNSPort}, {"log-group", *group, 65535, &o.LogGroup}, {"admin-port", *aport, 65535, &o.AdminPort}} {
		if f.v == -1 {
			continue
		}
		if f.v < 0 || f.v > f.max {
			fmt.Fprintf(stderr, "--%s %d is out of range (0-%d)\n", f.name, f.v, f.max)
			return errUsage
		}
		*f.dst = uint16(f.v)
	}
	script, err := rules.Script(o)
	if err != nil {
		fmt.Fprintln(stderr, err)
		if o.Hook == rules.Prerouting && len(o.Interfaces) == 0 {
			if hint := ifaceHint(o.Sandbox); hint != "" {
				fmt.Fprintln(stderr, hint)
			}
		}
		fs.Usage()
		return errUsage
	}
	if o.LogGroup == 0 {
		fmt.Fprintln(stderr, "warning: --log-group is 0 (transparent.log_group): refused packets are dropped, not audited")
	}
	if !*apply {
		_, err := io.WriteString(stdout, script)
		return err
	}
	if o.Hook == rules.Prerouting {
		// The reverse path holds a source to what is routed through the interface: through
		// one that carries the default route, every address is, forged ones included.
		for _, up := range defaultRouteIfaces() {
			for _, n := range o.Interfaces {
				if rules.InterfaceMatches(n, up) {
					return fmt.Errorf("--sandbox-iface %s: %s carries this namespace's default route, so the rules could not tell the sandbox's packets, or its forged sources, from the rest; give the sandbox an interface of its own", n, up)
				}
			}
		}
	}
	if err := runNft(script); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "applied table inet %s (hook %s): TCP to port %d, DNS to port %d, log group %d\n",
		rules.Table, o.Hook, o.TransparentPort, o.DNSPort, o.LogGroup)
	if o.Hook == rules.Prerouting {
		fmt.Fprintf(stdout, "the sandbox is what arrives on %s; every other packet of its is refused\n", strings.Join(o.Interfaces, ", "))
	}
	return nil
}

// listenPort is the port of a listen address.
func listenPort(what, addr string) (uint16, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, fmt.Errorf("%s %q: %w", what, addr, err)
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%s %q: the port must be a number from 1 to 65535", what, addr)
	}
	return uint16(n), nil
}

// listenAddr is the address of a listen address; invalid when it is a name (the rules
// then redirect both families).
func listenAddr(addr string) netip.Addr {
	host, _, _ := net.SplitHostPort(addr)
	a, _ := netip.ParseAddr(host)
	return a.Unmap()
}

// ifaceHint names the interfaces of this host whose networks hold the sandbox's prefixes,
// for the error that asks for --sandbox-iface.
func ifaceHint(sandbox []netip.Prefix) string {
	ifs, err := net.Interfaces()
	if err != nil {
		return ""
	}
	var names []string
	for _, ifc := range ifs {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			n, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, _ := netip.AddrFromSlice(n.IP)
			ones, _ := n.Mask.Size()
			on := netip.PrefixFrom(ip.Unmap(), ones).Masked()
			if slices.ContainsFunc(sandbox, func(p netip.Prefix) bool { return on.Overlaps(p) && on.Bits() <= p.Bits() }) && !slices.Contains(names, ifc.Name) {
				names = append(names, ifc.Name)
			}
		}
	}
	if len(names) == 0 {
		return ""
	}
	return fmt.Sprintf("here, the sandbox's prefixes are on: --sandbox-iface %s", strings.Join(names, " --sandbox-iface "))
}

// defaultRouteIfaces names the interfaces of this network namespace's default routes (IPv4
// and IPv6, main table), from /proc/net.
func defaultRouteIfaces() []string {
	var out []string
	if b, err := os.ReadFile("/proc/net/route"); err == nil {
		for _, l := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(l)
			if len(f) >= 8 && f[1] == "00000000" && f[7] == "00000000" {
				out = append(out, f[0])
			}
		}
	}
	if b, err := os.ReadFile("/proc/net/ipv6_route"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) == 10 && f[0] == strings.Repeat("0", 32) && f[1] == "00" && f[9] != "lo" {
				out = append(out, f[9])
			}
		}
	}
	return out
}

// runNft pipes a script to `nft -f -`.
func runNft(script string) error {
	nft, err := exec.LookPath("nft")
	if err != nil {
		return errors.New("nft is not installed (nftables): print the rules without --apply and load them with nft -f")
	}
	cmd := exec.Command(nft, "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft -f -: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Reasons of the audit events of packets the rules refused.
const (
	reasonUDP       = "UDP is not carried by the broker (QUIC/HTTP3 falls back to TCP)"
	reasonNotRouted = "not routed: only the broker is reachable"
	reasonSource    = "source address not the sandbox's (forged, or added inside the sandbox): dropped"
)

// readRefused reads the netfilter log group the rules send refused packets to
// (transparent.log_group), and audits each flow once per nflog.Window. The returned stop
// ends it.
func readRefused(ctx context.Context, b *broker.Broker, group int, log zerolog.Logger) (stop func(), err error) {
	r, err := nflog.Open(uint16(group))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := nflog.Run(ctx, r, func(p nflog.Packet) {
			f := broker.Flow{Proto: p.Proto, Source: p.Source, Dest: p.Dest}
			reason := reasonNotRouted
			switch {
			case p.Prefix == rules.LogPrefixSource:
				reason, f.Forged = reasonSource, true
			case p.Proto == "udp":
				reason = reasonUDP
			}
			b.RefuseFlow(f, reason)
		}, func(err error) { log.Warn().Err(err).Int("log_group", group).Msg("refused packets went unaudited") })
		if err != nil {
			log.Error().Err(err).Int("log_group", group).Msg("reading refused packets stopped; they are refused, no longer audited")
		}
	}()
	return func() { cancel(); <-done }, nil
}
