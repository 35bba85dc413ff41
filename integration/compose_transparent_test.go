package integration

import (
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/capbroker/capbroker/broker/config"
)

const (
	composeTransparentFile = "../docker-compose.transparent.yml"
	demoTransparentConfig  = "../deploy/broker/broker-transparent.yaml"
)

// loadComposeTransparent is the demo with the transparent variant's file over it, as
// `docker compose -f docker-compose.yml -f docker-compose.transparent.yml` reads them.
func loadComposeTransparent(t *testing.T) *types.Project {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	opts, err := cli.NewProjectOptions([]string{composeFile, composeTransparentFile}, cli.WithWorkingDirectory(root), cli.WithEnv(nil))
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(t.Context())
	if err != nil {
		t.Fatalf("docker-compose.transparent.yml does not load over docker-compose.yml: %v", err)
	}
	return p
}

// TestComposeTransparentWiring checks the transparent variant without Docker: the agent
// shares the broker's network namespace and has no proxy settings; a one-shot job with
// NET_ADMIN alone installs the pod form of the rules, excepting the broker's user, from the
// config the broker runs, before the agent starts; and that config is the demo's with
// transparent mode on.
func TestComposeTransparentWiring(t *testing.T) {
	p := loadComposeTransparent(t)
	agent, broker, rules := service(t, p, "agent"), service(t, p, "broker"), service(t, p, "rules-init")
	cfg, err := config.Load(demoTransparentConfig)
	if err != nil {
		t.Fatalf("%s: %v", demoTransparentConfig, err)
	}

	t.Run("the agent joins the broker's network namespace, with no proxy settings", func(t *testing.T) {
		if agent.NetworkMode != "service:broker" || len(agent.Networks) != 0 {
			t.Fatalf("agent: network_mode %q, networks %v; want service:broker alone", agent.NetworkMode, agent.Networks)
		}
		for name := range agent.Environment {
			if strings.Contains(strings.ToLower(name), "proxy") {
				t.Errorf("the agent sets %s", name)
			}
		}
		for _, name := range caVars {
			if envValue(agent, name) == "" {
				t.Errorf("the agent does not trust the broker's CA through %s", name)
			}
		}
		if agent.Privileged || len(agent.CapAdd) != 0 || !slices.Contains(agent.CapDrop, "ALL") {
			t.Error("the agent is privileged or has capabilities")
		}
		if d, ok := agent.DependsOn["rules-init"]; !ok || d.Condition != types.ServiceConditionCompletedSuccessfully {
			t.Errorf("the agent does not wait for the rules: depends_on %v", agent.DependsOn)
		}
	})

	t.Run("the rules job installs the pod form for every user but the broker's", func(t *testing.T) {
		if rules.NetworkMode != "service:broker" {
			t.Errorf("rules-init: network_mode %q, want the broker's namespace", rules.NetworkMode)
		}
		if !slices.Equal(rules.CapAdd, []string{"NET_ADMIN"}) || !slices.Contains(rules.CapDrop, "ALL") || rules.Privileged {
			t.Errorf("rules-init: cap_add %v cap_drop %v: want NET_ADMIN alone", rules.CapAdd, rules.CapDrop)
		}
		if rules.Restart != "no" || rules.Build == nil || stageNamed(parseDockerfile(t, dockerfile), rules.Build.Target) == nil {
			t.Errorf("rules-init: restart %q, build %+v: want a one-shot job built from a Dockerfile stage", rules.Restart, rules.Build)
		}
		cmd := strings.Join(rules.Command, " ")
		uid, _, _ := strings.Cut(broker.User, ":")
		if !strings.HasPrefix(cmd, "transparent rules --hook output ") || !strings.Contains(cmd, " --broker-uid "+uid+" ") || !strings.HasSuffix(cmd, " --apply") {
			t.Errorf("rules-init runs %q: want the pod form, excepting the broker's user %s, applied", cmd, uid)
		}
		// It reads the ports from the very config the broker runs.
		i := slices.Index(rules.Command, "--config")
		if i < 0 {
			t.Fatal("rules-init reads no --config")
		}
		rm, ok := mountOf(rules, rules.Command[i+1])
		bm, ok2 := mountOf(broker, "/etc/broker/broker.yaml")
		if !ok || !ok2 || rm.Source != bm.Source || filepath.Clean(bm.Source) != mustAbs(t, demoTransparentConfig) {
			t.Errorf("rules-init reads %+v, the broker runs %+v; want both %s", rm, bm, demoTransparentConfig)
		}
		// The script it would apply: redirects to the config's ports, loads into nft.
		out, err := exec.Command(brokerBin, "transparent", "rules", "--hook", "output", "--broker-uid", uid, "--config", demoTransparentConfig).CombinedOutput()
		if err != nil {
			t.Fatalf("broker transparent rules: %v\n%s", err, out)
		}
		for _, want := range []string{"meta skuid " + uid + " return", "redirect to :15001", "redirect to :15053", "tcp dport 9090 reject"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("the rules lack %q:\n%s", want, out)
			}
		}
	})

	// The agent shares the broker's network namespace: it reaches the admin listener on
	// loopback, and whoever reaches the admin API approves held requests (docs/approvals.md).
	t.Run("the admin API takes a token the agent cannot read", func(t *testing.T) {
		if cfg.Admin.TokenFile == "" {
			t.Fatalf("%s: admin %+v has no token_file, in a namespace the agent shares", demoTransparentConfig, cfg.Admin)
		}
		m, ok := mountOf(broker, cfg.Admin.TokenFile)
		if !ok || m.Type != types.VolumeTypeVolume || !m.ReadOnly {
			t.Fatalf("the broker reads admin.token_file %s from %+v: want a named volume, read-only", cfg.Admin.TokenFile, m)
		}
		for name, svc := range p.Services {
			if _, mounted := mountedAt(svc, m.Source); mounted && name != "broker" && name != "ca-init" {
				t.Errorf("service %s mounts the admin token's volume %s", name, m.Source)
			}
		}
		if _, mounted := mountedAt(agent, m.Source); mounted {
			t.Errorf("the agent mounts the admin token's volume %s", m.Source)
		}
		ca := service(t, p, "ca-init")
		at, ok := mountedAt(ca, m.Source)
		if !ok || envValue(ca, "ADMIN_DIR") != at || at != m.Target {
			t.Errorf("ca-init should write the token into %s (ADMIN_DIR %q, mounted at %q)", m.Source, envValue(ca, "ADMIN_DIR"), at)
		}
		if d, ok := broker.DependsOn["ca-init"]; !ok || d.Condition != types.ServiceConditionCompletedSuccessfully {
			t.Errorf("the broker does not wait for ca-init's token: %v", broker.DependsOn)
		}
	})

	t.Run("the broker's config is the demo's with transparent mode on", func(t *testing.T) {
		base, err := config.Load(demoConfig)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Transparent.Listen == "" || cfg.Transparent.DNS.Listen == "" {
			t.Fatal("transparent mode is off")
		}
		for _, addr := range []string{cfg.Transparent.Listen, cfg.Transparent.DNS.Listen, cfg.Admin.Listen} {
			if !config.LoopbackListen(addr) {
				t.Errorf("%s is not on loopback: the rules send the agent there, nothing else should reach it", addr)
			}
		}
		if len(cfg.Agents) != 1 || cfg.Agents[0].ID != base.Agents[0].ID || len(cfg.Agents[0].Addresses) == 0 {
			t.Errorf("agents %+v: want the demo agent, known by address", cfg.Agents)
		}
		if !slices.Contains(cfg.Transparent.Ports, 8443) {
			t.Errorf("transparent.ports %v does not serve the demo API's port 8443", cfg.Transparent.Ports)
		}
		// Everything else as the demo's: credentials, Vault, upstream, CA, policy.
		for key, pair := range map[string][2]any{
			"credentials": {cfg.Credentials, base.Credentials}, "vault": {cfg.Vault, base.Vault},
			"upstream": {cfg.Upstream, base.Upstream}, "ca": {cfg.CA, base.CA}, "policy": {cfg.Policy, base.Policy},
			"proxy": {cfg.Proxy, base.Proxy},
		} {
			if !reflect.DeepEqual(pair[0], pair[1]) {
				t.Errorf("%s differs from %s's", key, demoConfig)
			}
		}
	})
}
