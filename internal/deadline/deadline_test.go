package deadline

import (
	"sync"
	"testing"
	"time"
)

// TestDueWaitsForLastSet: a timer set again while armed keeps its Go timer; called before
// the last deadline it is not due and stays armed, and at the deadline it is due.
func TestDueWaitsForLastSet(t *testing.T) {
	var mu sync.Mutex
	var d Timer
	fired := 0
	f := func() { mu.Lock(); defer mu.Unlock(); fired++ }
	mu.Lock()
	d.Set(time.Hour, f)
	first := d.t
	d.Set(2*time.Hour, f)
	if d.t != first || !d.Armed() {
		t.Fatal("a second Set made a timer of its own, or left it disarmed")
	}
	if d.Due() {
		t.Fatal("due an hour early")
	}
	if !d.Armed() {
		t.Fatal("not armed again for the rest")
	}
	d.Set(-time.Millisecond, f) // the deadline has passed (armed: the timer is not moved)
	if !d.Due() || d.Armed() {
		t.Fatal("not due at the deadline, or still armed after it")
	}
	d.Stop()
	mu.Unlock()
	if fired != 0 {
		t.Fatalf("the function ran %d times; the test called it itself", fired)
	}
}

// TestFires: the function runs once the last deadline passes: the timer fires at the first,
// finds itself early, and fires again for the rest.
func TestFires(t *testing.T) {
	var d Timer
	done := make(chan struct{})
	var mu sync.Mutex
	f := func() {
		mu.Lock()
		defer mu.Unlock()
		if d.Due() {
			close(done)
		}
	}
	mu.Lock()
	d.Set(time.Millisecond, f)
	d.Set(20*time.Millisecond, f)
	mu.Unlock()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the timer did not fire")
	}
}
