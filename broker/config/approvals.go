package config

import (
	"net"
	"net/netip"
	"net/url"
)

// validateApprovals checks approvals.* and the admin listener's authentication: an admin
// listener any other machine can reach must authenticate (a token or mTLS), since it is where
// requests are approved.
func (c *Config) validateApprovals(e *errs) {
	a := c.Approvals
	if a.Timeout < 0 || a.Timeout > MaxApprovalTimeout {
		e.add("approvals.timeout", "must be between 1s and 1h, not %s", a.Timeout)
	}
	if a.MaxPending < 0 {
		e.add("approvals.max_pending", "must be positive")
	}
	if a.MaxPendingPerAgent < 0 {
		e.add("approvals.max_pending_per_agent", "must be positive")
	}
	if a.ConsoleURL != "" {
		if u, err := url.Parse(a.ConsoleURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			e.add("approvals.console_url", "must be an http:// or https:// URL, not %q", a.ConsoleURL)
		}
	}
	if w := a.Webhook; w != nil {
		if u, err := url.Parse(w.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			e.add("approvals.webhook.url", "must be an http:// or https:// URL, not %q", w.URL)
		}
		if w.SecretEnv != "" && !envNameRe.MatchString(w.SecretEnv) {
			e.add("approvals.webhook.secret_env", "must be an environment variable name, not %q", w.SecretEnv)
		}
	}
	ad := c.Admin
	if ad.TokenEnv != "" && ad.TokenFile != "" {
		e.add("admin", "set only one of token_env, token_file")
	}
	if ad.TokenEnv != "" && !envNameRe.MatchString(ad.TokenEnv) {
		e.add("admin.token_env", "must be an environment variable name, not %q", ad.TokenEnv)
	}
	if t := ad.TLS; t != nil {
		if t.CertFile == "" {
			e.add("admin.tls.cert_file", "required")
		}
		if t.KeyFile == "" {
			e.add("admin.tls.key_file", "required")
		}
		if t.ClientCAFile == "" {
			e.add("admin.tls.client_ca_file", "required: the admin listener asks every client for a certificate")
		}
	}
	if ad.TokenEnv == "" && ad.TokenFile == "" && ad.TLS == nil && !LoopbackListen(ad.Listen) {
		e.add("admin.listen", "%q is not a loopback address: set admin.token_env, admin.token_file or admin.tls, so that only people who may approve requests can reach the admin API", ad.Listen)
	}
}

// LoopbackListen reports whether a listen address is on loopback only ("127.0.0.1:9090",
// "[::1]:9090", "localhost:9090"). An empty host listens on every interface.
func LoopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}
