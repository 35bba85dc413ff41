package rules

import (
	"bytes"
	"flag"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func prefixes(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range s {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}

// forms are the scripts the golden files hold; every one must also load into nft.
var forms = map[string]Options{
	"gateway": {
		Hook: Prerouting, Interfaces: []string{"veth-sb"}, Sandbox: prefixes("10.250.0.2/30", "fd00:250::/64"),
		TransparentPort: 15001, DNSPort: 53, ProxyPort: 8080, LogGroup: 7,
	},
	"gateway-interfaces-only": {
		Hook: Prerouting, Interfaces: []string{"br-sandbox", "vsb*", "br-sandbox"},
		TransparentPort: 15001, TransparentAddr: netip.MustParseAddr("10.250.0.1"),
		DNSPort: 53, DNSAddr: netip.MustParseAddr("10.250.0.1"), LogGroup: 7,
	},
	"gateway-v4-proxy-addr-no-dns-no-log": {
		Hook: Prerouting, Interfaces: []string{"eth1"}, Sandbox: prefixes("172.28.0.0/24", "172.28.0.0/24", "10.1.0.0/16"),
		TransparentPort: 15001, ProxyPort: 8080, ProxyAddr: netip.MustParseAddr("172.28.0.2"),
	},
	"gateway-v6-proxy-addr": {
		Hook: Prerouting, Interfaces: []string{"veth0"}, Sandbox: prefixes("fd00:250::2/64"),
		TransparentPort: 15001, DNSPort: 5353, ProxyPort: 8080, ProxyAddr: netip.MustParseAddr("fd00:250::1"), LogGroup: 65535,
	},
	"pod": {
		Hook: Output, TransparentPort: 15001, DNSPort: 15053, ProxyPort: 8080, LogGroup: 7, BrokerUID: 65532, AdminPort: 9090,
	},
}

func TestScriptGolden(t *testing.T) {
	for name, o := range forms {
		t.Run(name, func(t *testing.T) {
			got, err := Script(o)
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", name+".nft")
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update to write it)", err)
			}
			if got != string(want) {
				t.Errorf("Script differs from %s (go test -update rewrites it):\n%s", golden, got)
			}
		})
	}
}

// TestScriptLoads checks every form with `nft -c -f -`: the kernel's own parser and
// validation (hooks, priorities, reject and fib in the chains they are used in), without
// changing anything.
func TestScriptLoads(t *testing.T) {
	nft := requireNft(t)
	for name, o := range forms {
		t.Run(name, func(t *testing.T) {
			s, err := Script(o)
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(nft, "-c", "-f", "-")
			cmd.Stdin = strings.NewReader(s)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("nft -c rejects the %s form: %v\n%s", name, err, out)
			}
		})
	}
	cmd := exec.Command(nft, "-c", "-f", "-")
	cmd.Stdin = strings.NewReader(RemoveScript())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -c rejects the removal: %v\n%s", err, out)
	}
}

// requireNft skips without root (nft -c asks the kernel), and fails in CI, where
// scripts/install-test-tools.sh installs nftables, when nft is missing.
func requireNft(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipped: nft -c needs root (CAP_NET_ADMIN); CI runs it as root")
	}
	nft, err := exec.LookPath("nft")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("nft is missing (scripts/install-test-tools.sh installs nftables)")
		}
		t.Skip("skipped: nft is missing (apt-get install nftables)")
	}
	return nft
}

func TestScriptRefuses(t *testing.T) {
	for name, c := range map[string]struct {
		o    Options
		want string
	}{
		"gateway without interface": {Options{Hook: Prerouting, TransparentPort: 1, Sandbox: prefixes("10.0.0.0/8")}, "needs the sandbox's interface"},
		"bad interface":             {Options{Hook: Prerouting, TransparentPort: 1, Interfaces: []string{`a"b`}}, "is not allowed"},
		"pod with interface":        {Options{Hook: Output, TransparentPort: 1, BrokerUID: 5, Interfaces: []string{"eth0"}}, "takes no sandbox prefix or interface"},
		"pod without uid":           {Options{Hook: Output, TransparentPort: 1}, "broker's uid"},
		"pod with sandbox":          {Options{Hook: Output, TransparentPort: 1, BrokerUID: 5, Sandbox: prefixes("10.0.0.0/8")}, "takes no sandbox prefix"},
		"no transparent port":       {Options{Hook: Output, BrokerUID: 5}, "transparent listener's port"},
		"unknown hook":              {Options{Hook: "input", TransparentPort: 1}, `hook "input"`},
		"invalid prefix":            {Options{Hook: Prerouting, TransparentPort: 1, Sandbox: []netip.Prefix{{}}}, "not valid"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Script(c.o)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to say %q", err, c.want)
			}
		})
	}
}

// TestScriptShape checks what the golden files cannot say by themselves: the sandbox is
// matched by every hook, nothing is redirected to the wrong port, and without a log group
// nothing is logged.
func TestScriptShape(t *testing.T) {
	s, _ := Script(forms["gateway"])
	for _, want := range []string{
		"elements = { 10.250.0.0/30 }", "elements = { fd00:250::/64 }",
		"th dport 53 redirect to :53", "fib daddr type local tcp dport 8080 return",
		"meta l4proto tcp redirect to :15001", "log group 7 snaplen 128", "tcp dport { 15001, 8080 } accept",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("gateway form lacks %q", want)
		}
	}
	// Every hook knows the sandbox by its interface, never by a source address; the source
	// addresses are checked first, for both families.
	for _, chain := range []string{"guard", "prerouting", "prerouting_log", "forward", "input"} {
		body := s[strings.Index(s, "chain "+chain+" {"):]
		body = body[strings.Index(body, "\n"):strings.Index(body, "\n\t}")]
		if !strings.Contains(body, `iifname { "veth-sb" } jump`) || strings.Contains(body, "saddr") {
			t.Errorf("chain %s does not match the sandbox by its interface alone:\n%s", chain, body)
		}
	}
	for _, want := range []string{"type filter hook prerouting priority raw;", "fib saddr . iif oif missing jump sandbox_bad_source",
		"ip saddr != @sandbox4 jump sandbox_bad_source", "ip6 saddr != @sandbox6 jump sandbox_bad_source",
		`log prefix "capbroker: source" group 7 snaplen 128`} {
		if !strings.Contains(s, want) {
			t.Errorf("gateway form lacks %q", want)
		}
	}
	s, _ = Script(forms["gateway-interfaces-only"])
	for _, want := range []string{`iifname { "br-sandbox", "vsb*" } jump`, "fib saddr . iif oif missing",
		"meta nfproto ipv4 meta l4proto tcp redirect to :15001", "meta nfproto ipv4 meta l4proto { tcp, udp } th dport 53 redirect"} {
		if !strings.Contains(s, want) {
			t.Errorf("interfaces-only gateway form lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "@sandbox") {
		t.Errorf("no prefixes: no prefix check:\n%s", s)
	}
	s, _ = Script(forms["gateway-v4-proxy-addr-no-dns-no-log"])
	if strings.Contains(s, " log ") || strings.Contains(s, "dport 53") || strings.Contains(s, "sandbox6") || !strings.Contains(s, "meta nfproto ipv6 jump sandbox_bad_source") {
		t.Errorf("no log group, no resolver, no IPv6 prefix: the script should say none of them, and refuse IPv6:\n%s", s)
	}
	if !strings.Contains(s, "elements = { 10.1.0.0/16, 172.28.0.0/24 }") || !strings.Contains(s, "ip daddr 172.28.0.2 tcp dport 8080 return") {
		t.Errorf("prefixes not deduplicated, or the proxy's address not used:\n%s", s)
	}
	s, _ = Script(forms["pod"])
	if !bytes.Contains([]byte(s), []byte("meta skuid 65532 return")) || !strings.Contains(s, "meta skuid 65532 accept") {
		t.Errorf("the pod form does not leave the broker's uid alone:\n%s", s)
	}
	if !strings.Contains(s, "meta skuid 65532 accept\n\t\t# The broker's admin") || !strings.Contains(s, "tcp dport 9090 reject with tcp reset") {
		t.Errorf("the pod form lets other users reach the admin port:\n%s", s)
	}
}

func TestCheckInterface(t *testing.T) {
	for name, ok := range map[string]bool{
		"veth0": true, "br-sandbox": true, "vsb*": true, "eth1.100": true, "a_b": true, "123456789012345": true,
		"": false, "*": false, "1234567890123456": false, "a b": false, "a/b": false, "a:b": false,
		`a"b`: false, "a*b": false, ".": false, "..": false, "vé": false, "a\n": false,
	} {
		if err := CheckInterface(name); (err == nil) != ok {
			t.Errorf("CheckInterface(%q) = %v, want ok %v", name, err, ok)
		}
	}
}

func TestInterfaceMatches(t *testing.T) {
	for _, c := range []struct {
		pattern, name string
		want          bool
	}{
		{"veth0", "veth0", true}, {"veth0", "veth01", false}, {"veth*", "veth01", true},
		{"veth*", "veth", true}, {"veth*", "vet", false}, {"br-*", "eth0", false},
	} {
		if got := InterfaceMatches(c.pattern, c.name); got != c.want {
			t.Errorf("InterfaceMatches(%q, %q) = %v", c.pattern, c.name, got)
		}
	}
}
