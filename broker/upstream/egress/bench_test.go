package egress

import (
	"context"
	"net/netip"
	"strconv"
	"testing"
)

// BenchmarkPACFind measures one Find on the corporate script: from the
// cache, and evaluated (every host new, so every call runs the script).
func BenchmarkPACFind(b *testing.B) {
	ctx := context.Background()
	b.Run("cached", func(b *testing.B) {
		p, err := NewPAC([]byte(corpPAC), PACOptions{Proxies: corpProxies})
		if err != nil {
			b.Fatal(err)
		}
		p.Find(ctx, "https://api.example.com/", "api.example.com")
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := p.Find(ctx, "https://api.example.com/v1", "api.example.com"); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("uncached", func(b *testing.B) {
		p, err := NewPAC([]byte(corpPAC), PACOptions{Proxies: corpProxies})
		if err != nil {
			b.Fatal(err)
		}
		hosts := make([]string, b.N)
		for i := range hosts {
			hosts[i] = "h" + strconv.Itoa(i) + ".example.com"
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if _, err := p.Find(ctx, "https://"+hosts[i]+"/", hosts[i]); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkNoProxyMatch(b *testing.B) {
	np, err := ParseNoProxy([]string{"localhost", ".corp.example", "*.internal.example",
		"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fd00::/8", "registry.example:5000"})
	if err != nil {
		b.Fatal(err)
	}
	addr := netip.MustParseAddr("203.0.113.9")
	b.ReportAllocs()
	for b.Loop() {
		if np.Match("api.openai.com", 443, addr) {
			b.Fatal("matched")
		}
	}
}
