package budget

import (
	"context"
	"sync"
	"time"
)

// Counter is one budget's counter in one window, as a check asks the store about it.
type Counter struct {
	Key   string
	Limit int64
	Add   int64 // added when no counter of the check is over its limit (requests: 1)
	TTL   time.Duration
}

// A Store keeps counters. Take and Add are atomic per key; Take is atomic over its counters.
type Store interface {
	// Take reads the counters and, when none is at or over its limit, adds each one's Add. It
	// returns the values after, and the index of the first counter at or over its limit (-1:
	// none, and the adds were made). One round trip for a shared store.
	Take(ctx context.Context, cs []Counter) (values []int64, over int, err error)
	// Add adds n to a counter (usage recorded after a call).
	Add(ctx context.Context, key string, n int64, ttl time.Duration) error
	// Get reads counters (0 for a missing one).
	Get(ctx context.Context, keys []string) ([]int64, error)
}

// Memory is the in-process store: counters in a map, each dropped after its TTL.
type Memory struct {
	mu  sync.Mutex
	m   map[string]*memCounter
	now func() time.Time
	gc  time.Time
}

type memCounter struct {
	v       int64
	expires time.Time
}

// NewMemory returns an empty in-process store.
func NewMemory() *Memory { return &Memory{m: map[string]*memCounter{}, now: time.Now} }

func (s *Memory) get(key string, now time.Time) *memCounter {
	c := s.m[key]
	if c != nil && now.After(c.expires) {
		delete(s.m, key)
		c = nil
	}
	return c
}

// sweep drops expired counters, at most once a minute.
func (s *Memory) sweep(now time.Time) {
	if now.Sub(s.gc) < time.Minute {
		return
	}
	s.gc = now
	for k, c := range s.m {
		if now.After(c.expires) {
			delete(s.m, k)
		}
	}
}

func (s *Memory) Take(_ context.Context, cs []Counter) ([]int64, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.sweep(now)
	vals := make([]int64, len(cs))
	over := -1
	for i, c := range cs {
		if mc := s.get(c.Key, now); mc != nil {
			vals[i] = mc.v
		}
		if over < 0 && vals[i] >= c.Limit {
			over = i
		}
	}
	if over >= 0 {
		return vals, over, nil
	}
	for i, c := range cs {
		if c.Add == 0 {
			continue
		}
		s.addLocked(c.Key, c.Add, c.TTL, now)
		vals[i] += c.Add
	}
	return vals, -1, nil
}

func (s *Memory) addLocked(key string, n int64, ttl time.Duration, now time.Time) {
	mc := s.get(key, now)
	if mc == nil {
		mc = &memCounter{expires: now.Add(ttl)}
		s.m[key] = mc
	}
	mc.v += n
}

func (s *Memory) Add(_ context.Context, key string, n int64, ttl time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addLocked(key, n, ttl, s.now())
	return nil
}

// seed sets a counter to at least v (local fallback starts from the last value the shared
// store gave).
func (s *Memory) seed(key string, v int64, ttl time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	mc := s.get(key, now)
	if mc == nil {
		s.m[key] = &memCounter{v: v, expires: now.Add(ttl)}
	} else if mc.v < v {
		mc.v = v
	}
}

// drop forgets a counter.
func (s *Memory) drop(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, key)
}

func (s *Memory) Get(_ context.Context, keys []string) ([]int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	out := make([]int64, len(keys))
	for i, k := range keys {
		if mc := s.get(k, now); mc != nil {
			out[i] = mc.v
		}
	}
	return out, nil
}
