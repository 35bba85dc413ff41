// Package github mints GitHub App installation tokens, narrowed per decision to the
// repositories and permissions the policy granted. The App's private key stays where it is
// kept: read through the credential's source (the Store caches and rotates it), or never
// leaving Vault, with the app JWT signed by Vault's transit engine.
package github

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/capbroker/capbroker/internal/svcdial"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sync/singleflight"

	"github.com/capbroker/capbroker/credentials"
)

// DefaultAPIURL is GitHub's API; GitHub Enterprise Server has https://HOST/api/v3.
const DefaultAPIURL = "https://api.github.com"

const (
	// refreshBefore: a cached token is replaced this long before it expires (or halfway
	// through its life, if that is shorter), by a mint in the background while it serves.
	refreshBefore = 5 * time.Minute
	// expiryGuard: a token is never handed out when it has less left than this, so it does
	// not expire while its request is on the way.
	expiryGuard = 30 * time.Second
	// maxSkew: a clock further off GitHub's than this is reported and corrected for.
	maxSkew = 30 * time.Second
	// mintTimeout bounds one mint (signing and the token endpoint).
	mintTimeout = 30 * time.Second
	// retryMin/retryMax: after a failed mint the endpoint is not asked again for the same
	// scope before a delay growing from retryMin to retryMax; cached tokens serve meanwhile.
	retryMin = time.Second
	retryMax = time.Minute
	// maxAnswer bounds what is read of a token endpoint's answer.
	maxAnswer  = 1 << 20
	apiVersion = "2022-11-28"
)

// Options configure an App. Exactly one of PrivateKey and SignRS256 is set.
type Options struct {
	Name           string // the credential's name, for logs and errors
	AppID          string // numeric app ID (or the App's client ID): the JWT's issuer
	InstallationID int64
	APIURL         string // "" means DefaultAPIURL

	// PrivateKey returns the App's private key in PEM (PKCS#1 or PKCS#8), e.g. from the
	// broker's Store, which caches and rotates it.
	PrivateKey func(context.Context) (credentials.Secret, error)
	// SignRS256 signs a JWT's signing input with RSASSA-PKCS1-v1_5 and SHA-256 (Vault
	// transit, see credentials.Vault.TransitSignRS256); the key never leaves the signer.
	SignRS256 func(ctx context.Context, input []byte) ([]byte, error)

	// HTTPClient talks to the API; nil means a client with verified TLS and no proxy.
	// Redirects are never followed.
	HTTPClient *http.Client
	Log        zerolog.Logger
	Now        func() time.Time // nil means time.Now (tests move it)
	// Room is asked before each mint (credentials.Room): the broker's registry of known
	// secrets, which scrubs every token until it expires, refuses one more when it is full.
	// Nil: always room.
	Room credentials.Room
}

// App is a credentials.Minter for one GitHub App installation.
type App struct {
	opts   Options
	iss    any
	base   string // API URL without a trailing slash
	client *http.Client
	now    func() time.Time
	log    zerolog.Logger
	sf     singleflight.Group

	bg     context.Context // cancelled by Close: mints in flight stop
	cancel context.CancelFunc
	wg     sync.WaitGroup // mints in flight

	mu    sync.Mutex
	cache map[string]*entry // by canonical scope
	// issued holds every token minted that may still be valid, to revoke at Close. The
	// broker's registry of known secrets bounds how many there are (Options.Room).
	issued      []known
	skew        time.Duration // GitHub's clock minus ours, when more than maxSkew
	lastRefresh time.Time
	lastErr     string // class of the last failure, "" after a success
	closed      bool
}

type entry struct {
	tok     *token // nil: none, or it was rejected
	retryAt time.Time
	delay   time.Duration
	err     error // the last failure, served at once while retryAt is ahead
}

type token struct {
	val       credentials.Secret
	expires   time.Time // in our clock
	refreshAt time.Time
}

type known struct {
	val     credentials.Secret
	expires time.Time
}

var (
	_ credentials.Minter = (*App)(nil)
	// The broker calls Inject instead of an inject rule (broker.TokenInjector).
	_ interface {
		Inject(*http.Request, credentials.Secret)
	} = (*App)(nil)
)

// New checks the options. It contacts nothing: the first token is minted on first use.
func New(opts Options) (*App, error) {
	var errs []error
	if opts.AppID == "" {
		errs = append(errs, errors.New("github app: app_id is required"))
	}
	if opts.InstallationID <= 0 {
		errs = append(errs, errors.New("github app: installation_id is required"))
	}
	if (opts.PrivateKey == nil) == (opts.SignRS256 == nil) {
		errs = append(errs, errors.New("github app: set one of a private key source and a transit signer"))
	}
	if opts.APIURL == "" {
		opts.APIURL = DefaultAPIURL
	}
	u, err := url.Parse(opts.APIURL)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" {
		errs = append(errs, fmt.Errorf("github app: api_url %q must be an https:// URL", opts.APIURL))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	a := &App{
		opts:   opts,
		iss:    issuer(opts.AppID),
		base:   strings.TrimRight(opts.APIURL, "/"),
		client: opts.HTTPClient,
		now:    opts.Now,
		log:    opts.Log.With().Str("credential", opts.Name).Logger(),
		cache:  map[string]*entry{},
	}
	if a.client == nil {
		// Options.HTTPClient is the only way out (cmd/broker: through DialService): without
		// one, nothing is dialled.
		a.client = &http.Client{Transport: svcdial.Transport(nil, nil, 0)}
	}
	c := *a.client
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if c.Timeout == 0 {
		c.Timeout = mintTimeout
	}
	a.client = &c
	if a.now == nil {
		a.now = time.Now
	}
	a.bg, a.cancel = context.WithCancel(context.Background())
	return a, nil
}

// Token returns an installation token for the decision's scope: cached while it is good for
// a while yet, minted otherwise (one mint in flight per scope). When a token is due for
// replacement, it keeps serving while the new one is minted; when the endpoint is down,
// cached tokens serve until shortly before they expire.
func (a *App) Token(ctx context.Context, s credentials.Scope) (credentials.Secret, error) {
	now := a.now()
	var buf [128]byte
	if key, ok := appendKey(buf[:0], s); ok {
		// The common case, a token cached for this scope, without building the scope.
		var tok *token
		a.mu.Lock()
		if e := a.cache[string(key)]; e != nil && !a.closed {
			tok = e.tok
		}
		a.mu.Unlock()
		if tok != nil && now.Before(tok.refreshAt) {
			return tok.val, nil
		}
	}
	sc, err := parseScope(s)
	if err != nil {
		return credentials.Secret{}, err
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return credentials.Secret{}, a.fail("closed", "the credential is closed", nil)
	}
	e := a.cache[sc.key]
	if e == nil {
		e = &entry{}
		a.cache[sc.key] = e
	}
	tok, retryAt, lastErr := e.tok, e.retryAt, e.err
	a.mu.Unlock()

	if tok != nil && now.Before(tok.refreshAt) {
		return tok.val, nil
	}
	usable := tok != nil && now.Before(tok.expires.Add(-expiryGuard))
	if now.Before(retryAt) {
		if usable {
			return tok.val, nil
		}
		return credentials.Secret{}, lastErr
	}
	ch := a.sf.DoChan(sc.key, func() (any, error) { return a.mint(sc) })
	if usable {
		return tok.val, nil // the mint goes on in the background
	}
	select {
	case r := <-ch:
		if r.Err != nil {
			return credentials.Secret{}, r.Err
		}
		return r.Val.(credentials.Secret), nil
	case <-ctx.Done():
		return credentials.Secret{}, a.fail("", "waiting for a token: "+ctx.Err().Error(), ctx.Err())
	}
}

// mint asks the token endpoint for a token with exactly sc's scope, checks it, and caches it.
func (a *App) mint(sc scope) (credentials.Secret, error) {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return credentials.Secret{}, a.fail("closed", "the credential is closed", nil)
	}
	a.wg.Add(1)
	skew := a.skew
	a.mu.Unlock()
	defer a.wg.Done()

	ctx, cancel := context.WithTimeout(a.bg, mintTimeout)
	defer cancel()
	var ans *answer
	err := a.hasRoom()
	if err == nil {
		ans, err = a.request(ctx, sc, skew)
	}
	var se *statusError
	if errors.As(err, &se) && se.status == http.StatusUnauthorized {
		// GitHub refuses a JWT from a clock that is off: if its answer showed that, once more
		// with the correction.
		a.mu.Lock()
		corrected := a.skew
		a.mu.Unlock()
		if corrected != skew {
			ans, err = a.request(ctx, sc, corrected)
		}
	}
	if err == nil {
		err = a.check(sc, ans)
		if err != nil && ans.Token != "" {
			// Never used, so it should not live on: revoke it while we know it.
			_ = a.revoke(ctx, credentials.NewSecret(ans.Token))
		}
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.cache[sc.key]
	if e == nil {
		e = &entry{}
		a.cache[sc.key] = e
	}
	if err != nil {
		e.delay = min(max(2*e.delay, retryMin), retryMax)
		e.retryAt = a.now().Add(e.delay)
		e.err = err
		a.lastErr = classOf(err)
		a.log.Warn().Err(err).Str("scope", sc.key).Msg("github app token not minted")
		return credentials.Secret{}, err
	}
	now := a.now()
	expires := ans.ExpiresAt.Add(-a.skew)
	life := expires.Sub(now)
	val := credentials.NewSecret(ans.Token)
	val = val.Until(expires)
	e.tok = &token{val: val, expires: expires, refreshAt: expires.Add(-min(refreshBefore, life/2))}
	e.delay, e.retryAt, e.err = 0, time.Time{}, nil
	a.forget(now)
	a.issued = append(a.issued, known{val: val, expires: expires})
	a.lastRefresh = now
	a.lastErr = ""
	a.log.Info().Str("scope", sc.key).Time("expires", expires).Msg("github app token minted")
	return val, nil
}

// hasRoom asks the broker whether one more token can be known until it expires.
func (a *App) hasRoom() error {
	if a.opts.Room == nil {
		return nil
	}
	if err := a.opts.Room(); err != nil {
		return a.fail("no room", "no room to remember one more token until it expires: "+err.Error(), err)
	}
	return nil
}

// Check signs an app JWT as a mint would, without asking GitHub for anything: the key can be
// read and is an RSA key, or Vault's transit engine signs with it (for check-config).
func (a *App) Check(ctx context.Context) error {
	if _, err := a.appJWT(ctx, 0); err != nil {
		return fmt.Errorf("signing the app JWT: %w", err)
	}
	return nil
}

// answer is the part of GitHub's answer the broker reads.
type answer struct {
	Token               string            `json:"token"`
	ExpiresAt           time.Time         `json:"expires_at"`
	Permissions         map[string]string `json:"permissions"`
	RepositorySelection string            `json:"repository_selection"`
	Repositories        []struct {
		Name string `json:"name"`
	} `json:"repositories"`
}

type statusError struct{ status int }

func (e *statusError) Error() string {
	return fmt.Sprintf("token endpoint answered %d %s", e.status, http.StatusText(e.status))
}

// request posts to the token endpoint. Its errors say what happened, never what was in the
// body.
func (a *App) request(ctx context.Context, sc scope, skew time.Duration) (*answer, error) {
	jwt, err := a.appJWT(ctx, skew)
	if err != nil {
		return nil, a.fail("signing the app JWT failed", "signing the app JWT: "+err.Error(), err)
	}
	body, _ := json.Marshal(sc.body())
	u := a.base + "/app/installations/" + strconv.FormatInt(a.opts.InstallationID, 10) + "/access_tokens"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return nil, a.fail("token endpoint unreachable", "token endpoint: "+err.Error(), err)
	}
	setHeaders(req, jwt)
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		return nil, a.fail("token endpoint unreachable", "token endpoint unreachable: "+transportError(err), err)
	}
	defer resp.Body.Close()
	a.observeClock(resp)
	if resp.StatusCode != http.StatusCreated {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxAnswer))
		se := &statusError{status: resp.StatusCode}
		return nil, a.fail("token endpoint answered "+strconv.Itoa(resp.StatusCode), se.Error(), se)
	}
	var ans answer
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswer)).Decode(&ans); err != nil {
		return nil, a.fail("unusable answer", "token endpoint answered 201 with an unreadable body", nil)
	}
	return &ans, nil
}

// check refuses an answer that is not a usable token for exactly what was asked.
func (a *App) check(sc scope, ans *answer) error {
	if ans.Token == "" {
		return a.fail("unusable answer", "token endpoint answered 201 without a token", nil)
	}
	for i := 0; i < len(ans.Token); i++ {
		if c := ans.Token[i]; c <= ' ' || c > '~' {
			return a.fail("unusable answer", "token endpoint answered a token that cannot be sent in a header", nil)
		}
	}
	a.mu.Lock()
	skew := a.skew
	a.mu.Unlock()
	if ans.ExpiresAt.IsZero() || !ans.ExpiresAt.Add(-skew).After(a.now().Add(expiryGuard)) {
		return a.fail("unusable answer", "token endpoint answered a token that has expired or has no expiry", nil)
	}
	repos := make([]string, len(ans.Repositories))
	for i, r := range ans.Repositories {
		repos[i] = r.Name
	}
	if err := sc.within(ans.Permissions, ans.RepositorySelection, repos); err != nil {
		return a.fail("a token for another scope", "token endpoint answered a token for another scope ("+err.Error()+"); refused", nil)
	}
	return nil
}

// observeClock compares GitHub's Date with ours; a difference of more than maxSkew is
// logged, reported in Status, and corrected for in the next app JWTs.
func (a *App) observeClock(resp *http.Response) {
	d, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		return
	}
	skew := d.Sub(a.now()).Truncate(time.Second)
	if skew > -maxSkew && skew < maxSkew {
		skew = 0
	}
	a.mu.Lock()
	old := a.skew
	a.skew = skew
	a.mu.Unlock()
	if skew != 0 && (old == 0 || (skew-old).Abs() >= maxSkew) {
		a.log.Warn().Dur("skew", skew).Msg("clock skew: GitHub's clock differs from ours; app JWTs are dated by GitHub's")
	}
}

// Reject drops tok from the cache: the next request mints a new token. The broker scrubs it
// until it expires, and Close revokes it.
func (a *App) Reject(tok credentials.Secret) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.cache {
		if e.tok != nil && e.tok.val.Reveal() == tok.Reveal() {
			e.tok = nil
			a.log.Info().Msg("github app token refused upstream; dropped")
		}
	}
}

// forget drops the tokens that have expired from issued, and the scopes whose token has
// expired and that are not backing off, so that a policy that grants many scopes over time
// does not grow the cache without bound. a.mu is held.
func (a *App) forget(now time.Time) {
	a.issued = slices.DeleteFunc(a.issued, func(k known) bool { return !now.Before(k.expires) })
	for key, e := range a.cache {
		if (e.tok == nil || !now.Before(e.tok.expires)) && !now.Before(e.retryAt) {
			delete(a.cache, key)
		}
	}
}

// Status reports the newest cached token's expiry, the last mint, and the last failure's
// class (or the clock skew).
func (a *App) Status() credentials.DerivedStatus {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	st := credentials.DerivedStatus{LastRefresh: a.lastRefresh, LastError: a.lastErr}
	for _, e := range a.cache {
		if e.tok != nil && now.Before(e.tok.expires.Add(-expiryGuard)) {
			st.Ready = true
			if e.tok.expires.After(st.ValidUntil) {
				st.ValidUntil = e.tok.expires
			}
		}
	}
	if !st.Ready {
		st.Ready = a.lastErr == "" && !a.closed
	}
	if st.LastError == "" && a.skew != 0 {
		st.LastError = fmt.Sprintf("clock skew: GitHub's clock is %s off ours", a.skew)
	}
	return st
}

// Close stops mints in flight and revokes every token that may still be valid
// (DELETE /installation/token), so none outlives the broker.
func (a *App) Close(ctx context.Context) error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	a.mu.Unlock()
	a.cancel()
	a.wg.Wait()

	a.mu.Lock()
	a.forget(a.now())
	toks := make([]credentials.Secret, len(a.issued))
	for i, k := range a.issued {
		toks[i] = k.val
	}
	a.issued = nil
	clear(a.cache)
	a.mu.Unlock()
	var errs []error
	for _, t := range toks {
		if err := a.revoke(ctx, t); err != nil {
			errs = append(errs, err)
		}
	}
	a.log.Info().Int("revoked", len(toks)-len(errs)).Int("failed", len(errs)).Msg("github app tokens revoked")
	return errors.Join(errs...)
}

// revoke invalidates one installation token. A 401 means it is invalid already.
func (a *App) revoke(ctx context.Context, tok credentials.Secret) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, a.base+"/installation/token", nil)
	if err != nil {
		return fmt.Errorf("github app %s: revoking a token: %w", a.opts.Name, err)
	}
	setHeaders(req, tok.Reveal())
	resp, err := a.client.Do(req)
	if err != nil {
		return fmt.Errorf("github app %s: revoking a token: %s", a.opts.Name, transportError(err))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxAnswer))
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusUnauthorized {
		return fmt.Errorf("github app %s: revoking a token: answered %d", a.opts.Name, resp.StatusCode)
	}
	return nil
}

func setHeaders(req *http.Request, bearer string) {
	req.Header.Set("Authorization", "Bearer "+bearer)
	req.Header.Set("Accept", "application/vnd.github+json")
	req.Header.Set("X-GitHub-Api-Version", apiVersion)
	req.Header.Set("User-Agent", "capbroker")
}

// transportError describes a failed round trip by its cause, without the URL's query (there
// is none) or anything from a body.
func transportError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// mintError is a failure to produce a token: a class for Status, a message for logs and the
// broker's error, neither carrying a value or a response body.
type mintError struct {
	class string
	msg   string
	cause error
}

func (e *mintError) Error() string        { return e.msg }
func (e *mintError) Unwrap() error        { return e.cause }
func (e *mintError) Is(target error) bool { return target == credentials.ErrUnavailable }

func (a *App) fail(class, msg string, cause error) error {
	return &mintError{class: class, msg: "github app " + a.opts.Name + ": " + msg, cause: cause}
}

func classOf(err error) string {
	var me *mintError
	if errors.As(err, &me) && me.class != "" {
		return me.class
	}
	return "error"
}
