package rpc

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/capbroker/capbroker/broker/budget/redistest"
)

// TestSharedSessions: a session issued through one broker is known to another (one GET, then
// from memory), keeps its first agent when issued twice, is stored under a digest of its id,
// and with the store gone is unknown (local) or an error (fail closed).
func TestSharedSessions(t *testing.T) {
	srv := redistest.Start(t)
	mk := func(failClosed bool) *SharedSessions {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
		t.Cleanup(func() { c.Close() })
		return &SharedSessions{Local: NewSessions(16), Client: c, Prefix: "s:", TTL: time.Hour, FailClosed: failClosed}
	}
	ctx := context.Background()
	a, b, c := mk(true), mk(false), mk(true)
	if err := a.Issued(ctx, "mcp.example", "sess-secret-1", "agent-1"); err != nil {
		t.Fatal(err)
	}
	if err := b.Issued(ctx, "mcp.example", "sess-secret-1", "agent-2"); err != nil { // issued twice
		t.Fatal(err)
	}
	for name, s := range map[string]*SharedSessions{"a": a, "b": b, "c": c} {
		if o, ok, err := s.Owner(ctx, "mcp.example", "sess-secret-1"); err != nil || !ok || o != "agent-1" {
			t.Errorf("%s: Owner = %q %v %v, want agent-1", name, o, ok, err)
		}
	}
	if _, ok, err := c.Owner(ctx, "other.example", "sess-secret-1"); ok || err != nil {
		t.Errorf("another host's session: %v %v", ok, err)
	}
	keys, _ := a.Client.Keys(ctx, "s:*").Result()
	for _, k := range keys {
		if strings.Contains(k, "sess-secret-1") {
			t.Errorf("the session id is in a key: %s", k)
		}
	}
	srv.Stop()
	// Known already: from memory.
	if o, ok, err := c.Owner(ctx, "mcp.example", "sess-secret-1"); err != nil || !ok || o != "agent-1" {
		t.Errorf("store down, known session: %q %v %v", o, ok, err)
	}
	if _, _, err := c.Owner(ctx, "mcp.example", "sess-never"); err == nil {
		t.Error("store down, fail closed: no error")
	}
	if _, ok, err := b.Owner(ctx, "mcp.example", "sess-never"); ok || err != nil {
		t.Errorf("store down, local: %v %v, want unknown", ok, err)
	}
}
