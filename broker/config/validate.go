package config

import (
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
)

var (
	envNameRe    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	agentIDRe    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	credNameRe   = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)
	headerNameRe = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
	hostLabelRe  = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
)

// errs collects problems, each prefixed by its key path.
type errs []error

func (e *errs) add(path, format string, args ...any) {
	*e = append(*e, &Problem{Path: path, Msg: fmt.Sprintf(format, args...)})
}

// Validate returns every problem in the config, each a *Problem naming its key path (without a
// line: Parse adds the lines). It never includes a secret value: the config holds only
// references to secrets.
func (c *Config) Validate() []error {
	var e errs
	checkListen(&e, "proxy.listen", c.Proxy.Listen)
	checkListen(&e, "admin.listen", c.Admin.Listen)
	if c.Proxy.MaxConnections < 0 {
		e.add("proxy.max_connections", "must be positive")
	}
	if c.Proxy.MaxConnectionsPerAgent < 0 {
		e.add("proxy.max_connections_per_agent", "must be positive")
	}
	if c.Proxy.MaxRequestsPerAgent < 0 {
		e.add("proxy.max_requests_per_agent", "must be positive")
	}
	c.validateCA(&e)
	for i, s := range c.Upstream.AllowPrivate {
		if _, err := ParsePrefix(s); err != nil {
			e.add(fmt.Sprintf("upstream.allow_private[%d]", i), "%v", err)
		}
	}
	if c.Upstream.Proxy.validate(&e) && c.Vault == nil {
		e.add("vault", "required: an upstream proxy password has a vault source")
	}
	switch {
	case c.Policy.Dir == "" && c.Policy.Bundle == nil:
		e.add("policy.dir", "required (or policy.bundle)")
	case c.Policy.Dir != "" && c.Policy.Bundle != nil:
		e.add("policy", "set only one of dir, bundle")
	}
	if c.Policy.Bundle != nil {
		c.Policy.Bundle.validate(&e)
	}
	if c.Policy.Mode != ModeEnforce && c.Policy.Mode != ModeMonitor {
		e.add("policy.mode", "must be %q or %q, not %q", ModeEnforce, ModeMonitor, c.Policy.Mode)
	}
	if c.Policy.MaxBodyBytes < 0 {
		e.add("policy.max_body_bytes", "must be positive")
	}
	if !c.Audit.IncludeInput.Valid() {
		e.add("audit.include_input", "must be false, true, metadata, headers or full, not %q", c.Audit.IncludeInput)
	}
	c.Audit.validateFormat(&e)
	c.validateAgents(&e)
	usesVault := c.validateCredentials(&e)
	usesVault = c.validatePostgres(&e) || usesVault
	if usesVault && c.Vault == nil {
		e.add("vault", "required: a credential has a vault source")
	}
	if c.validateSSH(&e) && c.Vault == nil {
		e.add("vault", "required: ssh.upstreams sign in with keys from vault")
	}
	if c.Vault != nil {
		c.Vault.validate(&e)
	}
	c.validateApprovals(&e)
	c.validateBudgets(&e)
	c.validateFleet(&e)
	c.validateLLM(&e)
	c.validateProtocols(&e)
	c.validateTransparent(&e)
	if c.validateTelemetry(&e) && c.Vault == nil {
		e.add("vault", "required: a telemetry header's secret has a vault source")
	}
	c.validateAgentTLS(&e)
	return e
}

// bundleAlgorithms are the signature algorithms a bundle's public key may verify.
var bundleAlgorithms = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"}

func (b *Bundle) validate(e *errs) {
	if b.URL == "" {
		e.add("policy.bundle.url", "required")
	} else if u, err := url.Parse(b.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		e.add("policy.bundle.url", "must be an http:// or https:// URL, not %q", b.URL)
	}
	if b.PollInterval < time.Second {
		e.add("policy.bundle.poll_interval", "must be at least 1s, not %s", b.PollInterval)
	}
	if b.PublicKeyFile == "" {
		if b.KeyID != "" {
			e.add("policy.bundle.key_id", "only used with public_key_file")
		}
		if b.Algorithm != "" {
			e.add("policy.bundle.algorithm", "only used with public_key_file")
		}
	}
	if b.Algorithm != "" && !slices.Contains(bundleAlgorithms, b.Algorithm) {
		e.add("policy.bundle.algorithm", "must be one of %s, not %q", strings.Join(bundleAlgorithms, ", "), b.Algorithm)
	}
}

func checkListen(e *errs, path, addr string) {
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		e.add(path, "must be host:port, not %q", addr)
	}
}

// ParsePrefix accepts a CIDR or a bare IP address (taken as a single-address prefix).
func ParsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR", s)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not an IP address or CIDR", s)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func (c *Config) validateAgents(e *errs) {
	seen := map[string]bool{}
	for i, a := range c.Agents {
		p := fmt.Sprintf("agents[%d]", i)
		switch {
		case a.ID == "":
			e.add(p+".id", "required")
		case !agentIDRe.MatchString(a.ID):
			e.add(p+".id", "%q must be 1-64 letters, digits, '.', '_' or '-'", a.ID)
		case seen[a.ID]:
			e.add(p+".id", "duplicate agent %q", a.ID)
		}
		seen[a.ID] = true
		tokens := count(a.TokenEnv != "", a.TokenFile != "", a.TokenSHA256 != "")
		if tokens > 1 {
			e.add(p, "set only one of token_env, token_file, token_sha256")
		}
		if tokens == 0 && len(a.Addresses) == 0 {
			e.add(p, "needs a token (token_env, token_file or token_sha256) or addresses")
		}
		if a.TokenSHA256 != "" {
			if b, err := hex.DecodeString(a.TokenSHA256); err != nil || len(b) != 32 {
				e.add(p+".token_sha256", "must be 64 hex digits (the SHA-256 of the token)")
			}
		}
		for j, s := range a.Addresses {
			if _, err := ParsePrefix(s); err != nil {
				e.add(fmt.Sprintf("%s.addresses[%d]", p, j), "%v", err)
			}
		}
	}
}

func (c *Config) validateCredentials(e *errs) (usesVault bool) {
	seen := map[string]bool{}
	for i, cr := range c.Credentials {
		p := fmt.Sprintf("credentials[%d]", i)
		switch {
		case cr.Name == "":
			e.add(p+".name", "required")
		case !credNameRe.MatchString(cr.Name):
			e.add(p+".name", "%q must be 1-64 lower-case letters, digits, '_' or '-'", cr.Name)
		case seen[cr.Name]:
			e.add(p+".name", "duplicate credential %q", cr.Name)
		}
		seen[cr.Name] = true
		if len(cr.Hosts) == 0 {
			e.add(p+".hosts", "required: the hosts this secret may be sent to")
		}
		for j, h := range cr.Hosts {
			if err := checkHostPattern(h); err != nil {
				e.add(fmt.Sprintf("%s.hosts[%d]", p, j), "%v", err)
			}
		}
		s := cr.Source
		transit := cr.GitHubApp != nil && cr.GitHubApp.Transit != nil
		switch count(s.Vault != nil, s.Env != "", s.File != "", s.EnvFields != nil) {
		case 0:
			if !transit {
				e.add(p+".source", "required: one of vault, env, file")
			}
		case 1:
			if transit {
				e.add(p+".source", "not used with github_app.transit: the key stays in Vault")
			}
		default:
			e.add(p+".source", "set only one of vault, env, file, env_fields")
		}
		if s.EnvFields != nil && cr.AWSSigV4 == nil {
			e.add(p+".source.env_fields", "only used with aws_sigv4")
		}
		if s.Vault != nil {
			usesVault = true
			if s.Vault.Path == "" {
				e.add(p+".source.vault.path", "required")
			}
			switch {
			case s.Vault.Field == "" && cr.AWSSigV4 == nil:
				e.add(p+".source.vault.field", "required")
			case s.Vault.Field != "" && cr.AWSSigV4 != nil:
				e.add(p+".source.vault.field", "not used with aws_sigv4: the whole secret is read (access key id, secret key, session token)")
			}
			if !s.Vault.Lease && s.Vault.Mount == "" {
				e.add(p+".source.vault.mount", "required for a KV secret")
			}
			if !s.Vault.Lease && s.Vault.KVVersion != 1 && s.Vault.KVVersion != 2 {
				e.add(p+".source.vault.kv_version", "must be 1 or 2")
			}
		}
		for j, n := range cr.AgentEnv {
			if !envNameRe.MatchString(n) {
				e.add(fmt.Sprintf("%s.agent_env[%d]", p, j), "%q is not an environment variable name", n)
			}
		}
		switch {
		case count(cr.AWSSigV4 != nil, cr.GitHubApp != nil, cr.OAuth2 != nil, cr.GoogleServiceAccount != nil) > 1:
			e.add(p, "set at most one of aws_sigv4, github_app, oauth2, google_service_account")
		case cr.AWSSigV4 != nil:
			if cr.Inject != (Inject{}) {
				e.add(p+".inject", "not used with aws_sigv4: the request is signed, not given a value")
			}
			cr.AWSSigV4.validate(e, p)
		case cr.GitHubApp != nil:
			usesVault = cr.GitHubApp.validate(e, p, cr.Inject) || usesVault
		default:
			validateInject(e, p+".inject", cr.Inject)
		}
		if cr.OAuth2 != nil && cr.OAuth2.validate(e, p+".oauth2") {
			usesVault = true
		}
		if cr.GoogleServiceAccount != nil {
			cr.GoogleServiceAccount.validate(e, p+".google_service_account")
		}
	}
	return usesVault
}

// oauth2AssertionAlgs are the algorithms a private_key_jwt assertion may be signed with.
var oauth2AssertionAlgs = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// oauth2Reserved are token request parameters the grant sets itself.
var oauth2Reserved = []string{"grant_type", "scope", "client_id", "client_secret", "client_assertion", "client_assertion_type", "refresh_token", "assertion"}

// validate checks an oauth2 block; it reports whether the refresh token is kept in Vault.
func (o *OAuth2) validate(e *errs, p string) (usesVault bool) {
	if u, err := url.Parse(o.TokenURL); o.TokenURL == "" {
		e.add(p+".token_url", "required")
	} else if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil {
		e.add(p+".token_url", "must be an https:// URL without credentials")
	}
	if o.ClientID == "" {
		e.add(p+".client_id", "required")
	}
	switch o.Grant {
	case "", "client_credentials":
		if o.RefreshToken != nil {
			e.add(p+".refresh_token", "only used with grant: refresh_token")
		}
	case "refresh_token":
		if o.RefreshToken == nil {
			e.add(p+".refresh_token", "required with grant: refresh_token (vault or file)")
		}
	default:
		e.add(p+".grant", "must be client_credentials or refresh_token, not %q", o.Grant)
	}
	if rt := o.RefreshToken; rt != nil {
		switch {
		case rt.Env != "":
			e.add(p+".refresh_token.env", "not allowed: a rotated refresh token must be written back (use vault or file)")
		case count(rt.Vault != nil, rt.File != "") != 1:
			e.add(p+".refresh_token", "set exactly one of vault, file")
		case rt.Vault != nil:
			usesVault = true
			v := rt.Vault
			if v.Lease {
				e.add(p+".refresh_token.vault.lease", "not allowed: the refresh token is a KV secret the broker writes back")
			}
			if v.Mount == "" {
				e.add(p+".refresh_token.vault.mount", "required")
			}
			if v.Path == "" {
				e.add(p+".refresh_token.vault.path", "required")
			}
			if v.Field == "" {
				e.add(p+".refresh_token.vault.field", "required")
			}
			if v.KVVersion != 0 && v.KVVersion != 1 && v.KVVersion != 2 {
				e.add(p+".refresh_token.vault.kv_version", "must be 1 or 2")
			}
		}
	}
	switch o.ClientAuth {
	case "", "client_secret_basic", "client_secret_post":
		if o.PrivateKeyJWT != nil {
			e.add(p+".private_key_jwt", "only used with client_auth: private_key_jwt")
		}
	case "private_key_jwt":
		if k := o.PrivateKeyJWT; k != nil && k.Alg != "" && !slices.Contains(oauth2AssertionAlgs, k.Alg) {
			e.add(p+".private_key_jwt.alg", "must be one of %s, not %q", strings.Join(oauth2AssertionAlgs, ", "), k.Alg)
		}
	default:
		e.add(p+".client_auth", "must be client_secret_basic, client_secret_post or private_key_jwt, not %q", o.ClientAuth)
	}
	validateScopes(e, p+".scopes", o.Scopes)
	for k := range o.Params {
		if slices.Contains(oauth2Reserved, k) {
			e.add(p+".params."+k, "set by the grant itself")
		}
	}
	return usesVault
}

func (g *GoogleServiceAccount) validate(e *errs, p string) {
	if len(g.Scopes) == 0 {
		e.add(p+".scopes", "required")
	}
	validateScopes(e, p+".scopes", g.Scopes)
}

func validateScopes(e *errs, p string, scopes []string) {
	for i, s := range scopes {
		if s == "" || strings.ContainsAny(s, " \t\r\n\"\\") {
			e.add(fmt.Sprintf("%s[%d]", p, i), "%q is not a single scope", s)
		}
	}
}

func validateInject(e *errs, p string, in Inject) {
	switch count(in.Header != "", in.Query != "", in.BasicAuth != nil, in.Placeholder != "") {
	case 0:
		e.add(p, "required: one of header, query, basic_auth, placeholder")
		return
	case 1:
	default:
		e.add(p, "set only one of header, query, basic_auth, placeholder")
		return
	}
	if in.Header != "" {
		if !headerNameRe.MatchString(in.Header) {
			e.add(p+".header", "%q is not a valid header name", in.Header)
		}
		if !strings.Contains(in.Value, "{{secret}}") {
			e.add(p+".value", "must contain {{secret}}")
		}
		if strings.ContainsAny(in.Value, "\r\n") {
			e.add(p+".value", "must not contain line breaks")
		}
	} else if in.Value != "" {
		e.add(p+".value", "only used with header")
	}
	if in.Placeholder != "" && len(in.Placeholder) < 8 {
		e.add(p+".placeholder", "must be at least 8 characters, so it cannot occur by accident")
	}
	if in.Body && in.Placeholder == "" {
		e.add(p+".body", "only used with placeholder")
	}
}

// HostMatches reports whether host (lower case, no port) is one pattern names, as the config's
// hosts lists spell them (checkHostPattern): a name or IP literal names itself, "*.example.com"
// any name below example.com, not example.com itself.
func HostMatches(pattern, host string) bool {
	if suffix, ok := strings.CutPrefix(pattern, "*"); ok {
		return strings.HasSuffix(host, suffix) && len(host) > len(suffix)
	}
	return pattern == host
}

// checkHostPattern accepts a lower-case DNS name, "*." followed by one, or an IP literal.
func checkHostPattern(h string) error {
	if _, err := netip.ParseAddr(h); err == nil {
		return nil
	}
	name := strings.TrimPrefix(h, "*.")
	if name == "" || len(name) > 253 {
		return fmt.Errorf("%q is not a host name", h)
	}
	for _, label := range strings.Split(name, ".") {
		if !hostLabelRe.MatchString(label) {
			return fmt.Errorf("%q is not a lower-case host name or *.domain (no ports, schemes or paths)", h)
		}
	}
	return nil
}

func (v *Vault) validate(e *errs) {
	if v.Address == "" {
		e.add("vault.address", "required")
	} else if !strings.HasPrefix(v.Address, "http://") && !strings.HasPrefix(v.Address, "https://") {
		e.add("vault.address", "must start with http:// or https://")
	}
	if v.RefreshInterval < 0 {
		e.add("vault.refresh_interval", "must be positive")
	}
	if v.MaxStale < 0 {
		e.add("vault.max_stale", "must be positive")
	}
	a := v.Auth
	switch a.Method {
	case "token":
		if count(a.TokenEnv != "", a.TokenFile != "") != 1 {
			e.add("vault.auth", "token auth needs exactly one of token_env, token_file")
		}
	case "approle":
		if count(a.RoleIDEnv != "", a.RoleIDFile != "") != 1 {
			e.add("vault.auth", "approle auth needs exactly one of role_id_env, role_id_file")
		}
		if count(a.SecretIDEnv != "", a.SecretIDFile != "") != 1 {
			e.add("vault.auth", "approle auth needs exactly one of secret_id_env, secret_id_file")
		}
	default:
		e.add("vault.auth.method", "must be token or approle, not %q", a.Method)
	}
}

func count(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

var awsNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

func (a *AWSSigV4) validate(e *errs, p string) {
	if a.Region != "" && !awsNameRe.MatchString(a.Region) {
		e.add(p+".aws_sigv4.region", "%q is not an AWS region name", a.Region)
	}
	if a.Service != "" && !awsNameRe.MatchString(a.Service) {
		e.add(p+".aws_sigv4.service", "%q is not an AWS signing name (s3, iam, sts, ...)", a.Service)
	}
}
