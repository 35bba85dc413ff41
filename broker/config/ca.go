package config

import (
	"regexp"
	"strings"
	"time"
)

// CAVaultPKI is ca.vault_pki: no CA key on disk. Each broker generates its CA key in memory
// and has Vault's PKI engine sign it as a short-lived intermediate (through the vault
// section's connection and login), renewed at half life; agents trust the PKI's root. See
// docs/ca.md.
type CAVaultPKI struct {
	// Mount is the PKI secrets engine's mount (default "pki"): a root, or an intermediate
	// that may sign intermediates below it.
	Mount string `yaml:"mount"`
	// Issuer is the mount's issuer that signs (<mount>/issuer/<issuer>/sign-intermediate);
	// "" is the mount's default issuer (<mount>/root/sign-intermediate).
	Issuer string `yaml:"issuer"`
	// TTL is the life of each intermediate (default 24h, at least 10s, at most 30 days).
	TTL time.Duration `yaml:"ttl"`
	// CommonName names the intermediate (default "capbroker intermediate").
	CommonName string `yaml:"common_name"`
	// RootFile is the PKI's root certificate (PEM) as a file `broker agent-env` may point
	// agents at; it is never needed to sign.
	RootFile string `yaml:"root_file"`
}

// ca.vault_pki defaults and bounds.
const (
	DefaultCATTL        = 24 * time.Hour
	MinCATTL            = 10 * time.Second
	MaxCATTL            = 30 * 24 * time.Hour
	DefaultCACommonName = "capbroker intermediate"
)

// SignPath is the Vault API path that signs the intermediate.
func (p *CAVaultPKI) SignPath() string {
	if p.Issuer == "" {
		return p.Mount + "/root/sign-intermediate"
	}
	return p.Mount + "/issuer/" + p.Issuer + "/sign-intermediate"
}

var (
	mountRe  = regexp.MustCompile(`^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$`)
	issuerRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)
)

func (c *CA) defaults() {
	p := c.VaultPKI
	if p == nil {
		return
	}
	p.Mount = strings.Trim(p.Mount, "/")
	if p.Mount == "" {
		p.Mount = "pki"
	}
	if p.TTL == 0 {
		p.TTL = DefaultCATTL
	}
	if p.CommonName == "" {
		p.CommonName = DefaultCACommonName
	}
}

// validate checks the ca section: a file CA (cert_file and key_file), or vault_pki, which
// needs the vault section.
func (c *Config) validateCA(e *errs) {
	p := c.CA.VaultPKI
	if p == nil {
		if c.CA.CertFile == "" {
			e.add("ca.cert_file", "required")
		}
		if c.CA.KeyFile == "" {
			e.add("ca.key_file", "required")
		}
		return
	}
	if c.CA.CertFile != "" || c.CA.KeyFile != "" {
		e.add("ca", "set either cert_file and key_file or vault_pki, not both: with vault_pki no CA key is kept on disk")
	}
	if c.Vault == nil {
		e.add("vault", "required: ca.vault_pki signs through it")
	}
	if !mountRe.MatchString(p.Mount) || strings.Contains("/"+p.Mount+"/", "/../") || strings.Contains("/"+p.Mount+"/", "/./") {
		e.add("ca.vault_pki.mount", "must be a Vault mount path such as pki or pki_int, not %q", p.Mount)
	}
	if p.Issuer != "" && !issuerRe.MatchString(p.Issuer) {
		e.add("ca.vault_pki.issuer", "must be an issuer name or id (letters, digits, '-', '_'), not %q", p.Issuer)
	}
	if p.TTL < MinCATTL || p.TTL > MaxCATTL {
		e.add("ca.vault_pki.ttl", "must be between %s and %s, not %s", MinCATTL, "720h", p.TTL)
	}
	if len(p.CommonName) > 64 || strings.ContainsFunc(p.CommonName, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		e.add("ca.vault_pki.common_name", "must be at most 64 printable characters")
	}
}
