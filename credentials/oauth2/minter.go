// Package oauth2 mints OAuth2 access tokens for the broker to inject: from a client secret or
// a private key (client credentials grant), from a refresh token (refresh token grant, with
// rotated refresh tokens written back to where they are kept), and from a Google service
// account key (JWT bearer grant). The root secret never leaves the broker; the access tokens
// it mints are cached per scope until shortly before they expire.
//
// The OAuth2 protocol itself is golang.org/x/oauth2's (clientcredentials and jwt). This
// package adds what a broker needs around it: a cache per scope, one request to the token
// endpoint in flight per scope however many requests wait, refreshing ahead of expiry,
// serving cached tokens through an outage, checking what the endpoint answers, and errors
// that name a class of failure and never carry a body, a secret or a token.
package oauth2

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/oauth2"

	"github.com/capbroker/capbroker/credentials"
)

const (
	// mintTimeout bounds one request to the token endpoint (and the writes that follow it).
	mintTimeout = 30 * time.Second
	// aheadMin is the least time before expiry a token is refreshed ahead of need; longer
	// tokens are refreshed a tenth of their lifetime ahead, at most half of it.
	aheadMin = time.Minute
	// guardMax is how long before expiry a token stops being handed out at all (a tenth of
	// its lifetime for short tokens): a request takes time to reach the upstream, and clocks
	// differ.
	guardMax = 10 * time.Second
	// maxLifetime caps how long a token is believed to live, whatever expires_in says.
	maxLifetime = 24 * time.Hour
	// retryMin and retryMax bound the pause after a failed mint before the endpoint is asked
	// again (the error is returned at once meanwhile), so an outage is not hammered.
	retryMin = time.Second
	retryMax = 30 * time.Second
	// rejectGrace: a token minted to replace a rejected one is not dropped on a refusal
	// within this time. An upstream that refuses every request on some path (401 for 403)
	// would otherwise have the broker mint a token per request.
	rejectGrace = 10 * time.Second
)

// Root returns the credential's root secret: a client secret, a private key, or a service
// account key. The broker passes its Store's getter for the credential's source.
type Root func(ctx context.Context) (credentials.Secret, error)

// Deps are what a Minter needs from the broker.
type Deps struct {
	// Root reads the credential's source. Required.
	Root Root
	// HTTPClient talks to the token endpoint; nil means one with the system roots and no
	// proxy. Redirects are never followed whatever the client says.
	HTTPClient *http.Client
	// Log receives refresh failures (their class only) and write-back failures.
	Log zerolog.Logger
	// Now is the clock; nil means time.Now. Tests move it.
	Now func() time.Time
	// Room is asked before each mint (credentials.Room): the broker's registry of known
	// secrets, which scrubs every token until it expires, refuses one more when it is full.
	// Nil: always room.
	Room credentials.Room
}

// mintFunc asks the endpoint for a token with these scopes (nil: the configured default).
type mintFunc func(ctx context.Context, scopes []string) (*oauth2.Token, error)

// Minter caches and refreshes the tokens of one credential. It implements credentials.Minter.
type Minter struct {
	name    string
	log     zerolog.Logger
	now     func() time.Time
	allowed []string // configured scopes; a decision may only narrow them
	mint    mintFunc
	after   func() string // class of a problem that outlives a successful mint ("" if none)
	room    credentials.Room
	skew    *skewWatch // the token endpoint's clock against ours (nil in some tests)

	bg     context.Context // cancelled by Close: mints in flight stop
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// entries holds an *entry per scope key. A request finding a good token reads it without
	// a lock (entries.Load, entry.cur.Load); everything else happens under mu.
	entries sync.Map
	closed  atomic.Bool

	mu          sync.Mutex
	lastRefresh time.Time
	lastErr     string
}

// entry is the state of one scope. Its fields are written under Minter.mu.
type entry struct {
	cur     atomic.Pointer[token] // the token handed out, nil if none
	flight  *flight               // non-nil while a mint is in flight
	err     error                 // the last mint's failure, nil after a success
	retryAt time.Time
	delay   time.Duration
	// rejected is when Reject last dropped this scope's token.
	rejected time.Time
}

type token struct {
	val       credentials.Secret
	minted    time.Time // when it was asked for
	expires   time.Time // when the endpoint says it ends
	refreshAt time.Time // from then on, a new one is minted ahead of need
	stopAt    time.Time // from then on, it is not handed out
}

// flight is one mint; waiters block on done.
type flight struct {
	done chan struct{}
	tok  *token
	err  error
}

func newMinter(name string, allowed []string, deps Deps, mint mintFunc) *Minter {
	now := deps.Now
	if now == nil {
		now = time.Now
	}
	bg, cancel := context.WithCancel(context.Background())
	return &Minter{
		name:    name,
		log:     deps.Log.With().Str("credential", name).Logger(),
		now:     now,
		allowed: allowed,
		mint:    mint,
		room:    deps.Room,
		bg:      bg,
		cancel:  cancel,
	}
}

// Token implements credentials.Minter. A token good for a while yet is served from the cache.
// One that is nearing its end is still served while a new one is minted in the background.
// Otherwise the caller waits for the mint, shared with every other caller of the same scope.
func (m *Minter) Token(ctx context.Context, scope credentials.Scope) (credentials.Secret, error) {
	key, err := m.scopeKey(scope)
	if err != nil {
		return credentials.Secret{}, err
	}
	if m.closed.Load() {
		return credentials.Secret{}, fmt.Errorf("%w: credential %q: closed", credentials.ErrUnavailable, m.name)
	}
	now := m.now()
	if v, ok := m.entries.Load(key); ok {
		if cur := v.(*entry).cur.Load(); cur != nil && now.Before(cur.refreshAt) {
			return cur.val, nil // the common case: no lock
		}
	}
	m.mu.Lock()
	v, _ := m.entries.LoadOrStore(key, &entry{})
	e := v.(*entry)
	cur := e.cur.Load()
	if cur != nil && now.Before(cur.refreshAt) {
		m.mu.Unlock()
		return cur.val, nil
	}
	usable := cur != nil && now.Before(cur.stopAt)
	f := e.flight
	if f == nil {
		if now.Before(e.retryAt) { // backing off after a failure
			m.mu.Unlock()
			if usable {
				return cur.val, nil
			}
			return credentials.Secret{}, m.wrap(e.err)
		}
		var scopes []string // nil: the configured ones
		if key != "" {
			scopes = strings.Fields(key)
		}
		f = m.start(e, scopes)
	}
	m.mu.Unlock()
	if usable {
		return cur.val, nil
	}
	select {
	case <-f.done:
	case <-ctx.Done():
		return credentials.Secret{}, fmt.Errorf("%w: credential %q: %w", credentials.ErrUnavailable, m.name, ctx.Err())
	}
	if f.err != nil {
		return credentials.Secret{}, m.wrap(f.err)
	}
	return f.tok.val, nil
}

func (m *Minter) wrap(err error) error {
	return fmt.Errorf("%w: credential %q: %w", credentials.ErrUnavailable, m.name, err)
}

// start mints a token for e in the background; scopes nil means the configured ones. m.mu is
// held.
func (m *Minter) start(e *entry, scopes []string) *flight {
	f := &flight{done: make(chan struct{})}
	e.flight = f
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer close(f.done)
		ctx, cancel := context.WithTimeout(m.bg, mintTimeout)
		defer cancel()
		began := m.now()
		var tok *token
		err := m.hasRoom()
		if err == nil {
			tok, err = m.mintChecked(ctx, scopes, began)
		}
		var after string
		if err == nil && m.after != nil {
			after = m.after()
		}
		skew := m.skew.problem()
		if skew != "" {
			m.log.Warn().Str("problem", skew).Msg("the token endpoint's clock differs from ours: JWT assertions may be refused")
		}

		m.mu.Lock()
		defer m.mu.Unlock()
		e.flight = nil
		f.tok, f.err = tok, err
		if err != nil {
			e.err = err
			e.delay = min(max(2*e.delay, retryMin), retryMax)
			e.retryAt = m.now().Add(e.delay)
			m.lastErr = joinProblems(err.Error(), skew)
			m.log.Warn().Str("error", err.Error()).Strs("scopes", scopes).Msg("minting an access token failed")
			return
		}
		e.err, e.delay, e.retryAt = nil, 0, time.Time{}
		e.cur.Store(tok)
		m.lastRefresh = m.now()
		m.lastErr = joinProblems(after, skew)
		m.log.Debug().Time("valid_until", tok.expires).Strs("scopes", scopes).Msg("access token minted")
	}()
	return f
}

// hasRoom asks the broker whether one more token can be known until it expires.
func (m *Minter) hasRoom() error {
	if m.room == nil {
		return nil
	}
	if err := m.room(); err != nil {
		return failure("no room to remember one more token until it expires: %v", err)
	}
	return nil
}

// mintChecked mints and checks what the endpoint answered. began is when the request was
// made: the token's lifetime counts from then.
func (m *Minter) mintChecked(ctx context.Context, scopes []string, began time.Time) (*token, error) {
	t, err := m.mint(ctx, scopes)
	if err != nil {
		return nil, classify(err)
	}
	if t == nil || t.AccessToken == "" {
		return nil, failure("token endpoint answer has no access_token")
	}
	if tt := t.TokenType; !strings.EqualFold(tt, "bearer") {
		if tt == "" {
			return nil, failure("token endpoint answer has no token_type")
		}
		return nil, failure("token endpoint answered token_type %s, not Bearer", printable(tt))
	}
	secs, ok := expiresIn(t)
	if !ok {
		return nil, failure("token endpoint answer has no usable expires_in")
	}
	if secs <= 0 {
		return nil, failure("token endpoint answered expires_in %d", secs)
	}
	if granted, ok := t.Extra("scope").(string); ok && granted != "" {
		// Without configured scopes the endpoint's default was asked for: nothing to compare.
		want := scopes
		if want == nil {
			want = m.allowed
		}
		for _, s := range strings.Fields(granted) {
			if len(want) > 0 && !slices.Contains(want, s) {
				return nil, failure("token endpoint granted scopes that were not asked for")
			}
		}
	}
	life := min(time.Duration(secs)*time.Second, maxLifetime)
	ahead := min(max(aheadMin, life/10), life/2)
	guard := min(guardMax, life/10)
	exp := began.Add(life)
	return &token{
		val:       credentials.NewSecret(t.AccessToken).Until(exp),
		minted:    began,
		expires:   exp,
		refreshAt: exp.Add(-ahead),
		stopAt:    exp.Add(-guard),
	}, nil
}

// expiresIn reads expires_in from the answer as sent (the library drops values <= 0).
func expiresIn(t *oauth2.Token) (int64, bool) {
	switch v := t.Extra("expires_in").(type) {
	case float64:
		if v != math.Trunc(v) || math.Abs(v) > 1e12 {
			return 0, false
		}
		return int64(v), true
	case string:
		n, err := strconv.ParseInt(v, 10, 64)
		return n, err == nil
	}
	return 0, false
}

// printable returns s if it is a short word, for an error message; a placeholder otherwise.
func printable(s string) string {
	if len(s) <= 16 && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_") == "" {
		return strconv.Quote(s)
	}
	return "(unexpected value)"
}

// scopeKey reads the decision's scope: nil means the configured scopes (key ""); otherwise
// {"scopes": [...]}, every one of them configured. The key is the scopes, sorted, without
// duplicates, joined by spaces (scopes hold no spaces: see Config.Validate).
func (m *Minter) scopeKey(scope credentials.Scope) (string, error) {
	if scope == nil {
		return "", nil
	}
	refuse := func(format string, args ...any) (string, error) {
		return "", fmt.Errorf("%w: credential %q: %w: %s", credentials.ErrUnavailable, m.name, ErrScope, fmt.Sprintf(format, args...))
	}
	v, ok := scope["scopes"]
	if !ok || len(scope) != 1 {
		for k := range scope {
			if k != "scopes" {
				return refuse("an OAuth2 grant's scope has only \"scopes\", not %s", printable(k))
			}
		}
	}
	var buf [8]string
	list := buf[:0]
	switch x := v.(type) {
	case []string:
		list = append(list, x...)
	case []any:
		for _, s := range x {
			str, ok := s.(string)
			if !ok {
				return refuse("scopes must be strings")
			}
			list = append(list, str)
		}
	default:
		return refuse("scopes must be a list of strings")
	}
	if len(list) == 0 {
		return refuse("the decision narrows the grant to no scope at all")
	}
	for _, s := range list {
		if !slices.Contains(m.allowed, s) {
			return refuse("the decision asks for a scope the credential is not configured with")
		}
	}
	if len(list) == 1 {
		return list[0], nil
	}
	slices.Sort(list)
	return strings.Join(slices.Compact(list), " "), nil
}

// Reject implements credentials.Minter: the upstream refused tok, so it is not handed out
// again and the next Token mints a new one. The broker scrubs it until it expires. A token that
// itself replaced a rejected one less than rejectGrace ago is kept: the request, not the
// token, is what the upstream refuses.
func (m *Minter) Reject(tok credentials.Secret) {
	if tok.IsZero() {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.entries.Range(func(_, v any) bool {
		e := v.(*entry)
		cur := e.cur.Load()
		if cur == nil || cur.val.Reveal() != tok.Reveal() {
			return true
		}
		now := m.now()
		if !e.rejected.IsZero() && !cur.minted.Before(e.rejected) && now.Sub(cur.minted) < rejectGrace {
			m.log.Debug().Msg("the upstream refused an access token minted moments ago; it is kept")
			return true
		}
		e.rejected = now
		e.cur.Store(nil)
		// A refusal is no reason to wait out a backoff: the endpoint answered last time.
		e.retryAt = time.Time{}
		m.log.Info().Msg("the upstream refused an access token; a new one will be minted")
		return true
	})
}

// Status implements credentials.Minter.
func (m *Minter) Status() credentials.DerivedStatus {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	st := credentials.DerivedStatus{LastRefresh: m.lastRefresh, LastError: m.lastErr}
	failing := false
	m.entries.Range(func(_, v any) bool {
		e := v.(*entry)
		if cur := e.cur.Load(); cur != nil && now.Before(cur.stopAt) {
			st.Ready = true
			if cur.expires.After(st.ValidUntil) {
				st.ValidUntil = cur.expires
			}
		}
		if e.err != nil {
			failing = true
		}
		return true
	})
	// Nothing minted yet, or the last mints worked: one can be minted.
	if !failing && !m.closed.Load() {
		st.Ready = true
	}
	return st
}

// Close implements credentials.Minter. OAuth2 access tokens are not revoked (few endpoints
// support it, and they expire soon); mints in flight are stopped.
func (m *Minter) Close(ctx context.Context) error {
	m.closed.Store(true)
	m.cancel()
	done := make(chan struct{})
	go func() { m.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

var _ credentials.Minter = (*Minter)(nil)
