//go:build linux

package integration

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	vaultapi "github.com/hashicorp/vault/api"
	"golang.org/x/crypto/ssh"

	"github.com/capbroker/capbroker/credentials/vaulttest"
	"github.com/capbroker/capbroker/internal/harness"
)

// The git-over-SSH topology: the agent in a network namespace of its own whose one link
// leads to the broker's SSH front door; OpenSSH's sshd as the git host on this namespace's
// loopback, trusting Vault's SSH CA and serving bare repositories through git-shell.
//
//	agent namespace (git, ssh as nobody)        this namespace
//	 10.237.N.2  ---- veth /30 ---->  10.237.N.1  broker ssh.listen
//	                                             127.0.0.1  sshd (git-shell), Vault
//
// The agent's loopback is its own, so sshd and Vault are out of its reach but through the
// broker.

// requireSSHTools skips (fails with CAPBROKER_REQUIRE_VAULT=1, as in CI) without root or the
// OpenSSH server and client, git and git-shell.
func requireSSHTools(t *testing.T) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (network namespaces, sshd)")
	}
	if fakeTimeLib(t) == "" {
		missing = append(missing, "libfaketime")
	}
	for _, tool := range []string{"/usr/sbin/sshd", "ssh", "git", "git-shell", "ip", "setpriv"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) == 0 {
		return
	}
	if os.Getenv("CAPBROKER_REQUIRE_VAULT") == "1" || os.Getenv("CI") != "" {
		t.Fatalf("missing for the git-over-SSH tests: %s (scripts/install-test-tools.sh installs openssh-server and faketime)", strings.Join(missing, ", "))
	}
	t.Skipf("skipped: missing %s (scripts/install-test-tools.sh installs openssh-server and faketime)", strings.Join(missing, ", "))
}

// fakeTimeLib is Debian's libfaketime (package faketime), or "".
func fakeTimeLib(t *testing.T) string {
	libs, _ := filepath.Glob("/usr/lib/*/faketime/libfaketime.so.1")
	if len(libs) == 0 {
		return ""
	}
	return libs[0]
}

// sshAgentNet is the agent's namespace and its one link.
type sshAgentNet struct {
	ns, hostIP, agentIP, dir string
}

func newSSHAgentNet(t *testing.T) *sshAgentNet {
	t.Helper()
	id := randHex(4)
	var n [1]byte
	_, _ = rand.Read(n[:])
	s := &sshAgentNet{ns: "cbssh-" + id, hostIP: fmt.Sprintf("10.237.%d.1", n[0]), agentIP: fmt.Sprintf("10.237.%d.2", n[0])}
	vethH, vethA := "cbssh"+id+"h", "cbssh"+id+"a"
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "del", s.ns).Run() // takes the veth pair with it
		_ = exec.Command("ip", "link", "del", vethH).Run()
	})
	ipCmd(t, "netns", "add", s.ns)
	ipCmd(t, "link", "add", vethH, "type", "veth", "peer", "name", vethA)
	ipCmd(t, "link", "set", vethA, "netns", s.ns)
	ipCmd(t, "addr", "add", s.hostIP+"/30", "dev", vethH)
	ipCmd(t, "link", "set", vethH, "up")
	ipCmd(t, "-n", s.ns, "addr", "add", s.agentIP+"/30", "dev", vethA)
	ipCmd(t, "-n", s.ns, "link", "set", "lo", "up")
	ipCmd(t, "-n", s.ns, "link", "set", vethA, "up")
	dir, err := os.MkdirTemp("", "cbssh-agent-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	s.dir = dir
	return s
}

// run runs argv in the agent's namespace as nobody, in dir (relative to the agent's home),
// with only env.
func (s *sshAgentNet) run(t *testing.T, dir string, env []string, argv ...string) (string, error) {
	t.Helper()
	args := append([]string{"netns", "exec", s.ns, "setpriv", "--reuid", agentUID, "--regid", agentUID, "--clear-groups", "env", "-i"}, env...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // a bound: a hung git fails the test
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", append(args, argv...)...)
	cmd.WaitDelay = 5 * time.Second // ssh's children may hold the output open
	cmd.Dir = filepath.Join(s.dir, dir)
	cmd.Env = []string{"PATH=" + agentPath}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// gitHost is sshd serving bare repositories under dir/repos through git-shell.
type gitHost struct {
	dir     string
	logs    *logTail
	addr    string
	hostKey ssh.PublicKey
	repos   string
}

// startGitHost starts sshd with env added to its environment (libfaketime's, for a host
// whose clock is an hour ahead: every certificate Vault signs has expired for it).
func startGitHost(t *testing.T, caPub string, env ...string) *gitHost {
	t.Helper()
	dir, err := os.MkdirTemp("", "cbssh-sshd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "host_key")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	signer, _ := ssh.NewSignerFromKey(priv)
	g := &gitHost{hostKey: signer.PublicKey(), repos: filepath.Join(dir, "repos")}
	must(t, os.MkdirAll(g.repos, 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "ca.pub"), []byte(caPub), 0o644))
	// The certificates Vault signs carry the principal "git"; the account is root, whose
	// every command is git-shell's in the repositories' folder.
	must(t, os.WriteFile(filepath.Join(dir, "principals"), []byte("git\n"), 0o644))
	// The deploy key a team keeps in Vault KV (vault_key) instead of certificates.
	g.dir = dir
	must(t, os.WriteFile(filepath.Join(dir, "authorized_keys"), nil, 0o644))
	must(t, os.MkdirAll("/run/sshd", 0o755)) // sshd's privilege separation directory
	for attempt := 0; ; attempt++ {
		addr, err := harness.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		conf := filepath.Join(dir, "sshd_config")
		must(t, os.WriteFile(conf, fmt.Appendf(nil, `ListenAddress %s
HostKey %s
PidFile none
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
AuthenticationMethods publickey
PasswordAuthentication no
KbdInteractiveAuthentication no
TrustedUserCAKeys %s
AuthorizedPrincipalsFile %s
AuthorizedKeysFile %s
AllowUsers root
AcceptEnv GIT_PROTOCOL
DisableForwarding yes
PermitTTY no
ForceCommand cd %s && exec git-shell -c "$SSH_ORIGINAL_COMMAND"
LogLevel VERBOSE
`, addr, keyFile, filepath.Join(dir, "ca.pub"), filepath.Join(dir, "principals"), filepath.Join(dir, "authorized_keys"), g.repos), 0o600))
		logs := newLogTail()
		cmd := exec.Command("/usr/sbin/sshd", "-D", "-e", "-f", conf)
		cmd.Env = append(harness.Env(), env...)
		cmd.WaitDelay = 5 * time.Second
		cmd.Stdout, cmd.Stderr = logs, logs
		must(t, cmd.Start())
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); logs.Write([]byte("sshd exited\n")); close(exited) }()
		t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
		line := logs.wait(t, "Server listening on")
		if strings.Contains(line, "sshd exited") || !strings.Contains(logs.String(), "Server listening on") {
			if attempt < 3 && strings.Contains(logs.String(), "Address already in use") {
				continue
			}
			t.Fatalf("sshd did not start:\n%s", logs.String())
		}
		g.addr, g.logs = addr, logs
		return g
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// git runs git in this namespace (the git host's side, seeding and checking repositories).
func hostGit(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(harness.Env(), "GIT_AUTHOR_NAME=host", "GIT_AUTHOR_EMAIL=host@git.test",
		"GIT_COMMITTER_NAME=host", "GIT_COMMITTER_EMAIL=host@git.test", "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// sshPolicies is policies/ (the shipped .rego files) with data.yaml's git hosts and
// pushes set for the test's hosts.
func sshPolicies(t *testing.T, gitHosts, pushRepos string) (broker string, files map[string]string) {
	t.Helper()
	files = map[string]string{}
	names, _ := filepath.Glob("../policies/*.rego")
	for _, n := range names {
		if strings.HasSuffix(n, "_test.rego") {
			continue
		}
		b, err := os.ReadFile(n)
		must(t, err)
		files[filepath.Base(n)] = string(b)
	}
	data, err := os.ReadFile("../policies/data.yaml")
	must(t, err)
	d := string(data)
	for old, repl := range map[string]string{
		"  git:\n    github.com: true\n    gitlab.com: true\n": "  git:\n" + gitHosts,
		"    repositories: []\n    branches: [\"agent/*\"]":    "    repositories: " + pushRepos + "\n    branches: [\"agent/*\"]",
	} {
		if !strings.Contains(d, old) {
			t.Fatalf("policies/data.yaml no longer has %q", old)
		}
		d = strings.Replace(d, old, repl, 1)
	}
	files["data.yaml"] = d
	broker = files["broker.rego"]
	delete(files, "broker.rego")
	return broker, files
}

// startSSHVault starts a Vault whose SSH engine signs user certificates for "git" (role
// "git", minutes long), and returns it with the CA's public key for the git host to trust.
func startSSHVault(t *testing.T) (*vaulttest.Server, string) {
	t.Helper()
	vault := vaulttest.Start(t)
	vc := vault.Client()
	must(t, vc.Sys().Mount("ssh", &vaultapi.MountInput{Type: "ssh"}))
	ca, err := vc.Logical().Write("ssh/config/ca", map[string]any{"generate_signing_key": true, "key_type": "ed25519"})
	must(t, err)
	caPub, _ := ca.Data["public_key"].(string)
	_, err = vc.Logical().Write("ssh/roles/git", map[string]any{
		"key_type": "ca", "allow_user_certificates": true, "allowed_users": "git", "default_user": "git",
		"ttl": "2m", "max_ttl": "10m",
	})
	must(t, err)
	return vault, caPub
}

func TestSSHGitThroughBroker(t *testing.T) {
	requireSSHTools(t)
	vault, caPub := startSSHVault(t)
	vc := vault.Client()

	host := startGitHost(t, caPub)
	late := startGitHost(t, caPub, "FAKETIME=+1h", "LD_PRELOAD="+fakeTimeLib(t))
	// The repository: org/repo.git with one commit on main.
	seed := t.TempDir()
	hostGit(t, host.repos, "init", "-q", "--bare", "-b", "main", "org/repo.git")
	hostGit(t, seed, "init", "-q", "-b", "main", "w")
	must(t, os.WriteFile(filepath.Join(seed, "w", "README"), []byte("hello from the git host\n"), 0o644))
	hostGit(t, filepath.Join(seed, "w"), "add", "README")
	hostGit(t, filepath.Join(seed, "w"), "commit", "-q", "-m", "first")
	hostGit(t, filepath.Join(seed, "w"), "push", "-q", filepath.Join(host.repos, "org/repo.git"), "main")

	// A deploy key held in Vault KV, authorised on the git host: the vault_key way in.
	_, deployKey, _ := ed25519.GenerateKey(rand.Reader)
	deployPEM, err := ssh.MarshalPrivateKey(deployKey, "")
	must(t, err)
	deploySigner, _ := ssh.NewSignerFromKey(deployKey)
	must(t, os.WriteFile(filepath.Join(host.dir, "authorized_keys"), ssh.MarshalAuthorizedKey(deploySigner.PublicKey()), 0o644))
	deployText := string(pem.EncodeToMemory(deployPEM))
	_, err = vc.KVv2("secret").Put(t.Context(), "deploy-keys/git", map[string]any{"private_key": deployText})
	must(t, err)

	an := newSSHAgentNet(t)
	_, otherKey, _ := ed25519.GenerateKey(rand.Reader)
	otherSigner, _ := ssh.NewSignerFromKey(otherKey)
	known := func(name string, k ssh.PublicKey) string {
		return strings.TrimSpace(name + " " + string(ssh.MarshalAuthorizedKey(k)))
	}
	policyText, files := sshPolicies(t, "    git.test: true\n    evil.test: true\n    late.test: true\n    kv.test: true\n", "[org/*]")
	brokerDir := t.TempDir()
	b := startBroker(t, brokerOpts{
		policy: policyText, files: files, mode: "enforce",
		env: []string{"BROKER_VAULT_TOKEN=" + vault.RootToken},
		config: fmt.Sprintf(`upstream:
  allow_private: ["127.0.0.1/32"]
agents:
  - {id: coder, addresses: [%q]}
vault:
  address: %s
  auth: {method: token, token_env: BROKER_VAULT_TOKEN}
ssh:
  listen: %q
  host_key_file: %q
  upstreams:
    - host: git.test
      address: %q
      user: root
      known_hosts: [%q]
      vault_ssh: {role: git, principals: [git]}
    - host: evil.test
      address: %q
      user: root
      known_hosts: [%q]
      vault_ssh: {role: git, principals: [git]}
    - host: kv.test
      address: %q
      user: root
      known_hosts: [%q]
      vault_key: {mount: secret, path: deploy-keys/git, field: private_key}
    - host: late.test
      address: %q
      user: root
      known_hosts: [%q]
      vault_ssh: {role: git, principals: [git]}
`, an.agentIP+"/32", vault.Addr, an.hostIP+":0", filepath.Join(brokerDir, "ssh_host_key"),
			host.addr, known("git.test", host.hostKey), host.addr, known("evil.test", otherSigner.PublicKey()),
			host.addr, known("kv.test", host.hostKey), late.addr, known("late.test", late.hostKey)),
	})
	line := b.logs.wait(t, "listening for git over ssh")
	var l struct{ SSH string }
	must(t, json.Unmarshal([]byte(line), &l))
	_, port, _ := net.SplitHostPort(l.SSH)

	// The agent's side, as `broker agent-env` writes it: the broker's host key pinned for
	// the broker and for each git host name, the broker as their jump host.
	sshDir := filepath.Join(an.dir, "ssh")
	out, err := exec.Command(brokerBin, "agent-env", "--config", filepath.Join(b.dir, "broker.yaml"), "--agent", "coder",
		"--ssh", net.JoinHostPort(an.hostIP, port), "--ssh-dir", sshDir, "--ssh-write", "--format", "env").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "GIT_SSH_COMMAND=ssh -F "+sshDir+"/ssh_config\n") {
		t.Fatalf("agent-env: %v\n%s", err, out)
	}
	env := []string{"PATH=" + agentPath, "HOME=" + an.dir, "GIT_SSH_COMMAND=ssh -o BatchMode=yes -F " + filepath.Join(sshDir, "ssh_config"),
		"GIT_AUTHOR_NAME=agent", "GIT_AUTHOR_EMAIL=agent@sandbox", "GIT_COMMITTER_NAME=agent", "GIT_COMMITTER_EMAIL=agent@sandbox",
		"GIT_CONFIG_NOSYSTEM=1"}
	sshCmd := []string{"ssh", "-o", "BatchMode=yes", "-F", filepath.Join(sshDir, "ssh_config")}
	bare := filepath.Join(host.repos, "org/repo.git")

	lastEvent := func(t *testing.T, what string, match func(auditEvent) bool) auditEvent {
		t.Helper()
		evs := b.waitAuditWhere(t, 1, what, func(e auditEvent) bool { return e["phase"] == "ssh" && match(e) })
		return evs[len(evs)-1]
	}
	sshObj := func(e auditEvent) map[string]any { m, _ := e["ssh"].(map[string]any); return m }

	t.Run("clone", func(t *testing.T) {
		out, err := an.run(t, "", env, "git", "clone", "git@git.test:org/repo.git", "work")
		if err != nil {
			t.Fatalf("clone: %v\n%s", err, out)
		}
		got, err := os.ReadFile(filepath.Join(an.dir, "work", "README"))
		if err != nil || string(got) != "hello from the git host\n" {
			t.Fatalf("cloned README = %q, %v", got, err)
		}
		ev := lastEvent(t, "the clone's audit event", func(e auditEvent) bool {
			return sshObj(e)["service"] == "fetch" && e["decision"] == "allow"
		})
		if s := sshObj(ev); s["repository"] != "org/repo.git" || s["host"] != "git.test" || s["user"] != "git" || ev["agent"] != "coder" {
			t.Errorf("audit event %v", ev)
		}
		if ev["bytes_out"].(float64) <= 0 || ev["bytes_in"].(float64) <= 0 {
			t.Errorf("bytes not counted: %v", ev)
		}
	})

	t.Run("fetch", func(t *testing.T) {
		w := filepath.Join(seed, "w")
		must(t, os.WriteFile(filepath.Join(w, "NEWS"), []byte("second\n"), 0o644))
		hostGit(t, w, "add", "NEWS")
		hostGit(t, w, "commit", "-q", "-m", "second")
		hostGit(t, w, "push", "-q", bare, "main")
		want := hostGit(t, bare, "rev-parse", "main")
		out, err := an.run(t, "work", env, "git", "fetch", "origin")
		if err != nil {
			t.Fatalf("fetch: %v\n%s", err, out)
		}
		got, _ := an.run(t, "work", env, "git", "rev-parse", "origin/main")
		if strings.TrimSpace(got) != want {
			t.Fatalf("origin/main = %q after fetch, want %s", got, want)
		}
		if out, err := an.run(t, "work", env, "git", "merge", "-q", "--ff-only", "origin/main"); err != nil {
			t.Fatalf("merge: %v\n%s", err, out)
		}
	})

	t.Run("archive", func(t *testing.T) {
		out, err := an.run(t, "", env, "git", "archive", "--remote=git@git.test:org/repo.git", "--output=repo.tar", "main", "README")
		if err != nil {
			t.Fatalf("archive: %v\n%s", err, out)
		}
		if st, err := os.Stat(filepath.Join(an.dir, "repo.tar")); err != nil || st.Size() == 0 {
			t.Fatalf("archive: %v", err)
		}
		lastEvent(t, "the archive's audit event", func(e auditEvent) bool {
			return sshObj(e)["service"] == "archive" && e["decision"] == "allow"
		})
	})

	commit := func(t *testing.T, msg string) string {
		t.Helper()
		must(t, os.WriteFile(filepath.Join(an.dir, "work", msg), []byte(msg+"\n"), 0o644))
		if out, err := an.run(t, "work", env, "git", "add", msg); err != nil {
			t.Fatalf("add: %v\n%s", err, out)
		}
		if out, err := an.run(t, "work", env, "git", "commit", "-q", "-m", msg); err != nil {
			t.Fatalf("commit: %v\n%s", err, out)
		}
		out, _ := an.run(t, "work", env, "git", "rev-parse", "HEAD")
		return strings.TrimSpace(out)
	}

	t.Run("push to an allowed branch", func(t *testing.T) {
		head := commit(t, "agent-work")
		out, err := an.run(t, "work", env, "git", "push", "origin", "HEAD:refs/heads/agent/fix-1")
		if err != nil {
			t.Fatalf("push: %v\n%s", err, out)
		}
		if got := hostGit(t, bare, "rev-parse", "agent/fix-1"); got != head {
			t.Fatalf("agent/fix-1 upstream = %s, want %s", got, head)
		}
		ev := lastEvent(t, "the push's audit event", func(e auditEvent) bool {
			return sshObj(e)["service"] == "push" && e["decision"] == "allow"
		})
		refs, _ := sshObj(ev)["refs"].([]any)
		if len(refs) != 1 || refs[0].(map[string]any)["name"] != "refs/heads/agent/fix-1" || refs[0].(map[string]any)["new"] != head {
			t.Errorf("refs in the audit event: %v", refs)
		}
	})

	t.Run("push to main is refused before the git host gets it", func(t *testing.T) {
		before := hostGit(t, bare, "rev-parse", "main")
		head := commit(t, "sneaky")
		out, err := an.run(t, "work", env, "git", "push", "origin", "HEAD:main")
		if err == nil {
			t.Fatalf("push to main succeeded:\n%s", out)
		}
		t.Logf("git push origin HEAD:main:\n%s", out)
		for _, want := range []string{"remote: capbroker: push denied: pushing refs/heads/main is not allowed", "[remote rejected]"} {
			if !strings.Contains(out, want) {
				t.Errorf("git's output lacks %q:\n%s", want, out)
			}
		}
		if got := hostGit(t, bare, "rev-parse", "main"); got != before {
			t.Fatalf("main moved upstream to %s", got)
		}
		// Not a byte of the pack reached the git host: the commit is not there at all.
		if err := exec.Command("git", "-C", bare, "cat-file", "-e", head).Run(); err == nil {
			t.Fatalf("the refused commit %s reached the git host", head)
		}
		ev := lastEvent(t, "the refused push's audit event", func(e auditEvent) bool {
			return sshObj(e)["service"] == "push" && e["decision"] == "deny"
		})
		if refs, _ := sshObj(ev)["refs"].([]any); len(refs) != 1 || refs[0].(map[string]any)["name"] != "refs/heads/main" {
			t.Errorf("refs in the audit event: %v", ev)
		}
	})

	t.Run("a push to a repository not listed is refused before the git host is asked", func(t *testing.T) {
		hostGit(t, host.repos, "init", "-q", "--bare", "-b", "main", "other/repo.git")
		signIns := strings.Count(host.logs.String(), "Accepted ")
		out, err := an.run(t, "work", env, "git", "push", "git@git.test:other/repo.git", "HEAD:refs/heads/agent/x")
		if err == nil || !strings.Contains(out, "fatal: remote error: capbroker: denied: pushing to other/repo.git on git.test is not allowed") {
			t.Fatalf("push: %v\n%s", err, out)
		}
		if n := strings.Count(host.logs.String(), "Accepted "); n != signIns {
			t.Fatalf("the broker signed in to the git host for a refused push (%d sign-ins, was %d)", n, signIns)
		}
	})

	t.Run("a shell is refused", func(t *testing.T) {
		out, err := an.run(t, "", env, append(sshCmd, "git@git.test")...)
		if err == nil || !strings.Contains(out, "an interactive shell is not allowed through the broker") {
			t.Fatalf("shell: %v\n%s", err, out)
		}
		out, err = an.run(t, "", env, append(sshCmd, "git@git.test", "sh -c id")...)
		if err == nil || !strings.Contains(out, "only git-upload-pack, git-receive-pack and git-upload-archive") || strings.Contains(out, "uid=") {
			t.Fatalf("exec: %v\n%s", err, out)
		}
		// A repository outside the git user's folder, in the spellings git-shell would take.
		for _, cmd := range []string{"git-upload-pack '../../etc'", "git-upload-pack '/../etc'", "git-receive-pack 'org/../../x.git'"} {
			out, err := an.run(t, "", env, append(sshCmd, "git@git.test", cmd)...)
			if err == nil || !strings.Contains(out, "the repository path must be relative segments") {
				t.Errorf("%s: %v\n%s", cmd, err, out)
			}
		}
		lastEvent(t, "the shell's audit event", func(e auditEvent) bool {
			return e["decision"] == "deny" && strings.Contains(fmt.Sprint(e["reason"]), "interactive shell")
		})
	})

	t.Run("port forwarding is refused", func(t *testing.T) {
		// Through the git host's connection, and through the jump host to anything else;
		// a remote forward is refused too (ExitOnForwardFailure makes ssh say so).
		out, err := an.run(t, "", env, append(sshCmd, "-o", "ExitOnForwardFailure=yes", "-R", "127.0.0.1:2022:127.0.0.1:22", "git@git.test", "git-upload-pack 'org/repo.git'")...)
		if err == nil || !strings.Contains(out, "remote port forwarding failed") {
			t.Errorf("remote forward: %v\n%s", err, out)
		}
		lastEvent(t, "the remote forward's audit event", func(e auditEvent) bool {
			return e["decision"] == "deny" && strings.Contains(fmt.Sprint(e["reason"]), "tcpip-forward")
		})
		for _, argv := range [][]string{
			append(sshCmd, "-W", host.addr, "git@git.test"),
			append(sshCmd, "-W", host.addr, "capbroker"),
		} {
			out, err := an.run(t, "", env, argv...)
			if err == nil || !strings.Contains(out, "prohibited") || strings.Contains(out, "SSH-2.0-OpenSSH") {
				t.Errorf("%v: %v\n%s", argv, err, out)
			}
		}
		lastEvent(t, "the forward's audit event", func(e auditEvent) bool {
			return e["decision"] == "deny" && strings.Contains(fmt.Sprint(e["reason"]), "port forwarding")
		})
	})

	t.Run("an unknown host key is refused", func(t *testing.T) {
		out, err := an.run(t, "", env, "git", "ls-remote", "git@evil.test:org/repo.git")
		if err == nil || !strings.Contains(out, "host_key_mismatch") {
			t.Fatalf("ls-remote: %v\n%s", err, out)
		}
		t.Logf("git ls-remote, upstream key not pinned:\n%s", out)
		lastEvent(t, "the host key's audit event", func(e auditEvent) bool {
			return e["host"] == "evil.test" && e["decision"] == "deny" && strings.Contains(fmt.Sprint(e["reason"]), "host_key_mismatch")
		})
	})

	t.Run("clone with a deploy key from Vault KV", func(t *testing.T) {
		out, err := an.run(t, "", env, "git", "clone", "git@kv.test:org/repo.git", "work-kv")
		if err != nil {
			t.Fatalf("clone: %v\n%s", err, out)
		}
		if _, err := os.Stat(filepath.Join(an.dir, "work-kv", "README")); err != nil {
			t.Fatal(err)
		}
		// Held in memory only: nowhere on the broker's disk, and in no log.
		filepath.WalkDir(b.dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				if body, _ := os.ReadFile(p); strings.Contains(string(body), strings.Split(deployText, "\n")[1]) {
					t.Errorf("the deploy key is written in %s", p)
				}
			}
			return nil
		})
	})

	t.Run("an expired certificate is refused by the git host", func(t *testing.T) {
		out, err := an.run(t, "", env, "git", "ls-remote", "git@late.test:org/repo.git")
		if err == nil || !strings.Contains(out, "upstream_auth_refused: late.test refused the broker's certificate") {
			t.Fatalf("ls-remote: %v\n%s", err, out)
		}
		if !strings.Contains(late.logs.String(), "expired") {
			t.Errorf("sshd did not log an expired certificate:\n%s", late.logs.String())
		}
	})

	t.Run("the git host is out of the agent's reach but through the broker", func(t *testing.T) {
		_, p, _ := net.SplitHostPort(host.addr)
		out, err := an.run(t, "", env, "ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3", "-p", p, "root@127.0.0.1", "true")
		if err == nil || !strings.Contains(out, "refused") {
			t.Fatalf("direct ssh to the git host: %v\n%s", err, out)
		}
	})

	t.Run("vault down", func(t *testing.T) {
		vault.Stop()
		out, err := an.run(t, "", env, "git", "ls-remote", "git@git.test:org/repo.git")
		if err == nil || !strings.Contains(out, "credential_unavailable") {
			t.Fatalf("ls-remote with Vault down: %v\n%s", err, out)
		}
		t.Logf("git ls-remote with Vault down:\n%s", out)
	})

	t.Run("metrics by service", func(t *testing.T) {
		resp, err := http.Get("http://" + b.adminAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, want := range []string{
			`capbroker_ssh_sessions_total{decision="allow",service="fetch"}`,
			`capbroker_ssh_sessions_total{decision="deny",service="push"} 2`,
			`capbroker_ssh_bytes_total{direction="out",service="fetch"}`,
		} {
			if !strings.Contains(string(body), want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
	})

	// One event per session: what git did raised no refusal of its own (OpenSSH's global
	// requests, keepalives), so every deny above was one of the attacks.
	for _, e := range b.audit(t) {
		if e["phase"] == "ssh" && e["decision"] == "deny" && strings.Contains(fmt.Sprint(e["reason"]), "@openssh.com") {
			t.Errorf("a routine request of ssh's was audited as refused: %v", e)
		}
	}
	// No secret in any log: neither the Vault token nor any line of the deploy key.
	for _, text := range []string{b.logs.String(), b.auditLog.String()} {
		if strings.Contains(text, vault.RootToken) {
			t.Fatal("the Vault token is in the broker's output")
		}
		for _, line := range strings.Split(deployText, "\n")[1:3] {
			if strings.Contains(text, line) {
				t.Fatal("the deploy key is in the broker's output")
			}
		}
	}
}
