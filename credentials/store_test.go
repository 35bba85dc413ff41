package credentials

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a settable time source for Store.now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// scripted is a Source whose answer the test sets, counting calls.
type scripted struct {
	mu    sync.Mutex
	val   Secret
	err   error
	calls int
	gate  chan struct{} // when set, Fetch waits for it (or ctx)
}

func (s *scripted) set(v Secret, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.val, s.err = v, err
}

func (s *scripted) count() int { s.mu.Lock(); defer s.mu.Unlock(); return s.calls }

func (s *scripted) Fetch(ctx context.Context) (Secret, error) {
	s.mu.Lock()
	s.calls++
	v, err, gate := s.val, s.err, s.gate
	s.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return Secret{}, ctx.Err()
		}
	}
	return v, err
}

func newTestStore(src Source, opts StoreOptions) (*Store, *clock) {
	s := NewStore(map[string]Source{"c": src}, opts)
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	s.now = clk.now
	return s, clk
}

func mustGet(t *testing.T, s *Store) string {
	t.Helper()
	v, err := s.Get(context.Background(), "c")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	return v.Reveal()
}

func reveal(ss []Secret) []string {
	out := []string{}
	for _, s := range ss {
		out = append(out, s.Reveal())
	}
	return out
}

// TestStoreKnown: the value the store holds, however stale, without reading the source; a
// rotated one is not (the broker's registry of known secrets keeps what was sent).
func TestStoreKnown(t *testing.T) {
	src := &scripted{val: NewSecret("k0")}
	s, clk := newTestStore(src, StoreOptions{Refresh: time.Minute, MaxStale: time.Hour})
	if k := s.Known("c"); len(k) != 0 {
		t.Fatalf("Known before any read: %v", reveal(k))
	}
	mustGet(t, s)
	src.set(NewSecret("k1"), nil)
	clk.add(time.Minute)
	mustGet(t, s)
	src.set(Secret{}, fmt.Errorf("%w: vault down", ErrUnavailable))
	clk.add(2 * time.Hour) // past max_stale: Get fails, the value is still known
	if _, err := s.Get(context.Background(), "c"); err == nil {
		t.Fatal("Get served a value past max_stale")
	}
	reads := src.count()
	if got := fmt.Sprint(reveal(s.Known("c"))); got != "[k1]" {
		t.Fatalf("Known = %s", got)
	}
	if src.count() != reads {
		t.Fatal("Known read the source")
	}
	if s.Known("nope") != nil {
		t.Fatal("Known of an unknown credential")
	}
}

func TestStoreBacksOffAfterFailures(t *testing.T) {
	down := fmt.Errorf("%w: vault unreachable", ErrUnavailable)
	src := &scripted{err: down}
	s, clk := newTestStore(src, StoreOptions{Refresh: time.Minute, MaxStale: 10 * time.Minute})

	// No value yet: the first Get asks the source, the next ones get the error without asking.
	for range 100 {
		if _, err := s.Get(context.Background(), "c"); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Get: %v", err)
		}
	}
	if n := src.count(); n != 1 {
		t.Fatalf("source asked %d times while backing off, want 1", n)
	}
	if nr := s.NotReady(); nr["c"] == "" {
		t.Fatalf("NotReady = %v", nr)
	}
	// The delays grow: after 1s (at most) one more try, then at most one per doubling delay.
	clk.add(time.Second)
	_, _ = s.Get(context.Background(), "c")
	if n := src.count(); n != 2 {
		t.Fatalf("source asked %d times after 1s, want 2", n)
	}
	for range 10 {
		clk.add(time.Second)
		_, _ = s.Get(context.Background(), "c")
	}
	if n := src.count(); n < 4 || n > 6 {
		t.Fatalf("source asked %d times over 10s of growing backoff, want 4..6", n)
	}

	// Recovery: the value is served, and the backoff starts again from the beginning.
	src.set(NewSecret("ok"), nil)
	clk.add(time.Minute)
	if got := mustGet(t, s); got != "ok" {
		t.Fatalf("got %q", got)
	}

	// With a cached value, failures serve it (stale) and still do not hammer the source.
	src.set(Secret{}, down)
	clk.add(time.Minute)
	before := src.count()
	for range 100 {
		if got := mustGet(t, s); got != "ok" {
			t.Fatalf("stale: got %q", got)
		}
	}
	if n := src.count() - before; n != 1 {
		t.Fatalf("source asked %d times while serving stale, want 1", n)
	}
	clk.add(10 * time.Minute) // past MaxStale since the last good read
	if _, err := s.Get(context.Background(), "c"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("past MaxStale: %v", err)
	}
}

func TestStoreCancelledCallerDoesNotStartBackoff(t *testing.T) {
	src := &scripted{val: NewSecret("ok"), gate: make(chan struct{})}
	s, _ := newTestStore(src, StoreOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Get(ctx, "c"); err == nil {
		t.Fatal("want an error for a cancelled caller")
	}
	close(src.gate)
	if got := mustGet(t, s); got != "ok" {
		t.Fatalf("got %q", got)
	}
}

func TestStoreServesCachedValueWhileARefreshIsInFlight(t *testing.T) {
	src := &scripted{val: NewSecret("v1")}
	s, clk := newTestStore(src, StoreOptions{Refresh: time.Minute})
	mustGet(t, s)

	gate := make(chan struct{})
	src.mu.Lock()
	src.gate, src.val = gate, NewSecret("v2")
	src.mu.Unlock()
	clk.add(time.Minute)

	done := make(chan string)
	go func() { v, _ := s.Get(context.Background(), "c"); done <- v.Reveal() }()
	// Wait until the first Get is inside Fetch, then a second Get must not wait for it.
	deadline := time.Now().Add(5 * time.Second)
	for src.count() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the refresh never started")
		}
		time.Sleep(time.Millisecond)
	}
	if got := mustGet(t, s); got != "v1" {
		t.Fatalf("during the refresh: got %q, want the cached v1", got)
	}
	close(gate)
	if got := <-done; got != "v2" {
		t.Fatalf("the refreshing Get returned %q", got)
	}
}

func TestStoreHonoursValueLifetimes(t *testing.T) {
	src := &scripted{}
	s, clk := newTestStore(src, StoreOptions{Refresh: time.Hour, MaxStale: 2 * time.Hour})
	start := clk.now()
	src.set(expiringSecret("lease1", start.Add(10*time.Second), start.Add(20*time.Second)), nil)
	mustGet(t, s)

	clk.add(9 * time.Second)
	mustGet(t, s)
	if n := src.count(); n != 1 {
		t.Fatalf("asked %d times before refreshBy", n)
	}
	clk.add(time.Second) // refreshBy reached, long before Refresh
	mustGet(t, s)
	if n := src.count(); n != 2 {
		t.Fatalf("asked %d times at refreshBy, want 2", n)
	}
	// Vault down: the value is served until it expires, not for MaxStale.
	src.set(Secret{}, fmt.Errorf("%w: down", ErrUnavailable))
	clk.add(5 * time.Second)
	if got := mustGet(t, s); got != "lease1" {
		t.Fatalf("before expiry: %q", got)
	}
	clk.add(5 * time.Second)
	if _, err := s.Get(context.Background(), "c"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("after expiry: %v", err)
	}
}

// TestStoreRunRetriesWithoutTraffic: a credential unavailable at start becomes ready on its
// own once its source answers, and a ready one is re-read every refresh interval, with no
// Get at all.
func TestStoreRunRetriesWithoutTraffic(t *testing.T) {
	src := &scripted{err: fmt.Errorf("%w: connection refused", ErrUnavailable)}
	ok := &scripted{val: NewSecret("fine")}
	s := NewStore(map[string]Source{"c": src, "ok": ok}, StoreOptions{Refresh: 100 * time.Millisecond, MaxStale: time.Hour})
	if errs := s.Warm(context.Background()); len(errs) != 1 {
		t.Fatalf("Warm: %v", errs)
	}
	if st := s.Status(); st["c"].Ready || !strings.Contains(st["c"].Error, "connection refused") || !st["ok"].Ready || st["ok"].Error != "" {
		t.Fatalf("Status after Warm: %+v", st)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	// Failures are retried on the backoff schedule: a few calls, not a hot loop.
	waitFor(t, 5*time.Second, "retries after a failure", func() error {
		if n := src.count(); n < 3 {
			return fmt.Errorf("%d calls", n)
		}
		return nil
	})
	src.set(NewSecret("back"), nil)
	waitFor(t, 5*time.Second, "ready without traffic", func() error {
		if st := s.Status()["c"]; !st.Ready || st.Error != "" {
			return fmt.Errorf("%+v", st)
		}
		return nil
	})
	if len(s.NotReady()) != 0 {
		t.Fatalf("NotReady: %v", s.NotReady())
	}
	// A ready credential is re-read on its refresh schedule: a rotation arrives unasked.
	ok.set(NewSecret("rotated"), nil)
	waitFor(t, 5*time.Second, "rotation without traffic", func() error {
		if k := s.Known("ok"); len(k) == 0 || k[0].Reveal() != "rotated" {
			return errors.New("old value")
		}
		return nil
	})
	calls := src.count()
	cancel()
	<-done
	if n := src.count(); n > calls+1 {
		t.Fatalf("fetches after Run returned: %d -> %d", calls, n)
	}
}

// TestStoreRunBacksOff: while the source fails, Run asks it far less often than its minimum
// wake-up would allow: the delay doubles from 1s (capped by Refresh).
func TestStoreRunBacksOff(t *testing.T) {
	src := &scripted{err: fmt.Errorf("%w: down", ErrUnavailable)}
	s := NewStore(map[string]Source{"c": src}, StoreOptions{Refresh: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel()
	s.Run(ctx)
	// t=0 fails, next in [0.5s,1s], then [1s,2s]: at most 3 calls within 1.2s.
	if n := src.count(); n < 2 || n > 3 {
		t.Fatalf("%d fetches in 1.2s of failures", n)
	}
}

// TestNewStoreFrom: a reload keeps the cached value of an unchanged credential without reading
// its source again; a changed one is read from its new source, and its old value is still
// known (for scrubbing); a removed one is not in the new store.
func TestNewStoreFrom(t *testing.T) {
	ctx := context.Background()
	kept, changed, removed := &countingSource{val: "kept-value"}, &countingSource{val: "old-value"}, &countingSource{val: "gone-value"}
	old := NewStore(map[string]Source{"kept": kept, "changed": changed, "removed": removed}, StoreOptions{})
	if errs := old.Warm(ctx); len(errs) > 0 {
		t.Fatal(errs)
	}
	replacement := &countingSource{val: "new-value"}
	s := NewStoreFrom(old, map[string]Source{"kept": kept, "changed": replacement},
		func(name string) bool { return name == "kept" }, StoreOptions{})
	if errs := s.Warm(ctx); len(errs) > 0 {
		t.Fatal(errs)
	}
	if kept.n != 1 || replacement.n != 1 {
		t.Fatalf("fetches: kept %d (want 1: reused), changed %d (want 1)", kept.n, replacement.n)
	}
	if v, _ := s.Get(ctx, "changed"); v.Reveal() != "new-value" {
		t.Fatal("changed credential does not have its new value")
	}
	if v, _ := old.Get(ctx, "changed"); v.Reveal() != "old-value" {
		t.Fatal("the old store lost its value")
	}
	var known []string
	for _, v := range s.Known("changed") {
		known = append(known, v.Reveal())
	}
	if strings.Join(known, ",") != "new-value" {
		t.Fatalf("known values of the changed credential: %v", known)
	}
	if _, err := s.Get(ctx, "removed"); !errors.Is(err, ErrUnknown) {
		t.Fatalf("removed credential: %v", err)
	}
}

type countingSource struct {
	val string
	n   int
}

func (c *countingSource) Fetch(context.Context) (Secret, error) {
	c.n++
	return NewSecret(c.val), nil
}

// releasingSource records Release.
type releasingSource struct {
	countingSource
	released bool
}

func (r *releasingSource) Release() { r.released = true }

func TestStoreRelease(t *testing.T) {
	gone, kept := &releasingSource{countingSource: countingSource{val: "a"}}, &releasingSource{countingSource: countingSource{val: "b"}}
	s := NewStore(map[string]Source{"gone": gone, "kept": kept, "env": Env{Name: "X"}}, StoreOptions{})
	s.Release("gone", "env", "unknown")
	if !gone.released || kept.released {
		t.Fatalf("released: gone %v, kept %v", gone.released, kept.released)
	}
}
