package inject

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"testing"

	"github.com/capbroker/capbroker/broker/scrub"
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

// BenchmarkScrubForms is what scrubbing a response of every form of a header-mode key costs,
// next to scrubbing the raw value alone: a small API answer, and 1 MiB of streamed text.
func BenchmarkScrubForms(b *testing.B) {
	const key = "sk-live-0123456789abcdef0123456789abcdef"
	all := set().byName["hdr"].Reveals(credentials.NewSecret(key))
	small := []byte(`{"id":"chatcmpl-bench","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}`)
	var large []byte
	for len(large) < 1<<20 {
		large = append(large, `{"choices":[{"delta":{"content":"some text, 0123456789 abcdef"}}]}`+"\n"...)
	}
	for _, c := range []struct {
		name  string
		forms []string
	}{{"raw", all[:1]}, {fmt.Sprintf("forms=%d", len(all)), all}} {
		r := redactor(c.forms)
		for _, body := range []struct {
			name string
			b    []byte
		}{{"small", small}, {"1MiB", large}} {
			b.Run(c.name+"/"+body.name, func(b *testing.B) {
				p := make([]byte, 32<<10)
				b.SetBytes(int64(len(body.b)))
				b.ReportAllocs()
				for b.Loop() {
					rd := r.Reader(io.NopCloser(bytes.NewReader(body.b)))
					for {
						if _, err := rd.Read(p); err == io.EOF {
							break
						} else if err != nil {
							b.Fatal(err)
						}
					}
					rd.Close()
				}
			})
		}
	}
}

// BenchmarkReveals is the per-request cost of asking for a key's forms, once computed.
func BenchmarkReveals(b *testing.B) {
	bind := set().byName["hdr"]
	secret := credentials.NewSecret("sk-live-0123456789abcdef0123456789abcdef")
	b.ReportAllocs()
	for b.Loop() {
		bind.Reveals(secret)
	}
}

// manySecrets returns the scrub pairs of n keys bound to one host, each in every form the
// binding reveals it (n distinct random-looking keys, as a deployment's would be).
func manySecrets(n int) []string {
	bind := set().byName["hdr"]
	var pairs []string
	rng := rand.New(rand.NewPCG(uint64(n), 40))
	for range n {
		key := fmt.Sprintf("sk-live-%016x%016x", rng.Uint64(), rng.Uint64())
		for _, f := range bind.Reveals(credentials.NewSecret(key)) {
			pairs = append(pairs, f, "[REDACTED]")
		}
	}
	return pairs
}

// BenchmarkScrubSecrets is streamed scrubbing of 1 MiB of text with 1, 10 and 100 keys bound
// to the host, each in all its forms: the cost must not grow with the keys.
func BenchmarkScrubSecrets(b *testing.B) {
	var large []byte
	for len(large) < 1<<20 {
		large = append(large, `{"choices":[{"delta":{"content":"some text, 0123456789 abcdef sk-live-"}}]}`+"\n"...)
	}
	for _, n := range []int{1, 10, 100} {
		r := scrub.New(manySecrets(n)...)
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			p := make([]byte, 32<<10)
			b.SetBytes(int64(len(large)))
			for b.Loop() {
				rd := r.Reader(io.NopCloser(bytes.NewReader(large)))
				for {
					if _, err := rd.Read(p); err == io.EOF {
						break
					} else if err != nil {
						b.Fatal(err)
					}
				}
				rd.Close()
			}
		})
	}
}
