package identity

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"testing"

	"github.com/capbroker/capbroker/broker/config"
)

// benchAgents configures n agents, each with a token (its hash in the config) and one
// address, 10.x.y.z; the one identified, the last, also has 127.0.0.1.
func benchAgents(n int) []config.Agent {
	agents := make([]config.Agent, n)
	for i := range agents {
		sum := sha256.Sum256(fmt.Appendf(nil, "token-%d", i))
		agents[i] = config.Agent{ID: fmt.Sprintf("agent-%d", i), TokenSHA256: hex.EncodeToString(sum[:]),
			Addresses: []string{fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)}}
	}
	agents[n-1].Addresses = append(agents[n-1].Addresses, "127.0.0.1")
	return agents
}

// BenchmarkIdentify identifies the last of n configured agents by token and by source
// address: the cost per request as the config grows (issue 25).
func BenchmarkIdentify(b *testing.B) {
	for _, n := range []int{1, 100, 10000} {
		id, err := New(benchAgents(n))
		if err != nil {
			b.Fatal(err)
		}
		auth := basic(fmt.Sprintf("agent-%d", n-1), fmt.Sprintf("token-%d", n-1))
		src := netip.MustParseAddr("127.0.0.1")
		b.Run(fmt.Sprintf("token/agents=%d", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := id.Identify(auth, src); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("address/agents=%d", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := id.Identify("", src); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
