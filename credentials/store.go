package credentials

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// ErrUnknown is returned for a credential name the store was not built with.
var ErrUnknown = errors.New("unknown credential")

const (
	// retryMin is the first delay before a failed fetch is tried again (capped by Refresh).
	retryMin = time.Second
	// fetchTimeout bounds one background fetch, so a source that hangs is retried.
	fetchTimeout = 30 * time.Second
	// warmParallel bounds the credentials Warm reads at once. One at a time, the broker's
	// start waited for one Vault round trip per credential in turn (1.1 s for 1,000 on
	// loopback; ten times that against a Vault 10 ms away).
	warmParallel = 16
	// minWake is the shortest pause of the background loop between two looks at a credential.
	minWake = 10 * time.Millisecond
	// staleGrace is how long a value may be past its refresh, while a re-read that has not
	// failed yet is under way, before it counts as stale: a re-read takes milliseconds, a
	// hung source forever.
	staleGrace = time.Second
)

// Store holds the sources of the configured credentials and caches their values.
//
//   - A value is re-read after Refresh, or earlier when the source says it must be (a Vault
//     lease about to end). In the background (Run), the first re-read comes a random part of
//     Refresh early, so that credentials read together at start are re-read spread over the
//     interval rather than together.
//   - If the re-read fails, the last good value keeps serving until it is MaxStale old (or its
//     lease has expired), then Get fails with ErrUnavailable.
//   - After a failure the source is not asked again before a delay that grows exponentially
//     (with jitter) from 1s up to Refresh, so an outage never turns requests into a stream of
//     calls to Vault; in the meantime Get serves the cached value or the last error at once.
//   - While one caller re-reads a value, other callers are served the cached value instead of
//     waiting for the source.
//   - A value served past its refresh because the re-read failed, or has hung for staleGrace,
//     is stale: it is logged (warn, with the credential's name and the value's age, never the
//     value) the first time it is served so, and again when the credential is fresh again or
//     has no usable value any more; Status reports its age.
//
// A rotated value is forgotten here: the broker's registry of known secrets (broker/inject
// Known) records every value as it is sent, and keeps scrubbing it after a rotation.
//
// It never returns an empty secret.
type Store struct {
	refresh, maxStale time.Duration
	now               func() time.Time
	log               zerolog.Logger
	entries           map[string]*entry
}

type entry struct {
	src  Source
	cur  atomic.Pointer[cached]
	last atomic.Pointer[error]

	mu      sync.Mutex // serialises fetches of this credential; guards the fields below
	retry   backoff
	retryAt time.Time // after a failure, no fetch before this
	// phase brings the first background refresh forward by a random part of the refresh
	// interval, once: credentials read together at start are then re-read spread over the
	// interval, not all in the same moment of every interval (1,000 Vault reads a second
	// each minute with 1,000 credentials). The interval itself is unchanged.
	phase time.Duration

	// state is what was last logged of the credential (health*); shared, like the entry,
	// by the stores of successive configs. noteMu serialises its changes.
	state  atomic.Int32
	noteMu sync.Mutex
}

// The states of a credential whose changes are logged.
const (
	healthUnread      int32 = iota // never read: the start's own messages report it
	healthFresh                    // served within its refresh interval
	healthStale                    // served past it, the source failing or hung
	healthUnavailable              // no usable value: requests granted it get 503
)

type cached struct {
	val     Secret
	fetched time.Time
}

// StoreOptions tunes caching. Zero values mean Refresh 1m and MaxStale 15m.
type StoreOptions struct {
	Refresh, MaxStale time.Duration
	// Log receives a line when a credential starts being served stale, is fresh again, or
	// becomes unavailable. It never sees a value.
	Log zerolog.Logger
}

// NewStore builds a store for the named sources. Nothing is fetched until Warm or Get.
func NewStore(sources map[string]Source, opts StoreOptions) *Store {
	if opts.Refresh <= 0 {
		opts.Refresh = time.Minute
	}
	if opts.MaxStale <= 0 {
		opts.MaxStale = 15 * time.Minute
	}
	s := &Store{refresh: opts.Refresh, maxStale: opts.MaxStale, now: time.Now, log: opts.Log, entries: map[string]*entry{}}
	for name, src := range sources {
		s.entries[name] = &entry{src: src, retry: backoff{min: min(retryMin, opts.Refresh), max: opts.Refresh},
			phase: rand.N(opts.Refresh)}
	}
	return s
}

// Get returns the current value of the named credential.
func (s *Store) Get(ctx context.Context, name string) (Secret, error) {
	e, ok := s.entries[name]
	if !ok {
		return Secret{}, fmt.Errorf("%w %q", ErrUnknown, name)
	}
	now := s.now()
	c := e.cur.Load()
	if s.fresh(c, now) {
		return c.val, nil
	}
	if s.usable(c, now) {
		// Someone is already re-reading it (perhaps waiting on an unreachable Vault): the
		// cached value is still good, so do not make this request wait.
		if !e.mu.TryLock() {
			s.note(name, e, now)
			return c.val, nil
		}
	} else {
		e.mu.Lock()
	}
	defer e.mu.Unlock()
	return s.fetchLocked(ctx, name, e, false)
}

// fetchLocked re-reads the value unless it is fresh (and early is false) or the entry is
// backing off after a failure. e.mu must be held.
func (s *Store) fetchLocked(ctx context.Context, name string, e *entry, early bool) (Secret, error) {
	now := s.now()
	c := e.cur.Load()
	if !early && s.fresh(c, now) {
		return c.val, nil // another caller refreshed it while we waited
	}
	if now.Before(e.retryAt) {
		if s.usable(c, now) {
			s.note(name, e, now)
			return c.val, nil
		}
		if p := e.last.Load(); p != nil {
			return Secret{}, *p
		}
	}
	v, err := e.src.Fetch(ctx)
	now = s.now()
	if err == nil && v.IsZero() {
		err = fmt.Errorf("%w: empty value", ErrUnavailable)
	}
	if err != nil {
		err = fmt.Errorf("credential %q: %w", name, err)
		if !errors.Is(err, ErrUnavailable) {
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		if ctx.Err() == nil { // a caller that went away says nothing about the source
			e.last.Store(&err)
			e.retryAt = now.Add(e.retry.next())
			s.note(name, e, now)
		}
		if s.usable(c, now) {
			return c.val, nil
		}
		return Secret{}, err
	}
	e.last.Store(nil)
	e.retry.reset()
	e.retryAt = time.Time{}
	e.cur.Store(&cached{val: v, fetched: now})
	s.note(name, e, now)
	return v, nil
}

// health is the state of e at now (one of health*, never healthUnread).
func (s *Store) health(e *entry, now time.Time) int32 {
	c := e.cur.Load()
	switch {
	case !s.usable(c, now):
		return healthUnavailable
	case s.fresh(c, now):
		return healthFresh
	case e.last.Load() != nil || now.Sub(s.due(c)) > staleGrace:
		return healthStale
	}
	return healthFresh // being re-read, briefly
}

// due is when c stops being fresh.
func (s *Store) due(c *cached) time.Time {
	due := c.fetched.Add(s.refresh)
	if !c.val.refreshBy.IsZero() && c.val.refreshBy.Before(due) {
		due = c.val.refreshBy
	}
	return due
}

// note logs a change of the credential's state: the first time it is served stale, when it
// is fresh again, when it has no usable value any more. Each change is logged once, however
// many requests see it.
func (s *Store) note(name string, e *entry, now time.Time) {
	if s.health(e, now) == e.state.Load() {
		return
	}
	// Decided again under the lock, from the values as they are now: a request that saw the
	// value stale just before a re-read replaced it must not log it stale after the re-read
	// logged it fresh.
	e.noteMu.Lock()
	defer e.noteMu.Unlock()
	now = s.now()
	h, old := s.health(e, now), e.state.Load()
	if h == old {
		return
	}
	e.state.Store(h)
	c := e.cur.Load()
	reason := "re-read under way for longer than " + staleGrace.String()
	if p := e.last.Load(); p != nil {
		reason = (*p).Error()
	}
	switch {
	case h == healthStale:
		s.log.Warn().Str("credential", name).Dur("age", now.Sub(c.fetched)).Dur("max_stale", s.maxStale).
			Str("error", reason).Msg("credential served stale: its source cannot be read; the cached value serves until max_stale")
	case h == healthUnavailable && old != healthUnread:
		s.log.Error().Str("credential", name).Str("error", reason).
			Msg("credential unavailable: no usable value; requests granted it get 503")
	case h == healthFresh && old != healthUnread:
		s.log.Info().Str("credential", name).Msg("credential fresh again")
	}
}

// fresh reports whether c can be served without asking the source.
func (s *Store) fresh(c *cached, now time.Time) bool {
	return c != nil && now.Sub(c.fetched) < s.refresh &&
		(c.val.refreshBy.IsZero() || now.Before(c.val.refreshBy))
}

// usable reports whether c may still be served when the source cannot be read.
func (s *Store) usable(c *cached, now time.Time) bool {
	return c != nil && now.Sub(c.fetched) < s.maxStale &&
		(c.val.expires.IsZero() || now.Before(c.val.expires))
}

// Known returns the value of the named credential this store holds, however stale, or none
// if it has read none. It never reads the source. The broker holds it as known (scrubbed from
// responses from the credential's hosts) from the first response from one of them, sent or
// not: the upstream that issued a key may show it unasked.
func (s *Store) Known(name string) []Secret {
	e, ok := s.entries[name]
	if !ok {
		return nil
	}
	c := e.cur.Load()
	if c == nil {
		return nil
	}
	return []Secret{c.val}
}

// Warm fetches every credential once, up to warmParallel at a time, and returns the problems,
// one per credential that could not be read, sorted by name. The broker starts anyway;
// /readyz reports them.
func (s *Store) Warm(ctx context.Context) []error {
	names := s.Names()
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	slots := make(chan struct{}, warmParallel)
	for i, name := range names {
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			e := s.entries[name]
			e.mu.Lock()
			_, errs[i] = s.fetchLocked(ctx, name, e, false)
			e.mu.Unlock()
		}()
	}
	wg.Wait()
	return slices.DeleteFunc(errs, func(err error) bool { return err == nil })
}

// Run keeps every credential fresh in the background until ctx ends, whether or not
// requests come: each one is re-read when its refresh interval (or its lease) says so, and
// after a failure again on the backoff schedule (1s doubling up to Refresh, with jitter). A
// credential that was unavailable at start (Vault down) becomes ready on its own once its
// source answers, so /readyz follows the source rather than the traffic. Get still reads the
// source itself when it finds no usable value, as before.
func (s *Store) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for name, e := range s.entries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.keep(ctx, name, e)
		}()
	}
	wg.Wait()
}

// keep is Run for one credential.
func (s *Store) keep(ctx context.Context, name string, e *entry) {
	for {
		e.mu.Lock()
		d := s.dueIn(e, s.now())
		if d <= 0 {
			fctx, cancel := context.WithTimeout(ctx, fetchTimeout)
			// With a phase left, a value is due early (dueIn) while still fresh: read it.
			early := e.phase > 0 && e.cur.Load() != nil
			_, _ = s.fetchLocked(fctx, name, e, early)
			if early {
				e.phase = 0 // the value read at start has been replaced once: spread from now on
			}
			if fctx.Err() != nil && ctx.Err() == nil {
				// The source hung: fetchLocked does not count a cancelled caller as a failure
				// of the source, but here the caller is the store itself.
				err := fmt.Errorf("%w: credential %q: no answer within %s", ErrUnavailable, name, fetchTimeout)
				e.last.Store(&err)
				e.retryAt = s.now().Add(e.retry.next())
				s.note(name, e, s.now())
			}
			cancel()
			d = s.dueIn(e, s.now())
		}
		e.mu.Unlock()
		if !sleep(ctx, max(d, minWake)) {
			return
		}
	}
}

// dueIn is how long until the credential should be read again: when its value stops being
// fresh, or, after a failure, when the backoff allows. e.mu must be held.
func (s *Store) dueIn(e *entry, now time.Time) time.Duration {
	if now.Before(e.retryAt) {
		return e.retryAt.Sub(now)
	}
	c := e.cur.Load()
	if !s.fresh(c, now) {
		return 0
	}
	due := c.fetched.Add(s.refresh - e.phase)
	if !c.val.refreshBy.IsZero() && c.val.refreshBy.Before(due) {
		due = c.val.refreshBy
	}
	return due.Sub(now)
}

// CredentialStatus is the state of one credential, for /readyz and the metrics. It never
// holds the value.
type CredentialStatus struct {
	// Ready: the credential has a usable value (fresh, or stale within max_stale).
	Ready bool
	// Error is the last failure to read it ("" when the last read succeeded); a ready
	// credential can carry one while it serves a cached value.
	Error string
	// StaleAge is the age of the value served while it is stale (past its refresh, the
	// source failing or hung); 0 while it is fresh or has no usable value.
	StaleAge time.Duration
	// For a derived credential (Minter): when the newest token it holds expires, and when it
	// last minted one; zero when it has none.
	ValidUntil, LastRefresh time.Time
}

// Status reports every credential by name.
func (s *Store) Status() map[string]CredentialStatus {
	out := make(map[string]CredentialStatus, len(s.entries))
	now := s.now()
	for name, e := range s.entries {
		st := CredentialStatus{Ready: s.usable(e.cur.Load(), now)}
		if s.health(e, now) == healthStale {
			st.StaleAge = now.Sub(e.cur.Load().fetched)
		}
		if p := e.last.Load(); p != nil {
			st.Error = (*p).Error()
		} else if !st.Ready {
			st.Error = "not fetched yet"
		}
		out[name] = st
	}
	return out
}

// NotReady lists the credentials whose last fetch failed and that have no usable value,
// with the reason, for /readyz.
func (s *Store) NotReady() map[string]string {
	out := map[string]string{}
	now := s.now()
	for name, e := range s.entries {
		if s.usable(e.cur.Load(), now) {
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

// NewStoreFrom builds a store for sources, as NewStore does, that takes over from old (a
// config reload): each credential for which unchanged reports true keeps old's entry, shared
// rather than copied — its cached value, the values a rotation replaced, its backoff after a
// failure — so it is not fetched again, and the old store (still serving the requests that
// began before the reload) and the new one never fetch it twice. A credential whose source
// changed starts unread (what the old one sent stays known to the broker's registry of known
// secrets). Credentials not in sources are left to old, which is read only by requests that
// began before the reload.
func NewStoreFrom(old *Store, sources map[string]Source, unchanged func(name string) bool, opts StoreOptions) *Store {
	s := NewStore(sources, opts)
	if old == nil {
		return s
	}
	for name := range s.entries {
		if oe, ok := old.entries[name]; ok && unchanged(name) {
			s.entries[name] = oe
		}
	}
	return s
}

// Release tells the sources of the named credentials that they are no longer used (a config
// reload removed them, or replaced their source): a Vault lease stops being renewed. The
// store still serves the values it has cached, to the requests that began before the reload.
func (s *Store) Release(names ...string) {
	for _, name := range names {
		if e, ok := s.entries[name]; ok {
			if r, ok := e.src.(interface{ Release() }); ok {
				r.Release()
			}
		}
	}
}
