// Package config is the broker's YAML configuration: a typed struct decoded with unknown keys
// rejected, defaults, and Validate; Parse lists every problem of a file by key path and line.
package config

import (
	_ "embed"
	"errors"
	"maps"
	"os"
	"time"

	"github.com/capbroker/capbroker/broker/audit"
)

// Config is the whole configuration file (CONTRACT §3).
type Config struct {
	Proxy       Proxy        `yaml:"proxy"`
	Admin       Admin        `yaml:"admin"`
	CA          CA           `yaml:"ca"`
	Upstream    Upstream     `yaml:"upstream"`
	Policy      Policy       `yaml:"policy"`
	Audit       Audit        `yaml:"audit"`
	Agents      []Agent      `yaml:"agents"`
	Vault       *Vault       `yaml:"vault"`
	Credentials []Credential `yaml:"credentials"`
	Approvals   Approvals    `yaml:"approvals"`
	Budgets     Budgets      `yaml:"budgets"`
	LLM         LLM          `yaml:"llm"`
	Protocols   Protocols    `yaml:"protocols"`
	Transparent Transparent  `yaml:"transparent"`
	SSH         SSH          `yaml:"ssh"`
	Postgres    Postgres     `yaml:"postgres"`
	Telemetry   *Telemetry   `yaml:"telemetry"`
	Fleet       *Fleet       `yaml:"fleet"`
	TLS         AgentTLS     `yaml:"tls"`
}

type Proxy struct {
	Listen string `yaml:"listen"`
	// MaxConnections caps agent connections to the proxy in total (default 4096).
	MaxConnections int `yaml:"max_connections"`
	// MaxConnectionsPerAgent caps the connections one agent holds open: tunnels and idle
	// keep-alive connections alike (default 256).
	MaxConnectionsPerAgent int `yaml:"max_connections_per_agent"`
	// MaxRequestsPerAgent caps one agent's requests in flight, HTTP/2 streams included
	// (default 256).
	MaxRequestsPerAgent int `yaml:"max_requests_per_agent"`
}

type Admin struct {
	Listen string `yaml:"listen"`
	// TokenEnv or TokenFile holds the admin API's bearer token; TLS makes the listener
	// mTLS. One of them is required when Listen is not a loopback address.
	TokenEnv  string    `yaml:"token_env"`
	TokenFile string    `yaml:"token_file"`
	TLS       *AdminTLS `yaml:"tls"`
}

// AdminTLS serves the admin listener over TLS and requires a client certificate signed by
// ClientCAFile (its common name is the person's name in audit events).
type AdminTLS struct {
	CertFile     string `yaml:"cert_file"`
	KeyFile      string `yaml:"key_file"`
	ClientCAFile string `yaml:"client_ca_file"`
}

// Approvals holds requests the policy asks a person about (decision "ask").
type Approvals struct {
	// Timeout is how long a request is held when the decision names none (default 2m, at most 1h).
	Timeout time.Duration `yaml:"timeout"`
	// MaxPending bounds the requests held in total (default 100), MaxPendingPerAgent those of
	// one agent (default 10); a request over either is refused (429 approval_queue_full).
	MaxPending         int `yaml:"max_pending"`
	MaxPendingPerAgent int `yaml:"max_pending_per_agent"`
	// StateFile keeps the grants across restarts (default: capbroker-approvals.json next to
	// the config file).
	StateFile string `yaml:"state_file"`
	// ConsoleURL is the console's public URL, for webhook links (default http://ADMIN/console/).
	ConsoleURL string   `yaml:"console_url"`
	Webhook    *Webhook `yaml:"webhook"`
}

// Webhook is POSTed a chat-style message for each request held for approval.
type Webhook struct {
	URL string `yaml:"url"`
	// SecretEnv names the variable holding the HMAC-SHA256 key of the X-Capbroker-Signature header.
	SecretEnv string `yaml:"secret_env"`
}

// Approvals defaults.
const (
	DefaultApprovalTimeout    = 2 * time.Minute
	MaxApprovalTimeout        = time.Hour
	DefaultMaxPending         = 100
	DefaultMaxPendingPerAgent = 10
)

type CA struct {
	CertFile string      `yaml:"cert_file"`
	KeyFile  string      `yaml:"key_file"`
	VaultPKI *CAVaultPKI `yaml:"vault_pki"` // ca.go
}

type Upstream struct {
	CAFile       string   `yaml:"ca_file"`
	AllowPrivate []string `yaml:"allow_private"`
	// Proxy chains every outbound connection through the network's own proxy (upstream_proxy.go).
	Proxy *UpstreamProxy `yaml:"proxy"`
}

// Policy says where the policy comes from (a directory or a bundle, exactly one) and how it applies.
type Policy struct {
	Dir    string  `yaml:"dir"`
	Mode   string  `yaml:"mode"`
	Bundle *Bundle `yaml:"bundle"`
	// MaxBodyBytes is the largest JSON request body the policy sees; a larger one is refused
	// (413) when the policy reads bodies (default 8 MiB).
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
}

// DefaultMaxBodyBytes is policy.max_body_bytes when it is not set.
const DefaultMaxBodyBytes = 8 << 20

// Bundle is an OPA bundle (tar.gz, as `opa build` writes it) polled over HTTP(S).
type Bundle struct {
	URL          string        `yaml:"url"`
	PollInterval time.Duration `yaml:"poll_interval"`
	// PublicKeyFile, when set, makes a signature (.signatures.json) required and verified with this PEM key.
	PublicKeyFile string `yaml:"public_key_file"`
	KeyID         string `yaml:"key_id"`
	// Algorithm of the signature; empty follows from the key (RS256 for RSA, ES256/384/512 for ECDSA).
	Algorithm string `yaml:"algorithm"`
	// CAFile holds extra PEM roots for the bundle server's TLS, added to the system roots.
	CAFile string `yaml:"ca_file"`
}

// DefaultBundlePollInterval is policy.bundle.poll_interval when it is not set.
const DefaultBundlePollInterval = 30 * time.Second

// Policy modes.
const (
	ModeEnforce = "enforce"
	ModeMonitor = "monitor"
)

type Audit struct {
	File string `yaml:"file"`
	// IncludeInput is how much of the policy input events carry (audit.Level).
	IncludeInput audit.Level `yaml:"include_input"`
	// Format and Instance: audit_format.go.
	Format   string `yaml:"format"`
	Instance string `yaml:"instance"`
}

// Agent is one identity that may use the proxy: by proxy password, or by source address.
type Agent struct {
	ID          string            `yaml:"id"`
	TokenEnv    string            `yaml:"token_env"`
	TokenFile   string            `yaml:"token_file"`
	TokenSHA256 string            `yaml:"token_sha256"`
	Addresses   []string          `yaml:"addresses"`
	Labels      map[string]string `yaml:"labels"`
}

type Vault struct {
	Address         string        `yaml:"address"`
	CAFile          string        `yaml:"ca_file"`
	Namespace       string        `yaml:"namespace"`
	RefreshInterval time.Duration `yaml:"refresh_interval"`
	MaxStale        time.Duration `yaml:"max_stale"`
	Auth            VaultAuth     `yaml:"auth"`
}

type VaultAuth struct {
	Method       string `yaml:"method"`
	TokenEnv     string `yaml:"token_env"`
	TokenFile    string `yaml:"token_file"`
	RoleIDFile   string `yaml:"role_id_file"`
	RoleIDEnv    string `yaml:"role_id_env"`
	SecretIDFile string `yaml:"secret_id_file"`
	SecretIDEnv  string `yaml:"secret_id_env"`
	Mount        string `yaml:"mount"`
}

// Credential is one secret, the hosts it may be sent to, where it comes from and how it is injected.
type Credential struct {
	Name   string   `yaml:"name"`
	Hosts  []string `yaml:"hosts"`
	Source Source   `yaml:"source"`
	Inject Inject   `yaml:"inject"`
	// AgentEnv names the variables `broker agent-env` sets to a placeholder for this
	// credential (default: those the usual SDKs read for its hosts).
	AgentEnv []string `yaml:"agent_env"`

	// Derived credentials (derived.go): at most one.
	AWSSigV4             *AWSSigV4             `yaml:"aws_sigv4"`
	GitHubApp            *GitHubApp            `yaml:"github_app"`
	OAuth2               *OAuth2               `yaml:"oauth2"`
	GoogleServiceAccount *GoogleServiceAccount `yaml:"google_service_account"`
}

type Source struct {
	Vault *VaultSource `yaml:"vault"`
	Env   string       `yaml:"env"`
	File  string       `yaml:"file"`
	// EnvFields reads a secret with several fields from one variable each (field -> variable).
	EnvFields map[string]string `yaml:"env_fields"`
}

// IsZero reports whether no source is set.
func (s Source) IsZero() bool {
	return s.Vault == nil && s.Env == "" && s.File == "" && s.EnvFields == nil
}

type VaultSource struct {
	Mount     string `yaml:"mount"`
	Path      string `yaml:"path"`
	Field     string `yaml:"field"`
	KVVersion int    `yaml:"kv_version"`
	Lease     bool   `yaml:"lease"`
}

type Inject struct {
	Header      string     `yaml:"header"`
	Value       string     `yaml:"value"`
	Query       string     `yaml:"query"`
	BasicAuth   *BasicAuth `yaml:"basic_auth"`
	Placeholder string     `yaml:"placeholder"`
	Body        bool       `yaml:"body"`
}

type BasicAuth struct {
	Username string `yaml:"username"`
}

// Load reads, decodes, defaults and validates a config file. The error lists every problem.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(b)
}

//go:embed dev.yaml
var devYAML []byte

// Dev returns the embedded configuration that `broker dev` runs with.
func Dev() *Config {
	c, err := Parse(devYAML)
	if err != nil {
		panic("embedded dev config is invalid: " + err.Error()) // a build defect, caught by tests
	}
	return c
}

// Parse decodes YAML, applies defaults and validates. On failure the error is Problems: every
// unknown key, wrong value and validation problem of the file at once, each by its key path
// and line, in the order of the file.
func Parse(b []byte) (*Config, error) {
	var c Config
	lines, problems := decode(b, &c)
	if len(problems) == 1 && problems[0].Path == "" {
		return nil, problems // a syntax error: nothing else can be said about the file
	}
	c.SetDefaults()
	shapeProblems := len(problems)
validation:
	for _, err := range c.Validate() {
		var p *Problem
		if !errors.As(err, &p) {
			p = &Problem{Msg: err.Error()}
		}
		for _, bad := range problems[:shapeProblems] {
			if bad.badValue && follows(p.Path, bad.Path) {
				continue validation
			}
		}
		p.Line = lines.line(p.Path)
		problems = append(problems, p)
	}
	if len(problems) > 0 {
		sortProblems(problems)
		return nil, problems
	}
	return &c, nil
}

// SetDefaults fills in what the file may leave out.
func (c *Config) SetDefaults() {
	if c.Proxy.Listen == "" {
		c.Proxy.Listen = "127.0.0.1:8080"
	}
	if c.Proxy.MaxConnections == 0 {
		c.Proxy.MaxConnections = 4096
	}
	if c.Proxy.MaxConnectionsPerAgent == 0 {
		c.Proxy.MaxConnectionsPerAgent = 256
	}
	if c.Proxy.MaxRequestsPerAgent == 0 {
		c.Proxy.MaxRequestsPerAgent = 256
	}
	if c.Admin.Listen == "" {
		c.Admin.Listen = "127.0.0.1:9090"
	}
	if c.Approvals.Timeout == 0 {
		c.Approvals.Timeout = DefaultApprovalTimeout
	}
	if c.Approvals.MaxPending == 0 {
		c.Approvals.MaxPending = DefaultMaxPending
	}
	if c.Approvals.MaxPendingPerAgent == 0 {
		c.Approvals.MaxPendingPerAgent = DefaultMaxPendingPerAgent
	}
	c.Transparent.defaults()
	c.SSH.defaults()
	c.Postgres.defaults()
	c.CA.defaults()
	c.Telemetry.setDefaults()
	if c.Policy.Mode == "" {
		c.Policy.Mode = ModeEnforce
	}
	if c.Policy.MaxBodyBytes == 0 {
		c.Policy.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if b := c.Policy.Bundle; b != nil && b.PollInterval == 0 {
		b.PollInterval = DefaultBundlePollInterval
	}
	if c.Vault != nil {
		if c.Vault.RefreshInterval == 0 {
			c.Vault.RefreshInterval = time.Minute
		}
		if c.Vault.MaxStale == 0 {
			c.Vault.MaxStale = 15 * time.Minute
		}
		if c.Vault.Auth.Method == "" {
			c.Vault.Auth.Method = "token"
		}
		if c.Vault.Auth.Mount == "" && c.Vault.Auth.Method == "approle" {
			c.Vault.Auth.Mount = "approle"
		}
	}
	for i := range c.Credentials {
		cr := &c.Credentials[i]
		if v := cr.Source.Vault; v != nil && v.KVVersion == 0 && !v.Lease {
			v.KVVersion = 2
		}
		if s := &cr.Source; cr.AWSSigV4 != nil && s.Vault == nil && s.Env == "" && s.File == "" && s.EnvFields == nil {
			s.EnvFields = maps.Clone(AWSEnvFields)
		}
		if cr.Derived() && cr.AWSSigV4 == nil && cr.GitHubApp == nil && cr.Inject == (Inject{}) {
			// A minted token is a bearer token unless the file says otherwise. A GitHub App
			// token is put on by its kind (Bearer for the API, Basic for git).
			cr.Inject = Inject{Header: "Authorization", Value: "Bearer {{secret}}"}
		}
	}
}
