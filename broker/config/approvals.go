package config

import (
	"fmt"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strings"
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

// MinAdminTokenBits is the least an admin token must carry: whoever has it approves requests.
const MinAdminTokenBits = 128

// Token reads the admin token from admin.token_env or admin.token_file (surrounding white
// space removed) and checks its strength (AdminTokenBits); "" when neither is set. Errors
// name the key path and the variable or file, never the value.
func (a Admin) Token() (string, error) {
	var key, from, v string
	switch {
	case a.TokenEnv != "":
		key, from = "admin.token_env", "the variable "+a.TokenEnv
		v = strings.TrimSpace(os.Getenv(a.TokenEnv))
		if v == "" {
			return "", &Problem{Path: key, Msg: fmt.Sprintf("%s is not set or empty", a.TokenEnv)}
		}
	case a.TokenFile != "":
		key, from = "admin.token_file", a.TokenFile
		b, err := os.ReadFile(a.TokenFile)
		if err != nil {
			return "", &Problem{Path: key, Msg: err.Error()}
		}
		if v = strings.TrimSpace(string(b)); v == "" {
			return "", &Problem{Path: key, Msg: fmt.Sprintf("%s is empty", a.TokenFile)}
		}
	default:
		return "", nil
	}
	if bits := AdminTokenBits(v); bits < MinAdminTokenBits {
		return "", &Problem{Path: key, Msg: fmt.Sprintf("the admin token in %s is too weak: %d characters count as %d bits, and an admin token must carry at least %d "+
			"(counted as length × bits per character of the smallest alphabet holding them all: hex 4, base32 5, base64 6, other printable ASCII 6.5; "+
			"fewer than 8 different characters count as nothing): 32 hex digits or 22 base64 characters, e.g. from `openssl rand -hex 16`",
			from, len([]rune(v)), int(bits), MinAdminTokenBits)}
	}
	return v, nil
}

// AdminTokenBits is how strong a token counts as: its length in characters times log2 of the
// smallest alphabet that holds every one of them (hex 16; base32, in one letter case, 32;
// base64 or base64url 64; printable ASCII and anything else 95). A token of fewer than 8 different characters ("aaaa…",
// "01010101…") is a placeholder, not a secret, and counts 0.
func AdminTokenBits(tok string) float64 {
	distinct := map[rune]bool{}
	hex, upper32, lower32, b64 := true, true, true, true
	for _, r := range tok {
		distinct[r] = true
		digit := '0' <= r && r <= '9'
		hex = hex && (digit || 'a' <= r && r <= 'f' || 'A' <= r && r <= 'F')
		upper32 = upper32 && ('2' <= r && r <= '7' || 'A' <= r && r <= 'Z' || r == '=')
		lower32 = lower32 && ('2' <= r && r <= '7' || 'a' <= r && r <= 'z' || r == '=')
		b64 = b64 && (digit || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || strings.ContainsRune("+/-_=", r))
	}
	if len(distinct) < 8 {
		return 0
	}
	alphabet := 95.0
	switch {
	case hex:
		alphabet = 16
	case upper32 || lower32:
		alphabet = 32
	case b64:
		alphabet = 64
	}
	n := len([]rune(strings.TrimRight(tok, "=")))
	return float64(n) * math.Log2(alphabet)
}
