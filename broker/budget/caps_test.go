package budget

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/capbroker/capbroker/broker/budget/redistest"
)

// TestCapsAcrossBrokers: two brokers' caps over a real redis-server share one agent's rate
// and connections once they have synced, count nothing against another agent, and, with
// the store gone, fail closed or fall back to each broker's own counts as configured.
func TestCapsAcrossBrokers(t *testing.T) {
	srv := redistest.Start(t)
	now := time.Unix(1_900_000_000, 0)
	clock := func() time.Time { return now }
	mk := func(name string, failClosed bool) *Caps {
		st := NewRedis(RedisOptions{Address: srv.Addr, KeyPrefix: "caps-t:"})
		t.Cleanup(func() { st.Close() })
		return NewCaps(CapsOptions{Store: st, Instance: name, RequestsPerSecond: 10, Connections: 3, FailClosed: failClosed, Now: clock})
	}
	a, b := mk("a", true), mk("b", false)
	ctx := context.Background()
	a.sync(ctx)
	b.sync(ctx)
	for i := range 6 {
		if err := a.Request("agent-1"); err != nil {
			t.Fatalf("a, request %d: %v", i, err)
		}
	}
	if a.Claim("agent-1") != nil || a.Claim("agent-1") != nil {
		t.Fatal("a could not open two connections")
	}
	a.sync(ctx)
	b.sync(ctx)
	for i := range 4 {
		if err := b.Request("agent-1"); err != nil {
			t.Fatalf("b, request %d after a's 6: %v", i, err)
		}
	}
	if err := b.Request("agent-1"); !errors.Is(err, ErrRateCapped) {
		t.Fatalf("b, the 11th request of the second across both: %v, want ErrRateCapped", err)
	}
	if err := b.Request("agent-2"); err != nil {
		t.Fatalf("another agent: %v", err)
	}
	if b.Claim("agent-1") != nil {
		t.Fatal("b could not open the third connection")
	}
	if err := b.Claim("agent-1"); !errors.Is(err, ErrConnsCapped) {
		t.Fatal("b opened a fourth connection across the fleet")
	}
	a.Release("agent-1")
	a.sync(ctx)
	b.sync(ctx)
	if b.Claim("agent-1") != nil {
		t.Fatal("b could not open a connection a gave back")
	}
	// The next second starts afresh.
	now = now.Add(time.Second)
	if err := b.Request("agent-1"); err != nil {
		t.Fatalf("a new second: %v", err)
	}
	// The store is gone: a fails closed, b counts alone.
	srv.Stop()
	now = now.Add(2 * staleAfter)
	a.sync(ctx)
	b.sync(ctx)
	if err := a.Request("agent-3"); !errors.Is(err, ErrCapsUnusable) {
		t.Fatalf("fail_closed with the store down: %v", err)
	}
	if err := a.Claim("agent-3"); !errors.Is(err, ErrCapsUnusable) {
		t.Fatalf("fail_closed with the store down: a connection: %v", err)
	}
	if err := b.Request("agent-3"); err != nil {
		t.Fatalf("local with the store down: %v", err)
	}
}
