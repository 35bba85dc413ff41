package budget

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capbroker/capbroker/broker/budget/redistest"
)

// lossyProxy forwards TCP connections to a Redis server. Armed, it drops the next successful
// reply to a script run (EVAL, EVALSHA) and forwards nothing more on that connection: the
// script ran in Redis, and the client, its reply lost, times out and retries on a new
// connection, as go-redis does after a read timeout or a dropped connection.
type lossyProxy struct {
	addr    string
	armed   atomic.Bool
	dropped atomic.Int64
}

func startLossyProxy(t *testing.T, target string) *lossyProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lossyProxy{addr: ln.Addr().String()}
	var conns sync.WaitGroup
	t.Cleanup(func() { ln.Close(); conns.Wait() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			conns.Add(2)
			var script atomic.Bool // the last command on this connection ran a script
			go func() {            // client -> server
				defer conns.Done()
				defer s.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						script.Store(bytes.Contains(bytes.ToLower(buf[:n]), []byte("eval")))
						if _, werr := s.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
			go func() { // server -> client
				defer conns.Done()
				defer c.Close()
				buf := make([]byte, 64<<10)
				stalled := false
				for {
					n, err := s.Read(buf)
					if n > 0 && !stalled {
						if script.Load() && buf[0] != '-' && p.armed.CompareAndSwap(true, false) {
							p.dropped.Add(1)
							stalled = true // the reply and all after it are lost
							continue
						}
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return p
}

// TestRedisRetryIdempotent: a take or an add whose reply is lost after it ran in Redis is run
// again by the client's retry; the second run adds nothing and answers as the first did.
func TestRedisRetryIdempotent(t *testing.T) {
	srv := redistest.Start(t)
	px := startLossyProxy(t, srv.Addr)
	st := NewRedis(RedisOptions{Address: px.addr, KeyPrefix: "t5:", Timeout: 200 * time.Millisecond})
	t.Cleanup(func() { st.Close() })
	direct := NewRedis(RedisOptions{Address: srv.Addr, KeyPrefix: "t5:"})
	t.Cleanup(func() { direct.Close() })
	ctx := context.Background()
	cs := []Counter{{Key: "req", Limit: 30, Add: 1, TTL: time.Minute}, {Key: "tok", Limit: 1000, TTL: time.Minute}}
	if _, _, err := st.Take(ctx, cs); err != nil { // loads the script
		t.Fatal(err)
	}
	px.armed.Store(true)
	vals, over, err := st.Take(ctx, cs)
	if err != nil {
		t.Fatalf("a take whose first reply was lost: %v (the client should have retried)", err)
	}
	if px.dropped.Load() != 1 {
		t.Fatalf("%d replies dropped, want 1", px.dropped.Load())
	}
	if over != -1 || vals[0] != 2 || vals[1] != 0 {
		t.Errorf("retried take answered %v, over %d; want [2 0], -1", vals, over)
	}
	px.armed.Store(true)
	if err := st.Add(ctx, "tok", 45, time.Minute); err != nil {
		t.Fatalf("an add whose first reply was lost: %v", err)
	}
	if px.dropped.Load() != 2 {
		t.Fatalf("%d replies dropped, want 2", px.dropped.Load())
	}
	got, err := direct.Get(ctx, []string{"req", "tok"})
	if err != nil || got[0] != 2 || got[1] != 45 {
		t.Errorf("Redis holds %v (%v), want [2 45]: a retried take or add counted twice", got, err)
	}
}

// TestRedisRetryKeepsRequestsBudget: a requests budget of 30 through a store whose replies
// are lost now and then (every fifth take): exactly 30 requests are allowed, and Redis counts
// 30. Before takes were idempotent, a retried take counted its request twice: 29 allowed.
func TestRedisRetryKeepsRequestsBudget(t *testing.T) {
	srv := redistest.Start(t)
	px := startLossyProxy(t, srv.Addr)
	st := NewRedis(RedisOptions{Address: px.addr, KeyPrefix: "t6:", Timeout: 200 * time.Millisecond})
	t.Cleanup(func() { st.Close() })
	b := newBudgets(t, `{"budgets": {"r": {"agent": "a", "requests": 30, "window": "day"}}}`, Options{Store: st})
	ctx := context.Background()
	allowed := 0
	for i := range 40 {
		if i%5 == 1 {
			px.armed.Store(true)
		}
		err := b.Check(ctx, Request{Agent: "a"})
		var ex *Exceeded
		switch {
		case err == nil:
			allowed++
		case errors.As(err, &ex):
		default:
			t.Fatalf("check %d: %v", i, err)
		}
	}
	start, _ := Window(WindowDay, time.Now())
	v, err := st.Get(ctx, []string{b.cur.Load().set.Budgets[0].key("a", start)})
	t.Logf("40 checks, %d replies lost: %d allowed, Redis counts %v", px.dropped.Load(), allowed, v)
	if px.dropped.Load() < 5 {
		t.Fatalf("%d replies dropped, want at least 5", px.dropped.Load())
	}
	if allowed != 30 || err != nil || v[0] != 30 {
		t.Errorf("%d allowed, Redis counts %v (%v); want 30 and 30", allowed, v, err)
	}
}
