package oauth2

import (
	"context"
	"testing"

	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/credentials"
	"github.com/capbroker/capbroker/credentials/oauth2/oauth2test"
)

// BenchmarkToken is the per-request cost of a cached token beside that of a static secret
// (the Store's cached value, what a static header injects), sequential and in parallel.
func BenchmarkToken(b *testing.B) {
	b.Setenv("BENCH_STATIC_SECRET", "sk-live-0123456789abcdef0123456789abcdef")
	store := credentials.NewStore(map[string]credentials.Source{"static": credentials.Env{Name: "BENCH_STATIC_SECRET"}}, credentials.StoreOptions{})
	srv := oauth2test.Start(b)
	srv.AddClient(oauth2test.Client{ID: "c", Auth: AuthClientSecretBasic, Secret: "s",
		Grants: []string{GrantClientCredentials}, Scopes: []string{"read", "write"}})
	m, err := New("api", Config{TokenURL: srv.TokenURL, ClientID: "c", Scopes: []string{"read", "write"}}, Deps{
		Root:       func(context.Context) (credentials.Secret, error) { return credentials.NewSecret("s"), nil },
		HTTPClient: srv.HTTPClient(), Log: zerolog.Nop(),
	})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close(context.Background())
	ctx := context.Background()
	narrow := credentials.Scope{"scopes": []any{"read"}}
	cases := []struct {
		name string
		get  func() (credentials.Secret, error)
	}{
		{"static", func() (credentials.Secret, error) { return store.Get(ctx, "static") }},
		{"minted", func() (credentials.Secret, error) { return m.Token(ctx, nil) }},
		{"minted-scoped", func() (credentials.Secret, error) { return m.Token(ctx, narrow) }},
	}
	for _, c := range cases {
		if _, err := c.get(); err != nil { // warm the caches
			b.Fatal(err)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.get(); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"-parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.get(); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
	if srv.Calls() != 2 {
		b.Errorf("%d token requests, want one per scope", srv.Calls())
	}
}
