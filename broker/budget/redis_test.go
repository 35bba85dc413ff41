package budget

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capbroker/capbroker/broker/budget/redistest"
	"github.com/capbroker/capbroker/broker/usage"
)

// TestRedisShared: three Budgets sharing a real redis-server keep one requests budget under
// concurrent load with no overshoot (the check and the count are one script), tokens
// recorded by one are seen by the others, and the counters survive a Redis restart.
func TestRedisShared(t *testing.T) {
	srv := redistest.Start(t)
	const doc = `{"budgets": {
	  "r": {"agent": "a", "requests": 150, "window": "day"},
	  "tok": {"agent": "a", "provider": "openai", "tokens": 1000, "window": "hour"}
	}}`
	var bs []*Budgets
	for range 3 {
		st := NewRedis(RedisOptions{Address: srv.Addr, KeyPrefix: "t1:"})
		t.Cleanup(func() { st.Close() })
		bs = append(bs, newBudgets(t, doc, Options{Store: st}))
	}
	ctx := context.Background()
	var allowed, exceeded atomic.Int64
	var wg sync.WaitGroup
	for _, b := range bs {
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 20 {
					err := b.Check(ctx, Request{Agent: "a"})
					var ex *Exceeded
					switch {
					case err == nil:
						allowed.Add(1)
					case errors.As(err, &ex):
						exceeded.Add(1)
					default:
						t.Error(err)
					}
				}
			}()
		}
	}
	wg.Wait()
	t.Logf("240 requests through 3 brokers for a budget of 150: %d allowed, %d refused", allowed.Load(), exceeded.Load())
	if allowed.Load() != 150 {
		t.Errorf("%d allowed, want exactly 150", allowed.Load())
	}

	bs[0].Record(usage.Call{Agent: "a", Provider: "openai", Model: "m", In: 600, Out: 500, Reported: true})
	srv.Restart()
	// Redis restarted: the first round trip may find the old connection gone.
	var err error
	for range 3 {
		err = bs[1].Check(ctx, Request{Agent: "a", Provider: "openai"})
		var un *Unavailable
		if !errors.As(err, &un) {
			break
		}
		bs[1].down.Store(0)
	}
	var ex *Exceeded
	if !errors.As(err, &ex) || ex.Used < 150 {
		t.Fatalf("after a Redis restart: %v, want a budget exceeded", err)
	}
	u := bs[2].Usage(ctx, "a", nil)
	if got := u["tok"].(map[string]any)["used"]; got != int64(1100) {
		t.Errorf("tokens recorded by another broker, after a Redis restart: %v, want 1100", got)
	}
}

// TestRedisDownFailsFast: a stopped Redis costs a check at most the store's timeout, then the
// budget's on_store_error applies (503 for fail_closed) without waiting again for a second.
func TestRedisDownFailsFast(t *testing.T) {
	srv := redistest.Start(t)
	st := NewRedis(RedisOptions{Address: srv.Addr, KeyPrefix: "t2:", Timeout: 200 * time.Millisecond})
	t.Cleanup(func() { st.Close() })
	b := newBudgets(t, `{"budgets": {"r": {"requests": 100, "window": "minute"}}}`, Options{Store: st})
	ctx := context.Background()
	if err := b.Check(ctx, Request{Agent: "a"}); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	start := time.Now()
	err := b.Check(ctx, Request{Agent: "a"})
	took := time.Since(start)
	var un *Unavailable
	if !errors.As(err, &un) {
		t.Fatalf("Redis down: %v, want Unavailable", err)
	}
	if took > time.Second {
		t.Errorf("the failed check took %s", took)
	}
	start = time.Now()
	_ = b.Check(ctx, Request{Agent: "a"})
	if d := time.Since(start); d > 150*time.Millisecond { // under the 200ms timeout: no dial was tried
		t.Errorf("the next check waited %s on a store known down", d)
	}
}

// TestRedisDownLocalOvershoot measures local fallback against a real Redis: three brokers
// share a budget of 90 requests with on_store_error local; 30 are counted, Redis stops, and
// each broker goes on with its own counter from the last value it saw. The overshoot is the
// sum of what each saw left, less what was left; when Redis is back, the counts made meanwhile
// are replayed to it, and the budget is spent for every broker.
func TestRedisDownLocalOvershoot(t *testing.T) {
	srv := redistest.Start(t)
	const doc = `{"budgets": {"r": {"agent": "a", "requests": 90, "window": "day", "on_store_error": "local"}}}`
	var bs []*Budgets
	var stores []*Redis
	for range 3 {
		st := NewRedis(RedisOptions{Address: srv.Addr, KeyPrefix: "t3:", Timeout: 200 * time.Millisecond})
		t.Cleanup(func() { st.Close() })
		stores = append(stores, st)
		bs = append(bs, newBudgets(t, doc, Options{Store: st}))
	}
	ctx := context.Background()
	for i := range 30 {
		if err := bs[i%3].Check(ctx, Request{Agent: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	srv.Stop()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for _, b := range bs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				if b.Check(ctx, Request{Agent: "a"}) == nil {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	total := 30 + allowed.Load()
	// The brokers last saw 28, 29 and 30: 62 + 61 + 60 more, 183 in all over 60 left.
	t.Logf("Redis down at 30 of 90, 3 brokers on local counters: %d let through in all, overshoot %d (bound 3 x 62 - 60 = 126)", total, total-90)
	if total-90 <= 0 || total-90 > 126 {
		t.Errorf("overshoot %d, want 1..126", total-90)
	}
	srv.Restart()
	for _, b := range bs {
		b.down.Store(0) // the broker would ask again a second after its last failure
		err := b.Check(ctx, Request{Agent: "a"})
		var ex *Exceeded
		if !errors.As(err, &ex) {
			t.Fatalf("Redis back: %v, want Exceeded", err)
		}
	}
	start, _ := Window(WindowDay, time.Now())
	v, err := stores[0].Get(ctx, []string{bs[0].cur.Load().set.Budgets[0].key("a", start)})
	if err != nil || v[0] != total {
		t.Errorf("Redis counts %v (%v) after the replay, want %d", v, err, total)
	}
}

// TestRedisDownTokensFailClosed: a tokens budget that fails closed refuses the first check
// after Redis stopped, however recently its counter was read: no check decides on an older
// value.
func TestRedisDownTokensFailClosed(t *testing.T) {
	srv := redistest.Start(t)
	st := NewRedis(RedisOptions{Address: srv.Addr, KeyPrefix: "t7:", Timeout: 200 * time.Millisecond})
	t.Cleanup(func() { st.Close() })
	b := newBudgets(t, `{"budgets": {"tok": {"provider": "openai", "tokens": 1000, "window": "day"}}}`, Options{Store: st})
	ctx := context.Background()
	req := Request{Agent: "a", Provider: "openai"}
	if err := b.Check(ctx, req); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	var un *Unavailable
	if err := b.Check(ctx, req); !errors.As(err, &un) || un.Budget != "tok" {
		t.Fatalf("Redis down, a tokens budget failing closed: %v, want Unavailable", err)
	}
}
