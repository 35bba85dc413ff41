package inject

import (
	"net/http"
	"testing"

	"github.com/capbroker/capbroker/credentials"
)

// BenchmarkApply puts a secret into an outbound request for each kind of rule.
func BenchmarkApply(b *testing.B) {
	s := set()
	secret := credentials.NewSecret("sk-live-0123456789abcdef0123456789abcdef")
	for _, name := range []string{"hdr", "q", "basic", "ph"} {
		bind := s.byName[name]
		host := bind.hosts[0]
		if host[0] == '*' {
			host = "api" + host[1:]
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest("GET", "https://"+host+"/v1/x?a=1&k=PLACEHOLDER_llm", nil)
				req.Header.Set("Authorization", "Bearer PLACEHOLDER_llm")
				req.Header.Set("User-Agent", "agent/1.0")
				bind.Apply(req, secret)
			}
		})
	}
}

// BenchmarkMatching is the per-request lookup of the credentials bound to a host.
func BenchmarkMatching(b *testing.B) {
	s := set()
	b.ReportAllocs()
	for b.Loop() {
		s.Matching("api.example.com")
	}
}
