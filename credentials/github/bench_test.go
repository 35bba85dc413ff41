package github

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/credentials"
)

// BenchmarkInject compares the per-request cost of a cached installation token (scope
// canonicalised, cache looked up, put on as Bearer or Basic) with a static header from the
// Store, as the broker injects an API key.
func BenchmarkInject(b *testing.B) {
	b.Setenv("CAPBROKER_BENCH_KEY", "sk-live-0123456789abcdef0123456789abcdef")
	store := credentials.NewStore(map[string]credentials.Source{"key": credentials.Env{Name: "CAPBROKER_BENCH_KEY"}}, credentials.StoreOptions{})
	ctx := context.Background()
	b.Run("static-header", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			req, _ := http.NewRequest("GET", "https://api.github.com/repos/o/r1", nil)
			sec, err := store.Get(ctx, "key")
			if err != nil {
				b.Fatal(err)
			}
			req.Header.Set("Authorization", strings.ReplaceAll("Bearer {{secret}}", "{{secret}}", sec.Reveal()))
		}
	})
	f := setup(b, nil)
	scope := credentials.Scope{"repositories": []any{"r1"}, "permissions": map[string]any{"contents": "write"}}
	if _, err := f.app.Token(ctx, scope); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ name, url string }{
		{"cached-token-api", "https://api.github.com/repos/o/r1"},
		{"cached-token-git", "https://github.com/o/r1.git/info/refs?service=git-upload-pack"},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest("GET", c.url, nil)
				tok, err := f.app.Token(ctx, scope)
				if err != nil {
					b.Fatal(err)
				}
				f.app.Inject(req, tok)
			}
		})
	}
}
