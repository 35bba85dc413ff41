package github

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/credentials"
)

// BenchmarkInject compares what putting a credential on a request costs per request: a cached
// installation token (scope keyed, cache looked up, put on as Bearer for the API or Basic for
// git) beside a static value from the Store put on by a header rule or a basic_auth rule, as
// the broker injects an API key. The request is built once; only the credential step is timed.
func BenchmarkInject(b *testing.B) {
	b.Setenv("CAPBROKER_BENCH_KEY", "sk-live-0123456789abcdef0123456789abcdef")
	store := credentials.NewStore(map[string]credentials.Source{"key": credentials.Env{Name: "CAPBROKER_BENCH_KEY"}}, credentials.StoreOptions{})
	ctx := context.Background()
	api, _ := http.NewRequest("GET", "https://api.github.com/repos/o/r1", nil)
	git, _ := http.NewRequest("GET", "https://github.com/o/r1.git/info/refs?service=git-upload-pack", nil)
	static := func(name string, req *http.Request, put func(*http.Request, string)) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sec, err := store.Get(ctx, "key")
				if err != nil {
					b.Fatal(err)
				}
				put(req, sec.Reveal())
			}
		})
	}
	static("static-header", api, func(req *http.Request, v string) {
		req.Header.Set("Authorization", strings.ReplaceAll("Bearer {{secret}}", "{{secret}}", v))
	})
	static("static-basic", git, func(req *http.Request, v string) {
		req.Header.Del("Authorization")
		req.SetBasicAuth("x-access-token", v)
	})

	f := setup(b, nil)
	scope := credentials.Scope{"repositories": []any{"r1"}, "permissions": map[string]any{"contents": "write"}}
	if _, err := f.app.Token(ctx, scope); err != nil {
		b.Fatal(err)
	}
	for name, req := range map[string]*http.Request{"cached-token-api": api, "cached-token-git": git} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				tok, err := f.app.Token(ctx, scope)
				if err != nil {
					b.Fatal(err)
				}
				f.app.Inject(req, tok)
			}
		})
	}
}

// BenchmarkAppendKey is the per-request part of a cached token: the scope's cache key.
func BenchmarkAppendKey(b *testing.B) {
	s := credentials.Scope{"repositories": []any{"r1"}, "permissions": map[string]any{"contents": "write"}}
	b.ReportAllocs()
	for b.Loop() {
		var buf [128]byte
		appendKey(buf[:0], s)
	}
}
