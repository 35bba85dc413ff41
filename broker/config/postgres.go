package config

import (
	"fmt"
	"net"
	"regexp"
	"strings"
	"time"
)

// Postgres is the Postgres front door (docs/postgres.md): agents connect with any Postgres
// client, the database name choosing one of Upstreams; the broker logs in upstream with a
// database user Vault issues per connection, never shown to the agent.
type Postgres struct {
	// Listen is where agents connect ("" = no Postgres front door).
	Listen string `yaml:"listen"`
	// TLS is the agent side's TLS, with a leaf of the broker's CA: "optional" (default: the
	// client chooses), "required" (a connection without TLS is refused) or "off".
	TLS string `yaml:"tls"`
	// Statements asks the policy about every statement (the statement phase); off, the
	// policy decides each connection only.
	Statements bool `yaml:"statements"`
	// MaxConnectionsPerAgent caps one agent's connections at once (default 16).
	MaxConnectionsPerAgent int `yaml:"max_connections_per_agent"`
	// IdleTimeout closes a connection with no message either way for this long (default 15m).
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// Upstreams are the databases agents may name.
	Upstreams []PostgresUpstream `yaml:"upstreams"`
}

// PostgresUpstream is one database behind the front door.
type PostgresUpstream struct {
	// Name is the database name agents connect to.
	Name string `yaml:"name"`
	// Address is the server's host:port.
	Address string `yaml:"address"`
	// Database is the database's name on the server (default Name).
	Database string `yaml:"database"`
	// TLS is "verify-full" (default: the server's certificate verified against CAFile, or the
	// system roots, for ServerName) or "disable" (a server on loopback only, for development).
	TLS        string `yaml:"tls"`
	CAFile     string `yaml:"ca_file"`
	ServerName string `yaml:"server_name"`
	// Vault issues a database user per connection: Mount/creds/ROLE, ROLE as the policy's
	// decision names it (`role`), else DefaultRole.
	Vault *PostgresVault `yaml:"vault"`
	// Static is a database user read from Vault KV (fields username and password), used when
	// no role applies.
	Static *VaultSource `yaml:"static"`
}

// PostgresVault is the database secrets engine that issues users for one upstream.
type PostgresVault struct {
	Mount       string   `yaml:"mount"`        // default "database"
	DefaultRole string   `yaml:"default_role"` // when the decision names no role
	Roles       []string `yaml:"roles"`        // the roles a decision may name (default: DefaultRole only)
}

// Postgres defaults.
const (
	DefaultPostgresMaxConnsPerAgent = 16
	DefaultPostgresIdleTimeout      = 15 * time.Minute
	PostgresTLSOptional             = "optional"
	PostgresTLSRequired             = "required"
	PostgresTLSOff                  = "off"
)

var pgNameRe = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$`)

func (p *Postgres) defaults() {
	if p.Listen == "" {
		return
	}
	if p.TLS == "" {
		p.TLS = PostgresTLSOptional
	}
	if p.MaxConnectionsPerAgent == 0 {
		p.MaxConnectionsPerAgent = DefaultPostgresMaxConnsPerAgent
	}
	if p.IdleTimeout == 0 {
		p.IdleTimeout = DefaultPostgresIdleTimeout
	}
	for i := range p.Upstreams {
		u := &p.Upstreams[i]
		if u.Database == "" {
			u.Database = u.Name
		}
		if u.TLS == "" {
			u.TLS = "verify-full"
		}
		if u.Vault != nil && u.Vault.Mount == "" {
			u.Vault.Mount = "database"
		}
		if s := u.Static; s != nil && s.KVVersion == 0 {
			s.KVVersion = 2
		}
	}
}

// Role reports whether a decision may name role for u.
func (u *PostgresUpstream) Role(role string) bool {
	v := u.Vault
	if v == nil || role == "" {
		return false
	}
	if role == v.DefaultRole {
		return true
	}
	for _, r := range v.Roles {
		if r == role {
			return true
		}
	}
	return false
}

// validatePostgres reports the section's problems; usesVault says whether it reads Vault.
func (c *Config) validatePostgres(e *errs) (usesVault bool) {
	p := &c.Postgres
	if p.Listen == "" {
		if len(p.Upstreams) > 0 {
			e.add("postgres.listen", "required when postgres.upstreams are configured")
		}
		return false
	}
	checkListen(e, "postgres.listen", p.Listen)
	switch p.TLS {
	case PostgresTLSOptional, PostgresTLSRequired, PostgresTLSOff:
	default:
		e.add("postgres.tls", "must be %q, %q or %q, not %q", PostgresTLSOptional, PostgresTLSRequired, PostgresTLSOff, p.TLS)
	}
	if p.MaxConnectionsPerAgent < 0 {
		e.add("postgres.max_connections_per_agent", "must be positive")
	}
	if p.IdleTimeout < 0 {
		e.add("postgres.idle_timeout", "must be positive")
	}
	if len(p.Upstreams) == 0 {
		e.add("postgres.upstreams", "at least one upstream database is required")
	}
	seen := map[string]bool{}
	for i, u := range p.Upstreams {
		k := fmt.Sprintf("postgres.upstreams[%d]", i)
		if !pgNameRe.MatchString(u.Name) {
			e.add(k+".name", "must be a database name of letters, digits, _ . - (at most 63), not %q", u.Name)
		}
		if seen[u.Name] {
			e.add(k+".name", "%q is configured twice", u.Name)
		}
		seen[u.Name] = true
		if host, port, err := net.SplitHostPort(u.Address); err != nil || host == "" || port == "" {
			e.add(k+".address", "must be host:port, not %q", u.Address)
		}
		switch u.TLS {
		case "verify-full":
		case "disable":
			if host, _, err := net.SplitHostPort(u.Address); err == nil {
				if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && host != "localhost" {
					e.add(k+".tls", "disable is only for a server on loopback; verify-full for %s", host)
				}
			}
		default:
			e.add(k+".tls", "must be verify-full or disable, not %q", u.TLS)
		}
		if u.Vault == nil && u.Static == nil {
			e.add(k, "vault or static is required: the broker logs in with a user Vault issues or holds")
		}
		if v := u.Vault; v != nil {
			usesVault = true
			if strings.Trim(v.Mount, "/") == "" || strings.Contains(v.Mount, "..") {
				e.add(k+".vault.mount", "must be the database secrets engine's mount, not %q", v.Mount)
			}
			for j, r := range append([]string{v.DefaultRole}, v.Roles...) {
				if r == "" && j == 0 {
					continue
				}
				if !pgNameRe.MatchString(r) {
					e.add(k+".vault.roles", "%q is not a Vault role name", r)
				}
			}
			if v.DefaultRole == "" && len(v.Roles) == 0 {
				e.add(k+".vault", "default_role or roles is required")
			}
		}
		if s := u.Static; s != nil {
			usesVault = true
			if s.Path == "" || s.Mount == "" {
				e.add(k+".static", "mount and path of the KV secret holding username and password are required")
			}
			if s.Lease || s.Field != "" {
				e.add(k+".static", "a KV secret read whole (fields username, password): set neither field nor lease")
			}
		}
	}
	return usesVault
}
