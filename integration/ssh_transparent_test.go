//go:build linux

package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

// Git over SSH in transparent mode: the sandbox topology of transparent_test.go (the agent's
// default route through the broker's namespace, the rules `broker transparent rules` writes,
// the broker's resolver its only one), with port 22 in transparent.ports. The agent runs
// `git clone git@git.test:org/repo.git` with no GIT_SSH_COMMAND and no ssh_config at all: its
// /etc/ssh holds only the known_hosts file `broker agent-env` writes, which pins the broker's
// host key for git.test. sshd (the git host) and Vault run in this namespace, reached from
// the broker's through a relay on its loopback.
func TestSSHTransparent(t *testing.T) {
	requireSSHTools(t)
	sn := newSandboxNet(t)
	requireNft(t)
	vault, caPub := startSSHVault(t)

	host := startGitHost(t, caPub)
	seed := t.TempDir()
	hostGit(t, host.repos, "init", "-q", "--bare", "-b", "main", "org/repo.git")
	hostGit(t, seed, "init", "-q", "-b", "main", "w")
	must(t, os.WriteFile(filepath.Join(seed, "w", "README"), []byte("hello through the transparent broker\n"), 0o644))
	hostGit(t, filepath.Join(seed, "w"), "add", "README")
	hostGit(t, filepath.Join(seed, "w"), "commit", "-q", "-m", "first")
	hostGit(t, filepath.Join(seed, "w"), "push", "-q", filepath.Join(host.repos, "org/repo.git"), "main")
	bare := filepath.Join(host.repos, "org/repo.git")

	sn.gateway(t) // the agent's default routes go through the broker's namespace
	sn.resolvConf(t, "nameserver "+brokerSideIP, "options attempts:1 timeout:3")
	vaultRelay := relayIntoBroker(t, sn, strings.TrimPrefix(vault.Addr, "http://"))
	sshdRelay := relayIntoBroker(t, sn, host.addr)

	policyText, files := sshPolicies(t, "    git.test: true\n", "[org/*]")
	brokerDir := t.TempDir()
	b := startBroker(t, brokerOpts{
		netns:  sn.brokerNS,
		listen: transparentProxy,
		policy: policyText, files: files, mode: "enforce",
		env: []string{"BROKER_VAULT_TOKEN=" + vault.RootToken},
		config: fmt.Sprintf(`upstream:
  allow_private: ["127.0.0.1/32"]
agents:
  - {id: coder, addresses: ["%s/32", "%s/128"]}
vault:
  address: http://%s
  auth: {method: token, token_env: BROKER_VAULT_TOKEN}
transparent:
  listen: "[::]:%s"
  ports: [80, 443, 22]
  dns: {listen: %q}
ssh:
  listen: "127.0.0.1:0"
  host_key_file: %q
  upstreams:
    - host: git.test
      address: %q
      user: root
      known_hosts: [%q]
      vault_ssh: {role: git, principals: [git]}
`, agentSideIP, agentSideIP6, vaultRelay, transparentPort, transparentDNS, filepath.Join(brokerDir, "ssh_host_key"),
			sshdRelay, strings.TrimSpace("git.test "+string(ssh.MarshalAuthorizedKey(host.hostKey)))),
	})
	b.logs.wait(t, "listening for git over ssh")
	b.logs.wait(t, `"message":"resolver listening"`)
	out := sn.transparentRules(t, "--sandbox-iface", sn.vethB, "--sandbox-cidr", agentSideIP+"/32", "--sandbox-cidr", agentSideIP6+"/128",
		"--config", filepath.Join(b.dir, "broker.yaml"), "--apply")
	if !strings.Contains(out, "TCP to port "+transparentPort) {
		t.Fatalf("--apply said:\n%s", out)
	}

	// The agent's side: only the known_hosts file agent-env writes, as the sandbox's
	// /etc/ssh/ssh_known_hosts (ip netns exec puts /etc/netns/NS/ssh over /etc/ssh, so the
	// agent has no ssh_config of any kind). Its --ssh address does not matter here.
	filesDir := t.TempDir()
	out2, err := exec.Command(brokerBin, "agent-env", "--config", filepath.Join(b.dir, "broker.yaml"), "--agent", "coder",
		"--ssh", "127.0.0.1:22", "--ssh-dir", filesDir, "--ssh-write", "--format", "env").CombinedOutput()
	if err != nil {
		t.Fatalf("agent-env: %v\n%s", err, out2)
	}
	knownHosts, err := os.ReadFile(filepath.Join(filesDir, "known_hosts"))
	must(t, err)
	etcSSH := filepath.Join("/etc/netns", sn.agentNS, "ssh")
	must(t, os.MkdirAll(etcSSH, 0o755))
	must(t, os.WriteFile(filepath.Join(etcSSH, "ssh_known_hosts"), knownHosts, 0o644))
	env := []string{"PATH=" + agentPath, "HOME=" + sn.agentDir, "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=agent", "GIT_AUTHOR_EMAIL=agent@sandbox", "GIT_COMMITTER_NAME=agent", "GIT_COMMITTER_EMAIL=agent@sandbox"}
	agentGit := func(t *testing.T, dir string, args ...string) (string, error) {
		t.Helper()
		return sn.agent(t, env, append([]string{"git", "-C", filepath.Join(sn.agentDir, dir)}, args...)...)
	}

	sshEvent := func(t *testing.T, what string, match func(e auditEvent, s map[string]any) bool) auditEvent {
		t.Helper()
		evs := b.waitAuditWhere(t, 1, what, func(e auditEvent) bool {
			s, _ := e["ssh"].(map[string]any)
			return e["phase"] == "ssh" && s != nil && match(e, s)
		})
		return evs[len(evs)-1]
	}

	t.Run("clone with no ssh config", func(t *testing.T) {
		out, err := agentGit(t, "", "clone", "git@git.test:org/repo.git", "work")
		if err != nil {
			t.Fatalf("clone: %v\n%s", err, out)
		}
		got, err := os.ReadFile(filepath.Join(sn.agentDir, "work", "README"))
		if err != nil || string(got) != "hello through the transparent broker\n" {
			t.Fatalf("cloned README = %q, %v", got, err)
		}
		ev := sshEvent(t, "the clone's audit event", func(e auditEvent, s map[string]any) bool {
			return s["service"] == "fetch" && e["decision"] == "allow"
		})
		if ev["mode"] != "transparent" || ev["agent"] != "coder" || ev["host"] != "git.test" || ev["source_ip"] != agentSideIP && ev["source_ip"] != agentSideIP6 {
			t.Errorf("audit event %v", ev)
		}
	})

	t.Run("push to main is refused before the git host gets it", func(t *testing.T) {
		before := hostGit(t, bare, "rev-parse", "main")
		must(t, os.WriteFile(filepath.Join(sn.agentDir, "work", "sneaky"), []byte("x\n"), 0o644))
		if out, err := agentGit(t, "work", "add", "sneaky"); err != nil {
			t.Fatalf("add: %v\n%s", err, out)
		}
		if out, err := agentGit(t, "work", "commit", "-q", "-m", "sneaky"); err != nil {
			t.Fatalf("commit: %v\n%s", err, out)
		}
		head, _ := agentGit(t, "work", "rev-parse", "HEAD")
		head = strings.TrimSpace(head)
		out, err := agentGit(t, "work", "push", "origin", "HEAD:main")
		if err == nil {
			t.Fatalf("push to main succeeded:\n%s", out)
		}
		for _, want := range []string{"remote: capbroker: push denied: pushing refs/heads/main is not allowed", "[remote rejected]"} {
			if !strings.Contains(out, want) {
				t.Errorf("git's output lacks %q:\n%s", want, out)
			}
		}
		if got := hostGit(t, bare, "rev-parse", "main"); got != before {
			t.Fatalf("main moved upstream to %s", got)
		}
		if err := exec.Command("git", "-C", bare, "cat-file", "-e", head).Run(); err == nil {
			t.Fatalf("the refused commit %s reached the git host", head)
		}
		sshEvent(t, "the refused push's audit event", func(e auditEvent, s map[string]any) bool {
			return s["service"] == "push" && e["decision"] == "deny" && e["mode"] == "transparent"
		})
	})

	t.Run("an address no name was answered for is refused", func(t *testing.T) {
		// SSH names no host: an address the resolver did not give out has no name, so it is
		// never served as a git host (as whatever git host the agent would say it is); it is
		// peeked as TLS or HTTP, which SSH is not.
		out, err := sn.agent(t, env, "ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "git@192.0.2.7", "git-upload-pack 'org/repo.git'")
		if err == nil || strings.Contains(out, "version") {
			t.Fatalf("ssh to an address: %v\n%s", err, out)
		}
		b.waitAuditWhere(t, 1, "the refused flow's audit event", func(e auditEvent) bool {
			return e["host"] == "192.0.2.7" && e["decision"] == "deny" && strings.HasPrefix(fmt.Sprint(e["reason"]), "not TLS or HTTP")
		})
	})

	if strings.Contains(b.logs.String()+b.auditLog.String(), vault.RootToken) {
		t.Fatal("the Vault token is in the broker's output")
	}
}

// relayIntoBroker listens on the loopback of the broker's namespace and relays each
// connection to target in this one (a service the broker reaches as its own), returning
// the listening address.
func relayIntoBroker(t *testing.T, sn *sandboxNet, target string) string {
	t.Helper()
	ln := sn.listenInBroker(t, "127.0.0.1:0")
	t.Cleanup(func() { ln.Close() })
	relayFrom(ln, target)
	return ln.Addr().String()
}
