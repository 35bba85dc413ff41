package broker

import (
	"context"
	"testing"
	"time"
)

// TestBodyBudget: an agent holds at most bodiesPerAgent bodies of the limit; one more waits
// for a release of its own, another agent does not wait, and a hold given back in part makes
// room for as much.
func TestBodyBudget(t *testing.T) {
	const limit = 1000
	b := newBodyBudget(limit)
	ctx := context.Background()
	var holds []*bodyHold
	for range bodiesPerAgent {
		h, err := b.hold(ctx, "a", limit+1)
		if err != nil {
			t.Fatal(err)
		}
		holds = append(holds, h)
	}
	if _, err := b.hold(ctx, "b", limit+1); err != nil {
		t.Fatalf("another agent waited: %v", err)
	}
	// waits reports whether a hold of n waits (it has not got through in 50 ms).
	waits := func(n int64) bool {
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := b.hold(short, "a", n)
		return err != nil
	}
	if !waits(1) {
		t.Fatal("a fifth body of the limit was held")
	}
	got := make(chan error, 1)
	go func() {
		_, err := b.hold(ctx, "a", 600)
		got <- err
	}()
	holds[0].keep(400) // 601 bytes given back: the waiting hold fits
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	holds[1].release()
	holds[1].release() // a second release gives back nothing more
	if h, err := b.hold(ctx, "a", limit+1); err != nil || h == nil {
		t.Fatalf("after a release: %v", err)
	}
	// Held: 400 + 1001 + 1001 + 600 + 1001 = 4003 of 4004.
	if waits(1) {
		t.Fatal("the last byte of the budget could not be held")
	}
	if !waits(1) {
		t.Fatal("held more than the budget")
	}
}
