package config

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/capbroker/capbroker/broker/upstream/egress"
)

// UpstreamProxy is upstream.proxy: the network's own proxies, which every outbound connection
// of the broker goes through (see docs/upstream-proxy.md). Only the operator sets it: the
// broker never reads HTTP(S)_PROXY from its own environment, nor from the sandbox's.
type UpstreamProxy struct {
	// Proxies are tried in order when one cannot be connected to.
	Proxies []ProxyServer `yaml:"proxies"`
	// NoProxy lists the destinations reached directly: a name ("internal.example.com"), a
	// suffix (".corp.example"), a CIDR ("10.0.0.0/8") or an IP, each optionally with ":port".
	NoProxy []string `yaml:"no_proxy"`
	// ConnectBy is what the CONNECT request names: "address" (default: the IP the broker
	// resolved and checked, with the name in the Host header) or "name".
	ConnectBy string `yaml:"connect_by"`
	// TLSInspectionCA, when set, is trusted for origins reached through a proxy (a proxy that
	// inspects TLS with its own CA). Audit events say so.
	TLSInspectionCA string `yaml:"tls_inspection_ca"`
	// PAC is a PAC file (a path, file:// or an https:// URL) that chooses, after the policy's
	// upstream_proxy and no_proxy, among the proxies (by their url's host:port) and DIRECT.
	// Loaded at start and on every reload.
	PAC string `yaml:"pac"`
	// PACTimeout bounds one evaluation of the PAC file; default 100ms.
	PACTimeout time.Duration `yaml:"pac_timeout"`
	// PACFallback is what a PAC evaluation that fails (throws, times out, names an
	// unconfigured proxy) gives: a proxy's name, "direct" or "refuse". Required with pac.
	PACFallback string `yaml:"pac_fallback"`
}

// PACRefuse is the pac_fallback that refuses the connection (502 upstream_error).
const PACRefuse = "refuse"

// ProxyServer is one upstream proxy.
type ProxyServer struct {
	// Name is what a decision's "upstream_proxy" and the audit field "via" call it.
	Name string `yaml:"name"`
	// URL is http://host:port or https://host:port.
	URL string `yaml:"url"`
	// CAFile holds the PEM roots of an https:// proxy's own certificate (added to the system roots).
	CAFile string `yaml:"ca_file"`
	// Username and Password: Basic authentication. The password comes from any credential
	// source (vault, env, file) and is scrubbed like any secret.
	Username string  `yaml:"username"`
	Password *Source `yaml:"password"`
}

// Connect-by values.
const (
	ConnectByAddress = "address"
	ConnectByName    = "name"
)

// ProxyDirect is the decision value that sends a request around every proxy.
const ProxyDirect = "direct"

// ProxyCredentialName is the name under which a proxy's password is kept in the credential
// store (a name no configured credential can take: they match credNameRe).
func ProxyCredentialName(proxy string) string { return "upstream.proxy:" + proxy }

func (p *UpstreamProxy) validate(e *errs) (usesVault bool) {
	if p == nil {
		return false
	}
	const base = "upstream.proxy"
	if len(p.Proxies) == 0 {
		e.add(base+".proxies", "required: at least one proxy")
	}
	seen := map[string]bool{}
	for i, s := range p.Proxies {
		path := fmt.Sprintf("%s.proxies[%d]", base, i)
		switch {
		case !credNameRe.MatchString(s.Name):
			e.add(path+".name", "must match %s", credNameRe)
		case s.Name == ProxyDirect:
			e.add(path+".name", "%q is reserved (a decision's way to go around every proxy)", ProxyDirect)
		case seen[s.Name]:
			e.add(path+".name", "%q is used twice", s.Name)
		}
		seen[s.Name] = true
		u, err := url.Parse(s.URL)
		switch {
		case s.URL == "":
			e.add(path+".url", "required")
		case err != nil:
			e.add(path+".url", "not a URL")
		case u.Scheme != "http" && u.Scheme != "https":
			e.add(path+".url", "must be http:// or https://, not %q", u.Scheme)
		case u.User != nil:
			e.add(path+".url", "must not hold credentials: use username and password")
		case u.Hostname() == "" || u.Port() == "":
			e.add(path+".url", "must name a host and a port")
		case (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "":
			e.add(path+".url", "must be scheme://host:port only")
		}
		if s.CAFile != "" && u != nil && u.Scheme != "https" {
			e.add(path+".ca_file", "only used with an https:// proxy")
		}
		if strings.ContainsAny(s.Username, ":\r\n") {
			e.add(path+".username", "must not contain ':' or a line break")
		}
		switch {
		case s.Password != nil && s.Username == "":
			e.add(path+".password", "used only with username")
		case s.Password == nil && s.Username != "":
			e.add(path+".password", "required with username: one of vault, env, file")
		case s.Password != nil:
			src := s.Password
			switch count(src.Vault != nil, src.Env != "", src.File != "") {
			case 1:
			case 0:
				e.add(path+".password", "required: one of vault, env, file")
			default:
				e.add(path+".password", "set only one of vault, env, file")
			}
			if src.EnvFields != nil {
				e.add(path+".password.env_fields", "not used for a password")
			}
			if v := src.Vault; v != nil {
				usesVault = true
				if v.Path == "" {
					e.add(path+".password.vault.path", "required")
				}
				if v.Field == "" {
					e.add(path+".password.vault.field", "required")
				}
				if !v.Lease && v.Mount == "" {
					e.add(path+".password.vault.mount", "required for a KV secret")
				}
				if !v.Lease && v.KVVersion != 1 && v.KVVersion != 2 {
					e.add(path+".password.vault.kv_version", "must be 1 or 2")
				}
			}
		}
	}
	for i, n := range p.NoProxy {
		if err := CheckNoProxy(n); err != nil {
			e.add(fmt.Sprintf("%s.no_proxy[%d]", base, i), "%v", err)
		}
	}
	switch {
	case p.PAC == "" && (p.PACFallback != "" || p.PACTimeout != 0):
		e.add(base+".pac", "required with pac_fallback or pac_timeout")
	case p.PAC != "":
		lower := strings.ToLower(p.PAC)
		if strings.Contains(lower, "://") && !strings.HasPrefix(lower, "https://") && !strings.HasPrefix(lower, "file://") {
			e.add(base+".pac", "must be a file path, file:// or an https:// URL")
		}
		switch {
		case p.PACFallback == "":
			e.add(base+".pac_fallback", "required with pac: a proxy's name, %q or %q", ProxyDirect, PACRefuse)
		case p.PACFallback != ProxyDirect && p.PACFallback != PACRefuse && !seen[p.PACFallback]:
			e.add(base+".pac_fallback", "must be a configured proxy's name, %q or %q, not %q", ProxyDirect, PACRefuse, p.PACFallback)
		}
		if p.PACTimeout < 0 {
			e.add(base+".pac_timeout", "must not be negative")
		}
	}
	switch p.ConnectBy {
	case "", ConnectByAddress, ConnectByName:
	default:
		e.add(base+".connect_by", "must be %q or %q, not %q", ConnectByAddress, ConnectByName, p.ConnectBy)
	}
	return usesVault
}

// CheckNoProxy checks one no_proxy entry: a name, a ".suffix", an IP or a CIDR, with an
// optional ":port" (the parser the Dialer uses: broker/upstream/egress).
func CheckNoProxy(entry string) error {
	_, err := egress.ParseNoProxy([]string{entry})
	return err
}
