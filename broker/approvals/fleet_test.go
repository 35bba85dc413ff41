package approvals

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/capbroker/capbroker/broker/budget/redistest"
)

// TestSharedQueue: a request held on broker A is listed by broker B's queue, approved from
// B (the decision goes to A, which lets the request go on), and a request whose broker is
// gone is reported lost by the one survivor that removes it.
func TestSharedQueue(t *testing.T) {
	srv := redistest.Start(t)
	client := func() *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { c.Close() })
		return c
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var lost []string
	mk := func(name string) (*Queue, *RedisShared) {
		s := &RedisShared{Client: client(), Prefix: "q:", Instance: name, Lost: func(r Request, inst string) { lost = append(lost, r.ID+"@"+inst) }}
		f := newFixture(t, Options{Shared: s})
		go s.Run(ctx, f.q)
		return f.q, s
	}
	qa, _ := mk("a")
	qb, sb := mk("b")
	// Both subscribed before anything is held: wait for a's heartbeat and subscription.
	waitFor(t, func() bool {
		n, _ := sb.Client.PubSubNumSub(ctx, "q:approvals:decide:a").Result()
		return n["q:approvals:decide:a"] == 1
	})
	res := make(chan Outcome, 1)
	go func() {
		out, _ := qa.Hold(context.Background(), Request{Agent: "agent-1", Method: "POST", Scheme: "https", Host: "h", Port: 443, Path: "/x"})
		res <- out
	}()
	var held Request
	waitFor(t, func() bool {
		for _, r := range qb.Pending() {
			if r.Path == "/x" {
				held = r
				return true
			}
		}
		return false
	})
	if held.Instance != "a" {
		t.Fatalf("b lists the request as held by %q", held.Instance)
	}
	if _, err := qb.Approve(held.ID, Approval{By: "alice", Scope: ScopeOnce}); err != nil {
		t.Fatal(err)
	}
	if out := <-res; out.State != StateApproved || out.By != "alice" {
		t.Fatalf("outcome on a: %+v", out)
	}
	if _, err := qb.Approve(held.ID, Approval{By: "alice"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("approving again from b: %v", err)
	}
	// A request of a broker that is gone (no heartbeat): removed and reported once.
	ghost := Request{ID: "ap-ghost", Agent: "agent-1", Path: "/y", Created: time.Now(), Expires: time.Now().Add(time.Hour)}
	(&RedisShared{Client: sb.Client, Prefix: "q:", Instance: "gone"}).Held(ghost)
	for range 2 {
		for _, r := range qb.Pending() {
			if r.ID == ghost.ID {
				t.Fatal("the gone broker's request is listed")
			}
		}
	}
	if strings.Join(lost, ",") != "ap-ghost@gone" {
		t.Fatalf("lost reports: %v", lost)
	}
	if _, err := qb.Approve(ghost.ID, Approval{By: "alice"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("approving a lost request: %v", err)
	}
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond) // polling another goroutine's subscription
	}
}
