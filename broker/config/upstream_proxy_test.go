package config

import (
	"strings"
	"testing"
	"time"
)

// TestUpstreamProxyPAC: upstream.proxy.pac and its keys are checked with their key paths.
func TestUpstreamProxyPAC(t *testing.T) {
	const base = "ca: {cert_file: c, key_file: k}\npolicy: {dir: p}\nagents: [{id: a, addresses: [\"10.0.0.2\"]}]\n" +
		"upstream:\n  proxy:\n    proxies: [{name: corp, url: \"http://127.0.0.1:3128\"}]\n"
	for name, c := range map[string]struct {
		src  string
		want string // "" = valid
	}{
		"file, proxy fallback": {"    pac: /etc/capbroker/proxy.pac\n    pac_fallback: corp\n", ""},
		"https, direct":        {"    pac: https://wpad.corp.example/proxy.pac\n    pac_fallback: direct\n", ""},
		"file URL, refuse":     {"    pac: file:///etc/p.pac\n    pac_fallback: refuse\n    pac_timeout: 250ms\n", ""},
		"no fallback":          {"    pac: /p.pac\n", "upstream.proxy.pac_fallback: required with pac"},
		"unknown fallback":     {"    pac: /p.pac\n    pac_fallback: other\n", `upstream.proxy.pac_fallback: must be a configured proxy's name, "direct" or "refuse", not "other"`},
		"plain http":           {"    pac: http://wpad/p.pac\n    pac_fallback: direct\n", "upstream.proxy.pac: must be a file path, file:// or an https:// URL"},
		"fallback without pac": {"    pac_fallback: direct\n", "upstream.proxy.pac: required with pac_fallback or pac_timeout"},
		"timeout without pac":  {"    pac_timeout: 1s\n", "upstream.proxy.pac: required with pac_fallback or pac_timeout"},
		"negative timeout":     {"    pac: /p.pac\n    pac_fallback: corp\n    pac_timeout: -1s\n", "upstream.proxy.pac_timeout: must not be negative"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, err := Parse([]byte(base + c.src))
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("got %v, want it to say %q", err, c.want)
			}
			if name == "file URL, refuse" && cfg.Upstream.Proxy.PACTimeout != 250*time.Millisecond {
				t.Fatalf("pac_timeout = %v", cfg.Upstream.Proxy.PACTimeout)
			}
		})
	}
}
