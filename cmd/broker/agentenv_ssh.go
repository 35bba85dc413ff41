package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/gitssh"
)

// sshAgentFiles is what an agent's ssh needs to reach git hosts through the broker's SSH
// front door: a known_hosts file pinning the broker's host key for the broker and for every
// git host name (the broker answers for them), an ssh_config making the broker the jump host
// of those names, and, for an agent with a proxy token, an askpass script that gives it.
type sshAgentFiles struct {
	dir                       string // where the agent finds the files
	knownHosts, config, pass  string
	gitSSHCommand, askpassEnv string
}

// sshFiles builds the files for agent a, the broker reached at addr (host:port), the files
// kept in dir. It needs the broker's host key: ssh.host_key_file (or its .pub beside it).
func sshFiles(cfg *config.Config, a config.Agent, token, addr, dir string) (*sshAgentFiles, error) {
	pub, err := gitssh.ReadPublicKey(cfg.SSH.HostKeyFile)
	if err != nil {
		return nil, fmt.Errorf("agent-env: the broker's ssh host key: %w (start the broker once to create it)", err)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("agent-env: --ssh %q: %w", addr, err)
	}
	key := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub)))
	f := &sshAgentFiles{dir: dir}
	var kh, names strings.Builder
	fmt.Fprintf(&kh, "[%s]:%s %s\n", host, port, key)
	for _, u := range cfg.SSH.Upstreams {
		name := u.Host
		if u.Port != 22 {
			name = fmt.Sprintf("[%s]:%d", u.Host, u.Port)
		}
		fmt.Fprintf(&kh, "%s %s\n", name, key)
		fmt.Fprintf(&names, " %s", u.Host)
	}
	f.knownHosts = kh.String()
	auth := "  PreferredAuthentications none,publickey\n"
	if token != "" {
		auth = "  PreferredAuthentications none,password\n"
		f.pass = fmt.Sprintf("#!/bin/sh\n# the agent's proxy token, its SSH password at the broker\nprintf '%%s\\n' %s\n", shellQuote(token))
		f.askpassEnv = filepath.Join(dir, "askpass")
	}
	f.config = fmt.Sprintf(`# git over SSH through capbroker: the broker is the jump host of every git host.
Host capbroker
  HostName %s
  Port %s
  User %s
%sHost%s
  ProxyJump capbroker
Host *
  UserKnownHostsFile %s
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  UpdateHostKeys no
  ForwardAgent no
`, host, port, a.ID, auth, names.String(), filepath.Join(dir, "known_hosts"))
	f.gitSSHCommand = "ssh -F " + filepath.Join(dir, "ssh_config")
	return f, nil
}

// env is the variables that make git use the files.
func (f *sshAgentFiles) env() []envVar {
	env := []envVar{{"GIT_SSH_COMMAND", f.gitSSHCommand}}
	if f.askpassEnv != "" {
		env = append(env, envVar{"SSH_ASKPASS", f.askpassEnv}, envVar{"SSH_ASKPASS_REQUIRE", "force"})
	}
	return env
}

// writeScript prints the files as shell that writes them (the sh format, for eval).
func (f *sshAgentFiles) writeScript(w io.Writer) {
	fmt.Fprintf(w, "# git over SSH: the broker's host key, pinned for it and every git host name\n")
	fmt.Fprintf(w, "mkdir -p %s\n", shellQuote(f.dir))
	files := []struct{ name, text, mode string }{{"known_hosts", f.knownHosts, "644"}, {"ssh_config", f.config, "644"}}
	if f.pass != "" {
		files = append(files, struct{ name, text, mode string }{"askpass", f.pass, "700"})
	}
	for _, file := range files {
		p := shellQuote(filepath.Join(f.dir, file.name))
		fmt.Fprintf(w, "cat > %s <<'CAPBROKER_EOF'\n%sCAPBROKER_EOF\nchmod %s %s\n", p, file.text, file.mode, p)
	}
}

// writeFiles writes the files into f.dir (agent-env --ssh-write).
func (f *sshAgentFiles) writeFiles() error {
	if err := os.MkdirAll(f.dir, 0o755); err != nil {
		return err
	}
	files := map[string]string{"known_hosts": f.knownHosts, "ssh_config": f.config}
	if f.pass != "" {
		files["askpass"] = f.pass
	}
	for name, text := range files {
		mode := os.FileMode(0o644)
		if name == "askpass" {
			mode = 0o700
		}
		if err := os.WriteFile(filepath.Join(f.dir, name), []byte(text), mode); err != nil {
			return err
		}
	}
	return nil
}
