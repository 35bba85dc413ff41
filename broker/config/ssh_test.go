package config

import (
	"strings"
	"testing"
)

// TestSSH: the ssh section's defaults, and every problem reported by its key path.
func TestSSH(t *testing.T) {
	const base = "ca: {cert_file: c, key_file: k}\npolicy: {dir: p}\nvault: {address: http://127.0.0.1:8200, auth: {method: token, token_env: V}}\nagents: [{id: a, addresses: [10.0.0.2]}]\n"
	const key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
	good := base + `ssh:
  listen: 127.0.0.1:2222
  host_key_file: k
  agent_keys: {a: ["` + key + `"]}
  upstreams:
    - {host: GitHub.com, known_hosts: ["github.com ` + key + `"], vault_ssh: {role: git}}
`
	c, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	u := c.SSH.Upstreams[0]
	if u.Host != "github.com" || u.Port != 22 || u.User != "git" || u.VaultSSH.Mount != "ssh" || u.VaultSSH.TTL != DefaultSSHCertTTL ||
		len(u.VaultSSH.Principals) != 1 || u.VaultSSH.Principals[0] != "git" || c.SSH.IdleTimeout != DefaultSSHIdleTimeout ||
		c.SSH.MaxSessionsPerAgent != DefaultSSHMaxSessionsPerAgent || u.UpstreamAddr() != "github.com:22" {
		t.Errorf("defaults: %+v %+v", c.SSH, u)
	}
	for src, want := range map[string]string{
		"ssh: {upstreams: [{host: x}]}\n":                                                                                                            "ssh.listen: required when ssh.upstreams is set",
		"ssh: {listen: 127.0.0.1:2222, host_key_file: k}\n":                                                                                          "ssh.upstreams: required",
		"ssh: {listen: nope, host_key_file: k}\n":                                                                                                    "ssh.listen: must be host:port",
		"ssh: {listen: 127.0.0.1:2222}\n":                                                                                                            "ssh.host_key_file: required",
		"ssh: {listen: 127.0.0.1:2222, host_key_file: k, agent_keys: {b: []}}\n":                                                                     "ssh.agent_keys.b: no agent has this id",
		"ssh: {listen: 127.0.0.1:2222, host_key_file: k, agent_keys: {a: [nope]}}\n":                                                                 "ssh.agent_keys.a[0]: not an authorized_keys line",
		"ssh: {listen: 127.0.0.1:2222, host_key_file: k, upstreams: [{host: g, vault_ssh: {role: r}}]}\n":                                            "ssh.upstreams[0].known_hosts: required",
		"ssh: {listen: 127.0.0.1:2222, host_key_file: k, upstreams: [{host: g, known_hosts: [junk], vault_ssh: {role: r}}]}\n":                       "ssh.upstreams[0].known_hosts[0]: not a known_hosts line",
		"ssh: {listen: 127.0.0.1:2222, host_key_file: k, upstreams: [{host: g, known_hosts: [\"|1|x|y " + key + "\"], vault_ssh: {role: r}}]}\n":     "hashed names are not supported",
		"ssh: {listen: 127.0.0.1:2222, host_key_file: k, upstreams: [{host: g, known_hosts: [\"g " + key + "\"]}]}\n":                                "ssh.upstreams[0]: set exactly one of vault_ssh, vault_key",
		"ssh: {listen: 127.0.0.1:2222, host_key_file: k, upstreams: [{host: g, known_hosts: [\"g " + key + "\"], vault_ssh: {}}]}\n":                 "ssh.upstreams[0].vault_ssh.role: required",
		"ssh: {listen: 127.0.0.1:2222, host_key_file: k, upstreams: [{host: g, known_hosts: [\"g " + key + "\"], vault_ssh: {role: r, ttl: 1h}}]}\n": "ssh.upstreams[0].vault_ssh.ttl: must be at most 10m0s",
		"ssh: {listen: 127.0.0.1:2222, host_key_file: k, upstreams: [{host: g, known_hosts: [\"g " + key + "\"], vault_key: {path: p}}]}\n":          "ssh.upstreams[0].vault_key.field: required",
		"ssh: {listen: 127.0.0.1:2222, host_key_file: k, upstreams: [{host: \"*.g\", known_hosts: [\"g " + key + "\"], vault_ssh: {role: r}}]}\n":    "ssh.upstreams[0].host: must be a host name",
	} {
		if _, err := Parse([]byte(base + src)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want %q", src, err, want)
		}
	}
	noVault := strings.Replace(good, "vault: {address: http://127.0.0.1:8200, auth: {method: token, token_env: V}}\n", "", 1)
	if _, err := Parse([]byte(noVault)); err == nil || !strings.Contains(err.Error(), "vault: required: ssh.upstreams sign in with keys from vault") {
		t.Errorf("no vault: %v", err)
	}
}
