package credentials

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// ErrUnknown is returned for a credential name the store was not built with.
var ErrUnknown = errors.New("unknown credential")

// Store holds the sources of the configured credentials and caches their values. A value is
// re-read after Refresh; if the re-read fails, the last good value keeps serving until it is
// MaxStale old, then Get fails with ErrUnavailable. It never returns an empty secret.
type Store struct {
	refresh, maxStale time.Duration
	now               func() time.Time
	entries           map[string]*entry
}

type entry struct {
	src  Source
	mu   sync.Mutex // serialises fetches of this credential
	cur  atomic.Pointer[cached]
	last atomic.Pointer[error]
}

type cached struct {
	val     Secret
	fetched time.Time
}

// StoreOptions tunes caching. Zero values mean Refresh 1m and MaxStale 15m.
type StoreOptions struct {
	Refresh, MaxStale time.Duration
}

// NewStore builds a store for the named sources. Nothing is fetched until Warm or Get.
func NewStore(sources map[string]Source, opts StoreOptions) *Store {
	if opts.Refresh <= 0 {
		opts.Refresh = time.Minute
	}
	if opts.MaxStale <= 0 {
		opts.MaxStale = 15 * time.Minute
	}
	s := &Store{refresh: opts.Refresh, maxStale: opts.MaxStale, now: time.Now, entries: map[string]*entry{}}
	for name, src := range sources {
		s.entries[name] = &entry{src: src}
	}
	return s
}

// Get returns the current value of the named credential.
func (s *Store) Get(ctx context.Context, name string) (Secret, error) {
	e, ok := s.entries[name]
	if !ok {
		return Secret{}, fmt.Errorf("%w %q", ErrUnknown, name)
	}
	if c := e.cur.Load(); c != nil && s.now().Sub(c.fetched) < s.refresh {
		return c.val, nil
	}
	return s.fetch(ctx, name, e)
}

func (s *Store) fetch(ctx context.Context, name string, e *entry) (Secret, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := s.now()
	c := e.cur.Load()
	if c != nil && now.Sub(c.fetched) < s.refresh {
		return c.val, nil // another caller refreshed it while we waited
	}
	v, err := e.src.Fetch(ctx)
	if err == nil && v.IsZero() {
		err = fmt.Errorf("%w: empty value", ErrUnavailable)
	}
	if err != nil {
		err = fmt.Errorf("credential %q: %w", name, err)
		if !errors.Is(err, ErrUnavailable) {
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		e.last.Store(&err)
		if c != nil && now.Sub(c.fetched) < s.maxStale {
			return c.val, nil
		}
		return Secret{}, err
	}
	e.last.Store(nil)
	e.cur.Store(&cached{val: v, fetched: now})
	return v, nil
}

// Warm fetches every credential once and returns the problems, one per credential that could
// not be read, sorted by name. The broker starts anyway; /readyz reports them.
func (s *Store) Warm(ctx context.Context) []error {
	var errs []error
	for _, name := range s.Names() {
		if _, err := s.fetch(ctx, name, s.entries[name]); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// NotReady lists the credentials whose last fetch failed and that have no usable value,
// with the reason, for /readyz.
func (s *Store) NotReady() map[string]string {
	out := map[string]string{}
	now := s.now()
	for name, e := range s.entries {
		c := e.cur.Load()
		if c != nil && now.Sub(c.fetched) < s.maxStale {
			continue
		}
		if p := e.last.Load(); p != nil {
			out[name] = (*p).Error()
		} else {
			out[name] = "not fetched yet"
		}
	}
	return out
}

// Names returns the credential names, sorted.
func (s *Store) Names() []string {
	names := make([]string, 0, len(s.entries))
	for n := range s.entries {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
