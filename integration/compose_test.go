package integration

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/format"
	"go.yaml.in/yaml/v3"

	"github.com/capbroker/capbroker/broker/config"
)

// The docker-compose demo's wiring, checked without Docker: the compose file as the compose
// spec loader reads it, the broker config it mounts, the Dockerfile it builds, and the demo
// policy.

const (
	composeFile  = "../docker-compose.yml"
	demoConfig   = "../deploy/broker/broker.yaml"
	demoPolicies = "../deploy/broker/policies"
	dockerfile   = "../Dockerfile"
)

// proxyVars are the variables an agent's HTTP clients read for the proxy.
var proxyVars = []string{"HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"}

// caVars are the variables that make common clients trust a CA file.
var caVars = []string{"SSL_CERT_FILE", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO"}

func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	// No environment: the file must not depend on the caller's variables.
	opts, err := cli.NewProjectOptions([]string{composeFile}, cli.WithWorkingDirectory(root), cli.WithEnv(nil))
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(t.Context())
	if err != nil {
		t.Fatalf("docker-compose.yml does not load: %v", err)
	}
	return p
}

func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()
	s, ok := p.Services[name]
	if !ok {
		t.Fatalf("docker-compose.yml has no service %q", name)
	}
	return s
}

func envValue(s types.ServiceConfig, name string) string {
	if v, ok := s.Environment[name]; ok && v != nil {
		return *v
	}
	return ""
}

// mountOf returns the volume mounted in s at the folder holding file (or at file itself).
func mountOf(s types.ServiceConfig, file string) (types.ServiceVolumeConfig, bool) {
	for dir := file; dir != "/" && dir != "."; dir = path.Dir(dir) {
		for _, v := range s.Volumes {
			if v.Target == dir {
				return v, true
			}
		}
	}
	return types.ServiceVolumeConfig{}, false
}

// mountedAt returns the target at which s mounts the named volume, if it does.
func mountedAt(s types.ServiceConfig, volume string) (string, bool) {
	for _, v := range s.Volumes {
		if v.Type == types.VolumeTypeVolume && v.Source == volume {
			return v.Target, true
		}
	}
	return "", false
}

func nonRootUser(user string) bool {
	user = strings.TrimSpace(user)
	if user == "" {
		return false
	}
	name, _, _ := strings.Cut(user, ":")
	if name == "root" {
		return false
	}
	if uid, err := strconv.Atoi(name); err == nil {
		return uid != 0
	}
	return true // a named user such as nonroot
}

// TestComposeWiring checks that in docker-compose.yml the agent's only way out is the broker,
// that it trusts the broker's CA, and that it is given no secret.
func TestComposeWiring(t *testing.T) {
	p := loadCompose(t)
	agent, broker := service(t, p, "agent"), service(t, p, "broker")
	cfg, err := config.Load(demoConfig)
	if err != nil {
		t.Fatalf("%s: %v", demoConfig, err)
	}

	t.Run("the agent is on internal networks only, shared with the broker alone", func(t *testing.T) {
		if agent.NetworkMode != "" {
			t.Fatalf("the agent has network_mode %q", agent.NetworkMode)
		}
		if len(agent.Networks) == 0 {
			t.Fatal("the agent joins no network: compose would put it on the default one, which is not internal")
		}
		for name := range agent.Networks {
			if !p.Networks[name].Internal {
				t.Errorf("the agent joins network %q, which is not internal: true", name)
			}
			for other, s := range p.Services {
				if _, on := s.Networks[name]; on && other != "agent" && other != "broker" {
					t.Errorf("service %q shares the agent's network %q: the agent could reach it without the broker", other, name)
				}
			}
			if _, on := broker.Networks[name]; !on {
				t.Errorf("the broker is not on the agent's network %q", name)
			}
		}
		if len(agent.Ports) != 0 || agent.Privileged || len(agent.CapAdd) != 0 || len(agent.ExtraHosts) != 0 || len(agent.DNS) != 0 {
			t.Error("the agent publishes ports, is privileged, adds capabilities, hosts or DNS servers")
		}
		var out bool
		for name := range broker.Networks {
			out = out || !p.Networks[name].Internal
		}
		if !out {
			t.Error("the broker has no network that is not internal: it has no way out either")
		}
	})

	t.Run("the broker is the agent's proxy", func(t *testing.T) {
		_, listenPort, err := net.SplitHostPort(cfg.Proxy.Listen)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range proxyVars {
			raw := envValue(agent, name)
			u, err := url.Parse(raw)
			if err != nil || u.Scheme != "http" || u.Hostname() != "broker" || u.Port() != listenPort {
				t.Errorf("agent %s=%q: want http://AGENT:TOKEN@broker:%s", name, raw, listenPort)
				continue
			}
			// The proxy credentials name a configured agent, whose token the broker knows by
			// its SHA-256 only.
			token, _ := u.User.Password()
			sum := sha256.Sum256([]byte(token))
			i := slices.IndexFunc(cfg.Agents, func(a config.Agent) bool { return a.ID == u.User.Username() })
			if i < 0 || cfg.Agents[i].TokenSHA256 != hex.EncodeToString(sum[:]) {
				t.Errorf("agent %s: %q is not an agent of %s with that token's SHA-256", name, u.User.Username(), demoConfig)
			}
		}
		for _, name := range []string{"NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"} {
			if _, set := agent.Environment[name]; set {
				t.Errorf("the agent sets %s", name)
			}
		}
	})

	t.Run("the broker's CA is mounted in the agent, without its key", func(t *testing.T) {
		caFile := envValue(agent, "SSL_CERT_FILE")
		for _, name := range caVars {
			if v := envValue(agent, name); v != caFile || v == "" {
				t.Errorf("agent %s=%q, want the broker CA %q like SSL_CERT_FILE", name, v, caFile)
			}
		}
		m, ok := mountOf(agent, caFile)
		if !ok || m.Type != types.VolumeTypeVolume || !m.ReadOnly {
			t.Fatalf("the agent's CA file %s is not on a read-only volume: %+v", caFile, m)
		}
		// That volume is where ca-init publishes the broker's certificate.
		caInit := service(t, p, "ca-init")
		if at, ok := mountedAt(caInit, m.Source); !ok || at != "/ca-public" || path.Base(caFile) != "ca.crt" {
			t.Errorf("the agent's CA volume %q is not ca-init's /ca-public (ca.crt)", m.Source)
		}
		// And the broker's own CA (with the key) is ca-init's /ca, never mounted in the agent.
		keyVol, ok := mountOf(broker, cfg.CA.KeyFile)
		if !ok || keyVol.Source == m.Source {
			t.Fatalf("the broker's CA key %s is not on a volume of its own", cfg.CA.KeyFile)
		}
		if at, ok := mountedAt(caInit, keyVol.Source); !ok || at != "/ca" || path.Dir(cfg.CA.KeyFile) != keyVol.Target {
			t.Errorf("the broker's CA volume %q is not the one ca-init writes at /ca", keyVol.Source)
		}
		script, err := os.ReadFile("../deploy/broker/ca-init.sh")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(script), "\n") {
			if strings.Contains(line, "PUBLIC_DIR") && strings.Contains(line, "ca.key") {
				t.Errorf("ca-init.sh puts the CA key in the public folder: %s", line)
			}
		}
	})

	t.Run("no secret in the agent's definition", func(t *testing.T) {
		keyName := regexp.MustCompile(`(?i)vault|token|secret|passw|api_?key|access_?key|credential|private`)
		keyValue := regexp.MustCompile(`(?i)sk-|hvs\.|ghp_|AKIA|PRIVATE KEY|approle|role_id|secret_id`)
		for name, v := range agent.Environment {
			if keyName.MatchString(name) {
				t.Errorf("the agent's environment has %s", name)
			}
			if v != nil && !slices.Contains(proxyVars, name) && (keyValue.MatchString(*v) || strings.Contains(*v, "@")) {
				t.Errorf("the agent's %s looks like a secret", name)
			}
		}
		// Whatever the agent is given, nowhere may it hold Vault's token, the demo key or
		// the broker's Vault credentials.
		def, err := json.Marshal(agent)
		if err != nil {
			t.Fatal(err)
		}
		secrets := []string{"sk-demo-", "role_id", "secret_id", "approle", "ca.key"}
		for _, s := range p.Services {
			for _, name := range []string{"VAULT_TOKEN", "VAULT_DEV_ROOT_TOKEN_ID"} {
				if v := envValue(s, name); v != "" && !slices.Contains(secrets, v) {
					secrets = append(secrets, v)
				}
			}
		}
		if len(secrets) < 6 {
			t.Fatalf("expected Vault's root token among the services' environments; secrets checked: %d", len(secrets))
		}
		for _, s := range secrets {
			if strings.Contains(string(def), s) {
				t.Errorf("the agent's service definition contains %q", s)
			}
		}
		// No volume that holds a secret: those of the Vault job, the demo API's key, the CA key.
		seed := service(t, p, "vault-seed")
		for _, v := range agent.Volumes {
			if _, ok := mountedAt(seed, v.Source); ok && v.Type == types.VolumeTypeVolume {
				t.Errorf("the agent mounts %q, which vault-seed writes", v.Source)
			}
			if at, ok := mountedAt(service(t, p, "ca-init"), v.Source); ok && at == "/ca" {
				t.Errorf("the agent mounts the broker's CA key volume %q", v.Source)
			}
		}
		// The session script must not hold the demo key's prefix itself, or its search for
		// the key would find it.
		if b, err := os.ReadFile("../deploy/agent/session.sh"); err != nil || strings.Contains(string(b), "sk-demo-") {
			t.Errorf("deploy/agent/session.sh contains the demo key's prefix (or is missing: %v)", err)
		}
	})

	t.Run("the broker runs as non-root, and its config matches its mounts", func(t *testing.T) {
		if !nonRootUser(broker.User) {
			t.Errorf("the broker's user is %q, want a non-root user", broker.User)
		}
		if broker.Build == nil || broker.Build.Target != "broker" {
			t.Fatalf("the broker is not built from the Dockerfile's broker stage")
		}
		if !broker.ReadOnly || !slices.Contains(broker.CapDrop, "ALL") {
			t.Error("the broker should run with a read-only root file system and no capabilities")
		}
		cfgMount, ok := mountOf(broker, "/etc/broker/broker.yaml")
		if !ok || filepath.Clean(cfgMount.Source) != mustAbs(t, demoConfig) {
			t.Errorf("the broker does not run %s (mounted: %+v)", demoConfig, cfgMount)
		}
		pol, ok := mountOf(broker, cfg.Policy.Dir)
		if !ok || filepath.Clean(pol.Source) != mustAbs(t, demoPolicies) {
			t.Errorf("the broker's policy.dir %s is not %s", cfg.Policy.Dir, demoPolicies)
		}
		writers := map[string]struct {
			file, service string
		}{
			"ca.cert_file":                {cfg.CA.CertFile, "ca-init"},
			"vault.auth.role_id_file":     {cfg.Vault.Auth.RoleIDFile, "vault-seed"},
			"vault.auth.secret_id_file":   {cfg.Vault.Auth.SecretIDFile, "vault-seed"},
			"upstream.ca_file (demo API)": {cfg.Upstream.CAFile, "demo-upstream"},
		}
		for key, w := range writers {
			m, ok := mountOf(broker, w.file)
			if !ok || !m.ReadOnly {
				t.Errorf("%s %s is not on a read-only volume of the broker", key, w.file)
				continue
			}
			if _, ok := mountedAt(service(t, p, w.service), m.Source); !ok {
				t.Errorf("%s: volume %q is not written by %s", key, m.Source, w.service)
			}
		}
		// The demo API: reached by the name the credential is bound to, at the one private
		// address the broker may dial.
		api := service(t, p, "demo-upstream")
		var addr netip.Addr
		var aliases []string
		for _, n := range api.Networks {
			if n != nil && n.Ipv4Address != "" {
				addr, _ = netip.ParseAddr(n.Ipv4Address)
				aliases = n.Aliases
			}
		}
		allowed := false
		for _, c := range cfg.Upstream.AllowPrivate {
			if pfx, err := netip.ParsePrefix(c); err == nil && pfx.Contains(addr) {
				allowed = true
			}
		}
		if !addr.IsValid() || !allowed {
			t.Errorf("the demo API's address %v is not in upstream.allow_private %v", addr, cfg.Upstream.AllowPrivate)
		}
		for _, c := range cfg.Credentials {
			for _, h := range c.Hosts {
				if !slices.Contains(aliases, h) {
					t.Errorf("credential %s is bound to %s, which is not the demo API's alias %v", c.Name, h, aliases)
				}
			}
		}
		// Vault is reached on a network the broker shares with it, and not the agent's.
		vu, err := url.Parse(cfg.Vault.Address)
		if err != nil {
			t.Fatal(err)
		}
		vault := service(t, p, vu.Hostname())
		shared := false
		for n := range vault.Networks {
			_, b := broker.Networks[n]
			_, a := agent.Networks[n]
			shared = shared || (b && !a)
		}
		if !shared {
			t.Error("the broker and Vault share no network (apart from the agent's)")
		}
	})

	t.Run("every image built runs as non-root and the Dockerfile is multi-stage", func(t *testing.T) {
		stages := parseDockerfile(t, dockerfile)
		if len(stages) < 2 {
			t.Fatalf("the Dockerfile has %d stage(s), want a multi-stage build", len(stages))
		}
		last := stages[len(stages)-1]
		if last.name != "broker" {
			t.Errorf("the Dockerfile's last (default) stage is %q, want broker", last.name)
		}
		if !strings.Contains(last.base, "distroless/static") && last.base != "scratch" {
			t.Errorf("the broker image is based on %q, want distroless static or scratch", last.base)
		}
		if !slices.ContainsFunc(last.lines, func(l string) bool { return strings.HasPrefix(l, "COPY --from=build ") }) {
			t.Error("the broker stage does not copy the binary from the build stage")
		}
		build := stageNamed(stages, "build")
		if build == nil || !strings.HasPrefix(build.base, "golang:") || !slices.ContainsFunc(build.lines, func(l string) bool {
			return strings.HasPrefix(l, "RUN ") && strings.Contains(l, "CGO_ENABLED=0") && strings.Contains(l, "./cmd/broker")
		}) {
			t.Error("no golang build stage builds ./cmd/broker with CGO_ENABLED=0")
		}
		for name, s := range p.Services {
			if s.Build == nil {
				continue
			}
			st := stageNamed(stages, s.Build.Target)
			if st == nil {
				t.Errorf("service %s builds target %q, which the Dockerfile does not have", name, s.Build.Target)
				continue
			}
			if !nonRootUser(st.user) {
				t.Errorf("the Dockerfile's %s stage (service %s) runs as %q, want a non-root USER", st.name, name, st.user)
			}
		}
		ignore, err := os.ReadFile("../.dockerignore")
		if err != nil {
			t.Fatal(err)
		}
		for _, must := range []string{".git", ".broker"} {
			if !slices.Contains(strings.Fields(string(ignore)), must) {
				t.Errorf(".dockerignore does not exclude %s", must)
			}
		}
	})

	t.Run("the demo policy passes its tests and is formatted", func(t *testing.T) {
		out, err := exec.Command(brokerBin, "policy", "test", demoPolicies).CombinedOutput()
		if err != nil {
			t.Fatalf("broker policy test %s: %v\n%s", demoPolicies, err, out)
		}
		files, _ := filepath.Glob(filepath.Join(demoPolicies, "*.rego"))
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			want, err := format.SourceWithOpts(f, b, format.Opts{RegoVersion: ast.RegoV1})
			if err != nil || string(want) != string(b) {
				t.Errorf("%s is not opa fmt-formatted (%v)", f, err)
			}
		}
	})
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// dockerStage is one FROM section of a Dockerfile.
type dockerStage struct {
	name, base, user string
	lines            []string // instructions after FROM, continuation lines joined
}

func stageNamed(stages []dockerStage, name string) *dockerStage {
	for i := range stages {
		if stages[i].name == name {
			return &stages[i]
		}
	}
	return nil
}

// parseDockerfile reads FROM, USER and the other instructions, enough for the checks above.
// A stage based on another inherits its USER.
func parseDockerfile(t *testing.T, file string) []dockerStage {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var stages []dockerStage
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	flush := func() {
		line := strings.Join(strings.Fields(cur.String()), " ")
		cur.Reset()
		if line == "" {
			return
		}
		word, rest, _ := strings.Cut(line, " ")
		switch strings.ToUpper(word) {
		case "FROM":
			f := strings.Fields(rest)
			st := dockerStage{base: f[0], name: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			if parent := stageNamed(stages, st.base); parent != nil {
				st.user = parent.user
			}
			stages = append(stages, st)
		case "USER":
			if len(stages) > 0 {
				stages[len(stages)-1].user = rest
			}
		}
		if len(stages) > 0 && !strings.EqualFold(word, "FROM") {
			stages[len(stages)-1].lines = append(stages[len(stages)-1].lines, strings.ToUpper(word)+" "+rest)
		}
	}
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") && cur.Len() == 0 {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			cur.WriteString(strings.TrimSuffix(line, `\`) + " ")
			continue
		}
		cur.WriteString(line)
		flush()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	flush()
	return stages
}

// TestKubernetesManifests checks the example manifests under deploy/kubernetes: they parse,
// agents may open connections to the broker's proxy port only, get no secret but their
// proxy token, and the broker's config is valid.
func TestKubernetesManifests(t *testing.T) {
	docs := map[string]map[string]any{} // "Kind/name" -> object
	files, _ := filepath.Glob("../deploy/kubernetes/*.yaml")
	sidecar, _ := filepath.Glob("../deploy/kubernetes/sidecar/*.yaml")
	for _, f := range append(files, sidecar...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(strings.NewReader(string(b)))
		for {
			var doc map[string]any
			if err := dec.Decode(&doc); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				t.Fatalf("%s: %v", f, err)
			}
			if doc == nil {
				continue
			}
			kind, _ := doc["kind"].(string)
			name, _ := dig(doc, "metadata", "name").(string)
			if kind == "" || doc["apiVersion"] == nil {
				t.Fatalf("%s: a document without apiVersion or kind", f)
			}
			if kind == "Kustomization" {
				for _, r := range dig(doc, "resources").([]any) {
					if _, err := os.Stat(filepath.Join(filepath.Dir(f), r.(string))); err != nil {
						t.Errorf("kustomization resource %v: %v", r, err)
					}
				}
			}
			docs[kind+"/"+name] = doc
		}
	}
	for _, want := range []string{"NetworkPolicy/default-deny", "NetworkPolicy/agents-egress-only-to-broker", "Deployment/capbroker",
		"Service/capbroker", "Deployment/agent-1", "ConfigMap/capbroker-config", "Pod/agent-1-with-broker"} {
		if docs[want] == nil {
			t.Fatalf("deploy/kubernetes has no %s", want)
		}
	}

	brokerLabels := dig(docs["Deployment/capbroker"], "spec", "template", "metadata", "labels").(map[string]any)
	agentPod := dig(docs["Deployment/agent-1"], "spec", "template").(map[string]any)
	agentLabels := dig(agentPod, "metadata", "labels").(map[string]any)

	np := docs["NetworkPolicy/agents-egress-only-to-broker"]
	sel := dig(np, "spec", "podSelector", "matchLabels").(map[string]any)
	for k, v := range sel {
		if agentLabels[k] != v {
			t.Errorf("the agents' NetworkPolicy does not select the agent pod (%s=%v)", k, v)
		}
	}
	if !slices.Contains(dig(np, "spec", "policyTypes").([]any), any("Egress")) {
		t.Error("the agents' NetworkPolicy does not restrict egress")
	}
	egress := dig(np, "spec", "egress").([]any)
	if len(egress) != 1 {
		t.Fatalf("the agents' NetworkPolicy has %d egress rules, want one: to the broker", len(egress))
	}
	to := dig(egress[0], "to").([]any)
	peer := dig(to[0], "podSelector", "matchLabels")
	if len(to) != 1 || peer == nil || dig(to[0], "ipBlock") != nil || dig(to[0], "namespaceSelector") != nil {
		t.Fatalf("the agents may reach more than the broker's pods: %v", to)
	}
	for k, v := range peer.(map[string]any) {
		if brokerLabels[k] != v {
			t.Errorf("the agents' egress peer %s=%v is not the broker", k, v)
		}
	}
	ports := dig(egress[0], "ports").([]any)
	if len(ports) != 1 || dig(ports[0], "port") != 8080 {
		t.Errorf("agents may reach ports %v of the broker, want 8080 only", ports)
	}

	// The agent: its proxy token, the broker's address and CA, and nothing else.
	if dig(agentPod, "spec", "automountServiceAccountToken") != false {
		t.Error("the agent pod gets a Kubernetes service account token")
	}
	container := dig(agentPod, "spec", "containers").([]any)[0]
	env := map[string]any{}
	for _, e := range dig(container, "env").([]any) {
		env[dig(e, "name").(string)] = e
	}
	if ref := dig(env["PROXY_TOKEN"], "valueFrom", "secretKeyRef", "name"); ref != "agent-1-proxy-token" {
		t.Errorf("the agent's PROXY_TOKEN does not come from its own Secret: %v", ref)
	}
	for name, e := range env {
		if name != "PROXY_TOKEN" && dig(e, "valueFrom") != nil {
			t.Errorf("the agent's %s comes from a Secret or ConfigMap", name)
		}
	}
	if v, _ := dig(env["HTTPS_PROXY"], "value").(string); v != "http://agent-1:$(PROXY_TOKEN)@$(CAPBROKER_SERVICE_HOST):$(CAPBROKER_SERVICE_PORT)" {
		t.Errorf("the agent's HTTPS_PROXY is %q", v)
	}
	for _, v := range dig(agentPod, "spec", "volumes").([]any) {
		if dig(v, "secret") != nil {
			t.Errorf("the agent mounts a Secret: %v", v)
		}
	}

	// The broker's config is valid once the agent's token digest is filled in.
	cfg := dig(docs["ConfigMap/capbroker-config"], "data", "broker.yaml").(string)
	cfg = strings.Replace(cfg, "REPLACE_WITH_SHA256_OF_THE_AGENT_TOKEN", strings.Repeat("ab", 32), 1)
	if _, err := config.Parse([]byte(cfg)); err != nil {
		t.Errorf("deploy/kubernetes/broker.yaml: the broker config does not validate: %v", err)
	}
	if dig(docs["Deployment/capbroker"], "spec", "template", "spec", "securityContext", "runAsNonRoot") != true {
		t.Error("the broker pod does not require a non-root user")
	}
}

// dig walks nested maps by key.
func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}
