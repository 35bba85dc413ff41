package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	vaultapi "github.com/hashicorp/vault/api"
	"golang.org/x/crypto/ssh"

	"github.com/capbroker/capbroker/credentials/vaulttest"
	"github.com/capbroker/capbroker/internal/harness"
)

// The cost of git over SSH through the broker: a clone of a repository of -ssh-mb MiB through
// the broker's SSH front door (the agent's ssh jumps through it; the broker signs in to sshd
// with a certificate Vault signs) against ssh straight to the same sshd, in alternating
// rounds. sshd (Debian's openssh-server) serves the bare repository through git-shell on
// loopback; the repository is random data, which git cannot compress, so every byte of it
// crosses both paths.

// sshCloneResult is what -only ssh-clone prints.
type sshCloneResult struct {
	Skipped   string    `json:"skipped,omitempty"`
	RepoMiB   float64   `json:"repo_mib"`
	Broker    []float64 `json:"broker_seconds"`
	Direct    []float64 `json:"direct_seconds"`
	BrokerCPU []float64 `json:"broker_cpu_seconds"`
}

func (r sshCloneResult) print(w io.Writer) {
	if r.Skipped != "" {
		fmt.Fprintf(w, "ssh-clone: skipped: %s\n", r.Skipped)
		return
	}
	b, d := median(r.Broker), median(r.Direct)
	fmt.Fprintf(w, "ssh-clone of %.0f MiB, median of %d rounds: broker %.2fs (%.0f MiB/s), ssh direct %.2fs (%.0f MiB/s), broker/direct %.2f; broker CPU %.2fs per clone\n",
		r.RepoMiB, len(r.Broker), b, r.RepoMiB/b, d, r.RepoMiB/d, b/d, median(r.BrokerCPU))
}

// sshClone measures rounds clones each way of a repository of mb MiB.
func sshClone(ctx context.Context, bin, dir string, mb, rounds int) (sshCloneResult, error) {
	var r sshCloneResult
	if _, err := os.Stat("/usr/sbin/sshd"); err != nil {
		r.Skipped = "no /usr/sbin/sshd (scripts/install-test-tools.sh installs openssh-server)"
		return r, nil
	}
	if os.Geteuid() != 0 {
		r.Skipped = "sshd's git-shell account is root here: run the bench as root"
		return r, nil
	}
	dir = filepath.Join(dir, "ssh-clone")
	vaultAddr, stopVault, err := startVault(ctx, dir)
	if err != nil {
		return r, err
	}
	defer stopVault()
	vc, err := vaulttest.NewClient(vaultAddr, "root")
	if err != nil {
		return r, err
	}
	if err := vc.Sys().Mount("ssh", &vaultapi.MountInput{Type: "ssh"}); err != nil {
		return r, err
	}
	ca, err := vc.Logical().Write("ssh/config/ca", map[string]any{"generate_signing_key": true, "key_type": "ed25519"})
	if err != nil {
		return r, err
	}
	if _, err := vc.Logical().Write("ssh/roles/git", map[string]any{"key_type": "ca", "allow_user_certificates": true,
		"allowed_users": "git", "default_user": "git", "ttl": "2m", "max_ttl": "10m"}); err != nil {
		return r, err
	}

	// Keys: sshd's host key, the direct client's key, written as OpenSSH files.
	hostKey, hostPub, err := writeKey(filepath.Join(dir, "sshd_host_key"))
	if err != nil {
		return r, err
	}
	_, clientPub, err := writeKey(filepath.Join(dir, "client_key"))
	if err != nil {
		return r, err
	}
	repos := filepath.Join(dir, "repos")
	if err := makeRepo(filepath.Join(dir, "seed"), filepath.Join(repos, "big.git"), mb); err != nil {
		return r, err
	}
	r.RepoMiB = float64(mb)
	write := func(name, text string) error { return os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600) }
	sshdAddr, err := harness.FreeAddr()
	if err != nil {
		return r, err
	}
	if err := errors.Join(
		write("ca.pub", fmt.Sprint(ca.Data["public_key"])),
		write("principals", "git\n"),
		write("authorized_keys", clientPub),
		write("sshd_config", fmt.Sprintf(`ListenAddress %s
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
DisableForwarding yes
PermitTTY no
ForceCommand cd %s && exec git-shell -c "$SSH_ORIGINAL_COMMAND"
`, sshdAddr, hostKey, filepath.Join(dir, "ca.pub"), filepath.Join(dir, "principals"), filepath.Join(dir, "authorized_keys"), repos)),
	); err != nil {
		return r, err
	}
	sshd, err := startProcess(exec.Command("/usr/sbin/sshd", "-D", "-e", "-f", filepath.Join(dir, "sshd_config")), nil)
	if err != nil {
		return r, err
	}
	defer sshd.stop()
	if err := sshd.waitListening(sshdAddr, 10*time.Second); err != nil {
		return r, fmt.Errorf("sshd: %w", err)
	}

	// The broker: the SSH front door alone, an allow-all policy, the client on loopback
	// identified by its address.
	polDir := filepath.Join(dir, "policies")
	if err := mkdirAll(polDir); err != nil {
		return r, err
	}
	if err := writeAllowAll(polDir); err != nil {
		return r, err
	}
	if out, err := exec.Command(bin, "ca", "init", "--out", filepath.Join(dir, "ca")).CombinedOutput(); err != nil {
		return r, fmt.Errorf("ca init: %v: %s", err, out)
	}
	cfg := fmt.Sprintf(`proxy: {listen: "127.0.0.1:0"}
admin: {listen: "127.0.0.1:0", token_env: BENCH_ADMIN_TOKEN}
ca: {cert_file: %q, key_file: %q}
policy: {dir: %q, mode: enforce}
audit: {file: %q}
upstream: {allow_private: ["127.0.0.1/32"]}
agents:
  - {id: bench, addresses: ["127.0.0.1/32"]}
vault:
  address: %s
  auth: {method: token, token_env: BENCH_VAULT_TOKEN}
ssh:
  listen: "127.0.0.1:0"
  host_key_file: %q
  upstreams:
    - {host: git.bench, address: %q, user: root, known_hosts: [%q], vault_ssh: {role: git, principals: [git]}}
`, filepath.Join(dir, "ca", "ca.crt"), filepath.Join(dir, "ca", "ca.key"), polDir, filepath.Join(dir, "audit.log"),
		vaultAddr, filepath.Join(dir, "broker_ssh_key"), sshdAddr, "git.bench "+hostPub)
	if err := write("broker.yaml", cfg); err != nil {
		return r, err
	}
	listening := make(chan string, 1)
	cmd := exec.Command(bin, "run", "--config", filepath.Join(dir, "broker.yaml"))
	cmd.Env = append(harness.Env(), "BENCH_VAULT_TOKEN=root", "BENCH_ADMIN_TOKEN="+rand.Text())
	broker, err := startProcess(cmd, func(line string) {
		if strings.Contains(line, "listening for git over ssh") {
			var l struct{ SSH string }
			_ = json.Unmarshal([]byte(line), &l)
			listening <- l.SSH
		}
	})
	if err != nil {
		return r, err
	}
	defer broker.stop()
	var brokerAddr string
	select {
	case brokerAddr = <-listening:
	case <-broker.exited:
		return r, fmt.Errorf("broker: %s", broker.output())
	case <-time.After(30 * time.Second):
		return r, fmt.Errorf("broker not listening: %s", broker.output())
	}
	brokerPub, err := os.ReadFile(filepath.Join(dir, "broker_ssh_key.pub"))
	if err != nil {
		return r, err
	}
	bHost, bPort, _ := net.SplitHostPort(brokerAddr)
	sHost, sPort, _ := net.SplitHostPort(sshdAddr)
	bKey := strings.TrimSpace(string(brokerPub))
	if err := errors.Join(
		write("known_hosts", fmt.Sprintf("[%s]:%s %s\ngit.bench %s\n[%s]:%s %s\n", bHost, bPort, bKey, bKey, sHost, sPort, hostPub)),
		write("ssh_config", fmt.Sprintf(`Host capbroker
  HostName %s
  Port %s
  User bench
Host git.bench
  ProxyJump capbroker
Host git.direct
  HostName %s
  Port %s
  IdentityFile %s
  IdentitiesOnly yes
Host *
  UserKnownHostsFile %s
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
`, bHost, bPort, sHost, sPort, filepath.Join(dir, "client_key"), filepath.Join(dir, "known_hosts"))),
	); err != nil {
		return r, err
	}
	clone := func(url string) (float64, error) {
		out := filepath.Join(dir, "clone")
		_ = os.RemoveAll(out)
		c := exec.CommandContext(ctx, "git", "clone", "-q", "--bare", url, out)
		c.Env = append(harness.Env(), "GIT_SSH_COMMAND=ssh -F "+filepath.Join(dir, "ssh_config"))
		start := time.Now()
		if b, err := c.CombinedOutput(); err != nil {
			return 0, fmt.Errorf("git clone %s: %v: %s", url, err, b)
		}
		return time.Since(start).Seconds(), os.RemoveAll(out)
	}
	for i := range rounds + 1 { // the first round warms the caches, uncounted
		first := []string{"git@git.bench:big.git", "root@git.direct:big.git"}
		if i%2 == 1 {
			slices.Reverse(first)
		}
		for _, url := range first {
			cpu0 := broker.cpu()
			s, err := clone(url)
			if err != nil {
				return r, err
			}
			if i == 0 {
				continue
			}
			if strings.Contains(url, "git.bench") {
				r.Broker = append(r.Broker, s)
				r.BrokerCPU = append(r.BrokerCPU, (broker.cpu() - cpu0).Seconds())
			} else {
				r.Direct = append(r.Direct, s)
			}
		}
	}
	return r, nil
}

// writeKey writes a new ed25519 private key at path (0600) and returns the path and the
// public key as an authorized_keys line.
func writeKey(path string) (string, string, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", "", err
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		return "", "", err
	}
	if err := mkdirAll(filepath.Dir(path)); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		return "", "", err
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return "", "", err
	}
	return path, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey()))), nil
}

// makeRepo makes a bare repository at bare with one commit of mb files of 1 MiB of random
// data, packed, so that a clone reuses the pack as it is.
func makeRepo(work, bare string, mb int) error {
	if err := mkdirAll(work); err != nil {
		return err
	}
	git := func(dir string, args ...string) error {
		c := exec.Command("git", args...)
		c.Dir = dir
		c.Env = append(harness.Env(), "GIT_AUTHOR_NAME=bench", "GIT_AUTHOR_EMAIL=bench@bench", "GIT_COMMITTER_NAME=bench",
			"GIT_COMMITTER_EMAIL=bench@bench", "GIT_CONFIG_NOSYSTEM=1", "HOME="+work)
		if out, err := c.CombinedOutput(); err != nil {
			return fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := git(work, "init", "-q", "-b", "main", "."); err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for i := range mb {
		_, _ = rand.Read(buf)
		if err := os.WriteFile(filepath.Join(work, fmt.Sprintf("blob-%04d", i)), buf, 0o644); err != nil {
			return err
		}
	}
	if err := errors.Join(
		git(work, "-c", "core.compression=0", "add", "."),
		git(work, "commit", "-q", "-m", "random data"),
		git(filepath.Dir(work), "clone", "-q", "--bare", work, bare),
		git(bare, "-c", "pack.compression=0", "repack", "-q", "-a", "-d"),
	); err != nil {
		return err
	}
	return os.RemoveAll(work)
}
