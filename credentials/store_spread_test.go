package credentials

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// stampingSource records when it was fetched.
type stampingSource struct {
	mu    *sync.Mutex
	times *[]time.Time
}

func (s stampingSource) Fetch(context.Context) (Secret, error) {
	s.mu.Lock()
	*s.times = append(*s.times, time.Now())
	s.mu.Unlock()
	return NewSecret("v"), nil
}

// BenchmarkStoreRefreshPeak runs the background refresh of 1,000 credentials, refreshed every
// second, for three seconds after they are warmed, and reports the most fetches that fell in
// one tenth of the refresh interval (peak/tenth) and the fetches per credential per interval
// (per-credential): what Vault sees from a broker with 1,000 credentials (issue 25).
func BenchmarkStoreRefreshPeak(b *testing.B) {
	const n, refresh, run = 1000, time.Second, 3 * time.Second
	for b.Loop() {
		var mu sync.Mutex
		var times []time.Time
		sources := map[string]Source{}
		for i := range n {
			sources[fmt.Sprintf("c%d", i)] = stampingSource{&mu, &times}
		}
		s := NewStore(sources, StoreOptions{Refresh: refresh})
		s.Warm(context.Background())
		mu.Lock()
		start := time.Now()
		times = times[:0]
		mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), run)
		s.Run(ctx)
		cancel()
		mu.Lock()
		buckets := map[int64]int{}
		peak := 0
		for _, t := range times {
			k := int64(t.Sub(start) / (refresh / 10))
			buckets[k]++
			peak = max(peak, buckets[k])
		}
		total := len(times)
		mu.Unlock()
		b.ReportMetric(float64(peak), "peak/tenth")
		b.ReportMetric(float64(total)/float64(n)/float64(run/refresh), "per-credential")
	}
}

// Credentials read together at start are first re-read spread over the refresh interval, each
// a random part of it early, not all when the interval ends.
func TestStoreSpreadsFirstRefresh(t *testing.T) {
	const n, refresh = 1000, time.Minute
	sources := map[string]Source{}
	for i := range n {
		sources[fmt.Sprintf("c%d", i)] = &scripted{val: NewSecret("v")}
	}
	s := NewStore(sources, StoreOptions{Refresh: refresh})
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	s.now = clk.now
	if errs := s.Warm(context.Background()); len(errs) != 0 {
		t.Fatal(errs)
	}
	tenths := make([]int, 10)
	for name, e := range s.entries {
		e.mu.Lock()
		d := s.dueIn(e, clk.now())
		e.mu.Unlock()
		if d <= 0 || d > refresh {
			t.Fatalf("%s: first refresh due in %s, want within (0, %s]", name, d, refresh)
		}
		tenths[min(int(d/(refresh/10)), 9)]++
	}
	for i, k := range tenths {
		// 100 expected in each; all 1,000 fell in the last before.
		if k > 200 {
			t.Errorf("%d of %d first refreshes in tenth %d of the interval: %v", k, n, i, tenths)
		}
	}
}

// The early first refresh reads the source although the value is still fresh, once: the next
// one comes a whole interval later.
func TestStoreRunRefreshesEarlyOnce(t *testing.T) {
	src := &scripted{val: NewSecret("v")}
	s := NewStore(map[string]Source{"c": src}, StoreOptions{Refresh: time.Hour})
	if errs := s.Warm(context.Background()); len(errs) != 0 {
		t.Fatal(errs)
	}
	e := s.entries["c"]
	e.mu.Lock()
	e.phase = time.Hour - 20*time.Millisecond
	e.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor(t, 10*time.Second, "the early refresh", func() error {
		if n := src.count(); n != 2 {
			return fmt.Errorf("%d fetches", n)
		}
		return nil
	})
	e.mu.Lock()
	phase, due := e.phase, s.dueIn(e, time.Now())
	e.mu.Unlock()
	if phase != 0 || due < 59*time.Minute {
		t.Fatalf("after the early refresh: phase %s, next due in %s; want 0 and about an hour", phase, due)
	}
}

// slowSource answers after a delay, like a Vault a round trip away, counting the fetches in
// flight.
type slowSource struct {
	delay          time.Duration
	mu             *sync.Mutex
	inFlight, most *int
	fail           bool
}

func (s slowSource) Fetch(context.Context) (Secret, error) {
	s.mu.Lock()
	*s.inFlight++
	*s.most = max(*s.most, *s.inFlight)
	s.mu.Unlock()
	time.Sleep(s.delay) // the source's latency, not synchronisation
	s.mu.Lock()
	*s.inFlight--
	s.mu.Unlock()
	if s.fail {
		return Secret{}, fmt.Errorf("%w: down", ErrUnavailable)
	}
	return NewSecret("v"), nil
}

func slowSources(n int, delay time.Duration, failing ...string) (map[string]Source, *int) {
	var mu sync.Mutex
	inFlight, most := 0, 0
	sources := map[string]Source{}
	for i := range n {
		name := fmt.Sprintf("c%04d", i)
		sources[name] = slowSource{delay: delay, mu: &mu, inFlight: &inFlight, most: &most, fail: slices.Contains(failing, name)}
	}
	return sources, &most
}

// BenchmarkStoreWarm reads 1,000 credentials from a source 1 ms away: how long the broker's
// start waits for its Vault credentials (issue 25).
func BenchmarkStoreWarm(b *testing.B) {
	sources, _ := slowSources(1000, time.Millisecond)
	for b.Loop() {
		if errs := NewStore(sources, StoreOptions{}).Warm(context.Background()); len(errs) != 0 {
			b.Fatal(errs)
		}
	}
}

// Warm reads credentials a bounded number at a time, every one of them, and reports the
// failures sorted by name.
func TestStoreWarmParallelBounded(t *testing.T) {
	sources, most := slowSources(100, 2*time.Millisecond, "c0042", "c0007")
	s := NewStore(sources, StoreOptions{})
	errs := s.Warm(context.Background())
	if len(errs) != 2 || !strings.Contains(errs[0].Error(), `"c0007"`) || !strings.Contains(errs[1].Error(), `"c0042"`) {
		t.Fatalf("errors: %v", errs)
	}
	if ready := len(s.Names()) - len(s.NotReady()); ready != 98 {
		t.Fatalf("%d credentials ready after Warm, want 98", ready)
	}
	if *most > warmParallel || *most < 2 {
		t.Fatalf("%d fetches at once, want 2 to %d", *most, warmParallel)
	}
}
