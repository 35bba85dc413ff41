package config

import (
	"strings"
	"testing"
)

func TestPostgresValidate(t *testing.T) {
	base := `ca: {cert_file: c, key_file: k}
policy: {dir: p}
vault: {address: "http://127.0.0.1:8200", auth: {method: token, token_env: T}}
`
	cases := map[string]struct {
		yaml string
		want []string // problems, by key path and text; none: valid
	}{
		"valid": {`postgres:
  listen: 127.0.0.1:5432
  upstreams:
    - {name: app, address: "db:5432", vault: {default_role: ro}}
    - {name: app2, address: "127.0.0.1:5432", tls: disable, static: {mount: secret, path: db}}
`, nil},
		"everything wrong": {`postgres:
  listen: nowhere
  tls: sometimes
  max_connections_per_agent: -1
  upstreams:
    - {name: "bad name", address: db, tls: disable, vault: {mount: "", roles: ["x y"]}}
    - {name: app, address: "db:5432"}
    - {name: app, address: "db:5432", static: {mount: secret, path: p, field: password}}
`, []string{"postgres.listen", "postgres.tls", "postgres.max_connections_per_agent", "postgres.upstreams[0].name",
			"postgres.upstreams[0].address", "postgres.upstreams[0].vault.roles", "postgres.upstreams[1]: vault or static is required",
			"postgres.upstreams[2].name: \"app\" is configured twice", "postgres.upstreams[2].static"}},
		"tls disable off loopback": {`postgres:
  listen: 127.0.0.1:5432
  upstreams:
    - {name: app, address: "db.internal:5432", tls: disable, vault: {default_role: ro}}
`, []string{"postgres.upstreams[0].tls: disable is only for a server on loopback"}},
		"upstreams without listen": {`postgres:
  upstreams:
    - {name: app, address: "db:5432", vault: {default_role: ro}}
`, []string{"postgres.listen: required"}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(base + c.yaml))
			if len(c.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("valid, want problems")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("no problem %q in:\n%v", w, err)
				}
			}
		})
	}
}

func TestPostgresDefaultsAndRoles(t *testing.T) {
	c, err := Parse([]byte(`ca: {cert_file: c, key_file: k}
policy: {dir: p}
vault: {address: "http://127.0.0.1:8200", auth: {method: token, token_env: T}}
postgres:
  listen: 127.0.0.1:5432
  upstreams:
    - {name: app, address: "db:5432", vault: {default_role: ro, roles: [rw]}}
`))
	if err != nil {
		t.Fatal(err)
	}
	p := c.Postgres
	u := p.Upstreams[0]
	if p.TLS != PostgresTLSOptional || p.MaxConnectionsPerAgent != DefaultPostgresMaxConnsPerAgent || p.IdleTimeout != DefaultPostgresIdleTimeout ||
		u.Database != "app" || u.TLS != "verify-full" || u.Vault.Mount != "database" {
		t.Fatalf("defaults: %+v %+v", p, u)
	}
	if !u.Role("ro") || !u.Role("rw") || u.Role("admin") || u.Role("") {
		t.Fatal("Role: only the default role and the listed roles")
	}
}
