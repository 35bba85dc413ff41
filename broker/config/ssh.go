package config

import (
	"fmt"
	"net"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// SSH is the broker's git-over-SSH front door (docs/ssh.md): agents reach it with ProxyJump
// (or GIT_SSH_COMMAND's -J), the broker decides what git does (policy phase "ssh") and
// signs in upstream with a key the agent never holds.
type SSH struct {
	// Listen is where agents connect ("" = the SSH front door is off).
	Listen string `yaml:"listen"`
	// HostKeyFile is the broker's own host key (OpenSSH private key, ed25519), created 0600
	// on first start when missing. agent-env prints its public key as known_hosts lines.
	HostKeyFile string `yaml:"host_key_file"`
	// IdleTimeout closes a session that moved no byte for this long (default 5m).
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxSessionsPerAgent caps one agent's git sessions at once (default 16).
	MaxSessionsPerAgent int `yaml:"max_sessions_per_agent"`
	// AgentKeys lists, by agent id, public keys (authorized_keys lines) the agent may sign in
	// with, as the SSH user of its id; its proxy token as the password works too.
	AgentKeys map[string][]string `yaml:"agent_keys"`
	// Upstreams are the git hosts agents may reach over SSH.
	Upstreams []SSHUpstream `yaml:"upstreams"`
}

// SSHUpstream is one git host.
type SSHUpstream struct {
	// Host is the name agents use (git@HOST:org/repo), Port its SSH port (default 22).
	Host string `yaml:"host"`
	Port int    `yaml:"port"`
	// Address, when set, is the host:port dialled instead of Host:Port (an internal name).
	Address string `yaml:"address"`
	// User is the SSH user upstream (default git).
	User string `yaml:"user"`
	// KnownHosts pins the host's keys: known_hosts lines (hashed names not allowed). An
	// unknown or changed key is refused; never trusted on first use.
	KnownHosts []string `yaml:"known_hosts"`
	// VaultSSH has Vault's SSH secrets engine sign an ephemeral key per connection; VaultKey
	// reads a private key (OpenSSH or PEM) from Vault KV. Exactly one.
	VaultSSH *SSHVaultSign `yaml:"vault_ssh"`
	VaultKey *VaultSource  `yaml:"vault_key"`
}

// SSHVaultSign is a role of Vault's SSH secrets engine.
type SSHVaultSign struct {
	Mount      string        `yaml:"mount"` // default "ssh"
	Role       string        `yaml:"role"`
	Principals []string      `yaml:"principals"` // default [user]
	TTL        time.Duration `yaml:"ttl"`        // default 2m, at most 10m
}

// SSH defaults.
const (
	DefaultSSHIdleTimeout         = 5 * time.Minute
	DefaultSSHMaxSessionsPerAgent = 16
	DefaultSSHCertTTL             = 2 * time.Minute
	MaxSSHCertTTL                 = 10 * time.Minute
)

func (s *SSH) defaults() {
	if s.IdleTimeout == 0 {
		s.IdleTimeout = DefaultSSHIdleTimeout
	}
	if s.MaxSessionsPerAgent == 0 {
		s.MaxSessionsPerAgent = DefaultSSHMaxSessionsPerAgent
	}
	for i := range s.Upstreams {
		u := &s.Upstreams[i]
		u.Host = strings.ToLower(u.Host)
		if u.Port == 0 {
			u.Port = 22
		}
		if u.User == "" {
			u.User = "git"
		}
		if v := u.VaultSSH; v != nil {
			if v.Mount == "" {
				v.Mount = "ssh"
			}
			if len(v.Principals) == 0 {
				v.Principals = []string{u.User}
			}
			if v.TTL == 0 {
				v.TTL = DefaultSSHCertTTL
			}
		}
		if v := u.VaultKey; v != nil && v.Mount == "" {
			v.Mount = "secret"
		}
	}
}

// UpstreamAddr is the address dialled for u.
func (u SSHUpstream) UpstreamAddr() string {
	if u.Address != "" {
		return u.Address
	}
	return net.JoinHostPort(u.Host, fmt.Sprint(u.Port))
}

func (c *Config) validateSSH(e *errs) (usesVault bool) {
	s := &c.SSH
	if s.Listen == "" {
		if len(s.Upstreams) > 0 {
			e.add("ssh.listen", "required when ssh.upstreams is set")
		}
		return false
	}
	checkListen(e, "ssh.listen", s.Listen)
	if s.HostKeyFile == "" {
		e.add("ssh.host_key_file", "required")
	}
	if s.IdleTimeout < 0 {
		e.add("ssh.idle_timeout", "must be positive")
	}
	if s.MaxSessionsPerAgent < 0 {
		e.add("ssh.max_sessions_per_agent", "must be positive")
	}
	ids := map[string]bool{}
	for _, a := range c.Agents {
		ids[a.ID] = true
	}
	for id, keys := range s.AgentKeys {
		if !ids[id] {
			e.add("ssh.agent_keys."+id, "no agent has this id")
		}
		for i, k := range keys {
			if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k)); err != nil {
				e.add(fmt.Sprintf("ssh.agent_keys.%s[%d]", id, i), "not an authorized_keys line: %v", err)
			}
		}
	}
	if len(s.Upstreams) == 0 {
		e.add("ssh.upstreams", "required: at least one git host")
	}
	seen := map[string]bool{}
	for i, u := range s.Upstreams {
		p := fmt.Sprintf("ssh.upstreams[%d]", i)
		if err := checkHostPattern(u.Host); err != nil || u.Host == "" || strings.HasPrefix(u.Host, "*") {
			e.add(p+".host", "must be a host name, not %q", u.Host)
		}
		key := fmt.Sprintf("%s:%d", u.Host, u.Port)
		if seen[key] {
			e.add(p+".host", "%s is listed twice", key)
		}
		seen[key] = true
		if u.Port < 1 || u.Port > 65535 {
			e.add(p+".port", "must be 1-65535")
		}
		if u.Address != "" {
			checkListen(e, p+".address", u.Address)
		}
		if len(u.KnownHosts) == 0 {
			e.add(p+".known_hosts", "required: the host's keys are pinned, never trusted on first use")
		}
		for j, line := range u.KnownHosts {
			_, hosts, _, _, _, err := ssh.ParseKnownHosts([]byte(line))
			switch {
			case err != nil:
				e.add(fmt.Sprintf("%s.known_hosts[%d]", p, j), "not a known_hosts line: %v", err)
			case strings.HasPrefix(line, "@") || strings.HasPrefix(hosts[0], "|"):
				e.add(fmt.Sprintf("%s.known_hosts[%d]", p, j), "markers and hashed names are not supported: give the key of the host")
			}
		}
		switch {
		case (u.VaultSSH == nil) == (u.VaultKey == nil):
			e.add(p, "set exactly one of vault_ssh, vault_key")
		case u.VaultSSH != nil:
			if u.VaultSSH.Role == "" {
				e.add(p+".vault_ssh.role", "required")
			}
			if u.VaultSSH.TTL < 0 || u.VaultSSH.TTL > MaxSSHCertTTL {
				e.add(p+".vault_ssh.ttl", "must be at most %s", MaxSSHCertTTL)
			}
		default:
			if u.VaultKey.Path == "" {
				e.add(p+".vault_key.path", "required")
			}
			if u.VaultKey.Field == "" {
				e.add(p+".vault_key.field", "required")
			}
			if u.VaultKey.Lease {
				e.add(p+".vault_key.lease", "not supported for a private key")
			}
		}
	}
	return true
}
