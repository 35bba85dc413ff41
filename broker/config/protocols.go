package config

import (
	"fmt"
	"strings"
)

// Protocols names the endpoints whose requests the policy sees the meaning of, beyond method
// and path (CONTRACT §8): MCP servers (input.mcp), GraphQL APIs (input.graphql) and JSON-RPC
// endpoints (input.jsonrpc).
type Protocols struct {
	MCP     []ProtocolEndpoint `yaml:"mcp"`
	GraphQL []ProtocolEndpoint `yaml:"graphql"`
	JSONRPC []ProtocolEndpoint `yaml:"jsonrpc"`
}

// ProtocolEndpoint is where a protocol is spoken: hosts (names or *.domain) and a path (exact,
// or a prefix ending in "/"; default "/").
type ProtocolEndpoint struct {
	Hosts []string `yaml:"hosts"`
	Path  string   `yaml:"path"`
}

// Matches reports whether a request to host (lower case, no port) and path (normalised) is
// one of e's.
func (e ProtocolEndpoint) Matches(host, path string) bool {
	p := e.Path
	if p == "" {
		p = "/"
	}
	if strings.HasSuffix(p, "/") {
		if !strings.HasPrefix(path, p) {
			return false
		}
	} else if path != p {
		return false
	}
	for _, h := range e.Hosts {
		if HostMatches(h, host) {
			return true
		}
	}
	return false
}

func (c *Config) validateProtocols(e *errs) {
	for name, list := range map[string][]ProtocolEndpoint{"mcp": c.Protocols.MCP, "graphql": c.Protocols.GraphQL, "jsonrpc": c.Protocols.JSONRPC} {
		for i, ep := range list {
			p := fmt.Sprintf("protocols.%s[%d]", name, i)
			if len(ep.Hosts) == 0 {
				e.add(p+".hosts", "required")
			}
			for j, h := range ep.Hosts {
				if err := checkHostPattern(h); err != nil {
					e.add(fmt.Sprintf("%s.hosts[%d]", p, j), "%v", err)
				}
			}
			if ep.Path != "" && !strings.HasPrefix(ep.Path, "/") {
				e.add(p+".path", "%q must start with /", ep.Path)
			}
		}
	}
}
