package config

import (
	"crypto/tls"
	"fmt"
	"strings"
)

// AgentTLS is the agent-facing TLS of intercepted connections (the certificates the broker's
// CA issues per host).
type AgentTLS struct {
	// AgentCurves is the key exchanges the broker accepts on an agent's TLS handshake, in its
	// order of preference; empty, crypto/tls's default: the hybrid post-quantum
	// X25519MLKEM768 first, then X25519, P-256, P-384, P-521. Each handshake, resumed or not,
	// runs one; X25519MLKEM768 costs the broker about a fifth more CPU per new connection
	// than X25519 alone (docs/benchmarks.md), and protects what the agent sends against
	// later decryption by a quantum computer. A list without it trades that for the CPU.
	AgentCurves []string `yaml:"agent_curves"`
}

// curveNames are the names agent_curves takes, as crypto/tls's CurveID String gives them.
var curveNames = map[string]tls.CurveID{}

func init() {
	for _, id := range []tls.CurveID{tls.X25519MLKEM768, tls.X25519, tls.CurveP256, tls.CurveP384, tls.CurveP521} {
		curveNames[strings.ToLower(id.String())] = id
	}
}

// Curves is AgentCurves as crypto/tls's IDs: nil for its default. Call it on a validated
// config.
func (t AgentTLS) Curves() []tls.CurveID {
	var ids []tls.CurveID
	for _, n := range t.AgentCurves {
		ids = append(ids, curveNames[strings.ToLower(n)])
	}
	return ids
}

func (c *Config) validateAgentTLS(e *errs) {
	seen := map[tls.CurveID]bool{}
	for i, n := range c.TLS.AgentCurves {
		id, ok := curveNames[strings.ToLower(n)]
		switch {
		case !ok:
			e.add(fmt.Sprintf("tls.agent_curves[%d]", i), "%q is not a key exchange: X25519MLKEM768, X25519, CurveP256, CurveP384 or CurveP521", n)
		case seen[id]:
			e.add(fmt.Sprintf("tls.agent_curves[%d]", i), "%q is listed twice", n)
		}
		seen[id] = true
	}
}
