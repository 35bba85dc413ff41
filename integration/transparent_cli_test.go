package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTransparentRulesCLI: `broker transparent rules` takes its ports and log group from the
// broker's config, lets flags override them, and refuses contradictory command lines with a
// usage error (exit 2) before touching anything.
func TestTransparentRulesCLI(t *testing.T) {
	dir := t.TempDir()
	common := "ca: {cert_file: ca.crt, key_file: ca.key}\npolicy: {dir: policies}\n"
	cfg := common + `proxy: {listen: "10.250.0.1:3128"}
agents:
  - {id: sandbox, addresses: ["10.250.0.2/32"]}
transparent:
  listen: "0.0.0.0:15099"
  log_group: 9
  interfaces: [veth-sb]
  dns: {listen: "10.250.0.1:5353"}
`
	if err := os.WriteFile(filepath.Join(dir, "broker.yaml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "off.yaml"), []byte(common+"agents: [{id: a, token_env: A}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	out, code := run(t, dir, "transparent", "rules", "--config", "broker.yaml", "--sandbox-cidr", "10.250.0.0/30,fd00:250::/64")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{
		"elements = { 10.250.0.0/30 }", "elements = { fd00:250::/64 }",
		"th dport 53 redirect to :5353", "ip daddr 10.250.0.1 tcp dport 3128 return",
		"meta l4proto tcp redirect to :15099", "log group 9 snaplen",
		`iifname { "veth-sb" } jump sandbox_nat`, "meta nfproto ipv4 meta l4proto { tcp, udp } th dport 53 redirect to :5353",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the script from the config lacks %q:\n%s", want, out)
		}
	}

	out, code = run(t, dir, "transparent", "rules", "--config", "broker.yaml", "--sandbox-cidr", "10.250.0.0/30", "--sandbox-iface", "br-sb*",
		"--transparent-port", "15001", "--dns-port", "0", "--log-group", "0", "--proxy-addr", ":8080")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for want, present := range map[string]bool{
		"redirect to :15001": true, "fib daddr type local tcp dport 8080 return": true,
		"dport 53": false, " log ": false, "15099": false, "3128": false,
		`iifname { "br-sb*" }`: true, "veth-sb": false,
	} {
		if strings.Contains(out, want) != present {
			t.Errorf("flags over the config: %q present = %v, want %v:\n%s", want, !present, present, out)
		}
	}

	for name, c := range map[string]struct {
		args []string
		code int
		want string
	}{
		"no subcommand":              {nil, 2, "Usage: broker transparent rules"},
		"gateway without iface":      {[]string{"rules", "--sandbox-cidr", "10.0.0.0/8"}, 2, "needs the sandbox's interface"},
		"bad iface":                  {[]string{"rules", "--sandbox-iface", "veth 0"}, 2, "sandbox-iface"},
		"admin port in gateway form": {[]string{"rules", "--sandbox-iface", "eth0", "--admin-port", "9090"}, 2, "--admin-port is for --hook output"},
		"iface in pod form":          {[]string{"rules", "--hook", "output", "--broker-uid", "5", "--sandbox-iface", "eth0"}, 2, "takes no sandbox prefix or interface"},
		"pod without uid":            {[]string{"rules", "--hook", "output"}, 2, "needs the broker's uid"},
		"pod as root":                {[]string{"rules", "--hook", "output", "--broker-uid", "0"}, 2, "not 0"},
		"uid in gateway form":        {[]string{"rules", "--sandbox-cidr", "10.0.0.0/8", "--broker-uid", "5"}, 2, "--broker-uid is for --hook output"},
		"apply and remove":           {[]string{"rules", "--apply", "--remove"}, 2, "exclude each other"},
		"bad cidr":                   {[]string{"rules", "--sandbox-cidr", "10.0.0.300/8"}, 2, "sandbox-cidr"},
		"port out of range":          {[]string{"rules", "--sandbox-cidr", "10.0.0.0/8", "--dns-port", "70000"}, 2, "out of range"},
		"unknown hook":               {[]string{"rules", "--hook", "input", "--sandbox-cidr", "10.0.0.0/8"}, 2, `hook "input"`},
		"transparent mode off":       {[]string{"rules", "--config", "off.yaml", "--sandbox-cidr", "10.0.0.0/8"}, 1, "transparent.listen is not set"},
		"config does not parse":      {[]string{"rules", "--config", "missing.yaml", "--sandbox-cidr", "10.0.0.0/8"}, 1, "missing.yaml"},
	} {
		t.Run(name, func(t *testing.T) {
			out, code := run(t, dir, append([]string{"transparent"}, c.args...)...)
			if code != c.code || !strings.Contains(out, c.want) {
				t.Fatalf("exit %d, want %d saying %q:\n%s", code, c.code, c.want, out)
			}
		})
	}
}
