package credentials

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"github.com/capbroker/capbroker/internal/svcdial"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/rs/zerolog"
)

// Vault auth methods.
const (
	AuthToken   = "token"
	AuthAppRole = "approle"
)

const (
	defaultVaultTimeout = 10 * time.Second
	defaultAppRoleMount = "approle"

	// Login retries back off from loginRetryMin to VaultOptions.RetryMax (defaultRetryMax).
	loginRetryMin   = 500 * time.Millisecond
	defaultRetryMax = time.Minute
	// minWatch: a token whose renewal ends sooner than this after login is treated as a
	// failure, so a token that cannot live long does not make the loop log in back to back.
	minWatch = time.Second
	// tokenCheckMin: a read refused with 403 asks the auth loop to check the token, at most
	// this often (the backoff grows up to RetryMax while checks find nothing wrong).
	tokenCheckMin = time.Second
)

// VaultAuth says how the broker logs in to Vault. Every value is read from an environment
// variable or a file named here, never from the options themselves.
type VaultAuth struct {
	// Method is "token" or "approle".
	Method string

	// token: the token is read from TokenEnv or TokenFile. It is renewed while renewable;
	// when it can no longer be renewed the source is read again (a file may have been
	// replaced by whatever issues tokens).
	TokenEnv, TokenFile string

	// approle: the role ID and secret ID, each from an env var or a file (read again at
	// every login, so an orchestrator may rotate the secret ID file). Mount defaults to
	// "approle".
	RoleIDEnv, RoleIDFile     string
	SecretIDEnv, SecretIDFile string
	Mount                     string
}

// VaultOptions configure the connection to Vault. Nothing is taken from VAULT_* environment
// variables: the address, CA, namespace and token come from here only.
type VaultOptions struct {
	Address   string // http(s)://host:port
	CAFile    string // PEM roots for Vault's TLS certificate; "" means the system roots
	Namespace string // Vault Enterprise namespace; "" for none
	Auth      VaultAuth
	// Timeout bounds each request to Vault; 0 means 10s.
	Timeout time.Duration
	// Dial makes every connection to Vault (cmd/broker: upstream.Dialer.DialService, which
	// follows upstream.proxy and its no_proxy). Nil: nothing is dialled.
	Dial svcdial.Func
	// RetryMax is the longest wait between two failed logins (vault.refresh_interval, as
	// for the reads of the credentials); 0 means 1m.
	RetryMax time.Duration
	// Log receives login, renewal and lease events. It never sees secret values or tokens.
	Log zerolog.Logger
}

// Validate reports every problem with the options, one per line.
func (o VaultOptions) Validate() error {
	var errs []error
	if o.Address == "" {
		errs = append(errs, errors.New("vault address is required"))
	} else if u, err := url.Parse(o.Address); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("vault address %q must be http(s)://host:port", o.Address))
	} else if u.User != nil {
		errs = append(errs, errors.New("vault address must not contain credentials"))
	}
	if o.Timeout < 0 {
		errs = append(errs, errors.New("vault timeout must not be negative"))
	}
	if o.RetryMax < 0 {
		errs = append(errs, errors.New("vault retry interval must not be negative"))
	}
	a := o.Auth
	switch a.Method {
	case AuthToken:
		if err := oneOf("vault auth token", a.TokenEnv, a.TokenFile); err != nil {
			errs = append(errs, err)
		}
	case AuthAppRole:
		if err := oneOf("vault auth approle role_id", a.RoleIDEnv, a.RoleIDFile); err != nil {
			errs = append(errs, err)
		}
		if err := oneOf("vault auth approle secret_id", a.SecretIDEnv, a.SecretIDFile); err != nil {
			errs = append(errs, err)
		}
	case "":
		errs = append(errs, errors.New("vault auth method is required (token or approle)"))
	default:
		errs = append(errs, fmt.Errorf("vault auth method %q is not token or approle", a.Method))
	}
	return errors.Join(errs...)
}

func oneOf(what, env, file string) error {
	switch {
	case env == "" && file == "":
		return fmt.Errorf("%s: set an environment variable or a file", what)
	case env != "" && file != "":
		return fmt.Errorf("%s: set an environment variable or a file, not both", what)
	}
	return nil
}

// Vault reads credentials from HashiCorp Vault. Create it with NewVault, log in with Start,
// stop with Close; Source gives the Store one credential's source, Check tests one for
// check-config.
//
// It keeps one token: renewed while renewable (api.LifetimeWatcher), and replaced by a new
// login when it cannot be renewed any longer or Vault says it is no longer valid (a read
// refused with 403 makes it look the token up, at most every second or so). Logins that fail
// are retried in the background with exponential backoff and jitter, so the broker starts and
// recovers without a restart when Vault is unreachable.
//
// The least privilege the broker's token needs, for KV v2 mount "secret", a dynamic secret at
// database/creds/app, and revoking leases at shutdown (the default policy already allows token
// lookup/renewal, lease renewal and capabilities-self):
//
//	path "secret/data/broker/*"  { capabilities = ["read"] }   # KV v1: "<mount>/<path>"
//	path "database/creds/app"    { capabilities = ["read"] }
//	path "sys/leases/revoke"     { capabilities = ["update"] }
type Vault struct {
	opts   VaultOptions
	log    zerolog.Logger
	client *api.Client // carries the current token: reads, renewals, revocations
	anon   *api.Client // never carries a token: logins only

	loginMu sync.Mutex // one login at a time (background loop and Check)
	kick    chan struct{}
	// retryMax is the longest wait between two failed logins, in nanoseconds
	// (VaultOptions.RetryMax; a reload may change it: SetRetryMax).
	retryMax atomic.Int64

	mu      sync.Mutex
	tok     tokenState
	lastErr error // why the last login failed, for Fetch errors
	leases  map[*lease]struct{}
	started bool
	closed  bool
	bg      context.Context // cancelled by Close; background work runs under it
	cancel  context.CancelFunc
	loop    chan struct{} // closed when the auth loop has returned
	wg      sync.WaitGroup
}

// tokenState describes the current token. The token itself lives only in v.client.
type tokenState struct {
	set      bool
	accessor string
	epoch    uint64        // bumped for every new token; leases issued under an older one are replaced
	expires  time.Time     // zero: does not expire
	margin   time.Duration // a fifth of the TTL it was issued with: leases are replaced this long before it expires
	ended    string        // token method: accessor of a token whose renewal has ended
}

// NewVault checks the options and builds the API client. It does not contact Vault.
func NewVault(opts VaultOptions) (*Vault, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Timeout == 0 {
		opts.Timeout = defaultVaultTimeout
	}
	if opts.Auth.Method == AuthAppRole && opts.Auth.Mount == "" {
		opts.Auth.Mount = defaultAppRoleMount
	}
	opts.Auth.Mount = strings.Trim(opts.Auth.Mount, "/")
	client, err := newVaultClient(opts)
	if err != nil {
		return nil, err
	}
	anon, err := newVaultClient(opts)
	if err != nil {
		return nil, err
	}
	bg, cancel := context.WithCancel(context.Background())
	v := &Vault{
		opts:   opts,
		log:    opts.Log.With().Str("component", "vault").Logger(),
		client: client,
		anon:   anon,
		kick:   make(chan struct{}, 1),
		leases: map[*lease]struct{}{},
		bg:     bg,
		cancel: cancel,
	}
	v.SetRetryMax(opts.RetryMax)
	return v, nil
}

// SetRetryMax sets the longest wait between two failed logins (vault.refresh_interval; 0
// means 1m). A reload that changes refresh_interval calls it: the Vault client is kept.
func (v *Vault) SetRetryMax(d time.Duration) {
	if d <= 0 {
		d = defaultRetryMax
	}
	v.retryMax.Store(int64(d))
}

// loginBackoff is the schedule of login retries: from loginRetryMin (or RetryMax when it is
// shorter) doubling up to RetryMax.
func (v *Vault) loginBackoff(b *backoff) {
	b.max = time.Duration(v.retryMax.Load())
	b.min = min(loginRetryMin, b.max)
}

// newVaultClient builds an api.Client from opts only. api.NewClient applies VAULT_TOKEN,
// VAULT_NAMESPACE and VAULT_HEADERS from the environment, and every request would honour
// VAULT_WRAP_TTL; each of those is undone here. The transport is our own, so VAULT_ADDR,
// VAULT_CACERT, VAULT_SKIP_VERIFY, VAULT_PROXY_ADDR, HTTP(S)_PROXY and friends have no effect.
// (api.NewClient still parses those variables and fails on malformed ones; the error says so.)
func newVaultClient(opts VaultOptions) (*api.Client, error) {
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12}
	if opts.CAFile != "" {
		pem, err := os.ReadFile(opts.CAFile)
		if err != nil {
			return nil, fmt.Errorf("vault ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("vault ca_file %s: no PEM certificates", opts.CAFile)
		}
		tlsConf.RootCAs = pool
	}
	transport := svcdial.Transport(opts.Dial, tlsConf, opts.Timeout)
	c, err := api.NewClient(&api.Config{
		Address: opts.Address,
		HttpClient: &http.Client{
			Transport: transport,
			// api.Client follows Vault's redirects itself (HA standbys).
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		Timeout:    opts.Timeout,
		MaxRetries: 0, // the Store and the auth loop retry, with backoff
	})
	if err != nil {
		return nil, fmt.Errorf("vault client (the Vault library also parses VAULT_* environment variables, which are otherwise ignored): %w", err)
	}
	c.ClearToken()
	c.SetHeaders(http.Header{api.RequestHeaderName: []string{"true"}})
	if opts.Namespace != "" {
		c.SetNamespace(opts.Namespace)
	}
	c.SetWrappingLookupFunc(func(string, string) string { return "" })
	return c, nil
}

// Start logs in and keeps the token alive in the background until Close. It returns an error
// only for configuration problems, such as an unset token variable or a missing file; when
// Vault is unreachable or refuses the login, it logs that and keeps trying in the background.
func (v *Vault) Start(ctx context.Context) error {
	v.mu.Lock()
	switch {
	case v.closed:
		v.mu.Unlock()
		return errors.New("vault: closed")
	case v.started:
		v.mu.Unlock()
		return errors.New("vault: already started")
	}
	v.started = true
	v.loop = make(chan struct{})
	v.mu.Unlock()

	if err := v.checkInputs(); err != nil {
		close(v.loop)
		return err
	}
	first, err := v.login(ctx)
	var cfgErr *configError
	switch {
	case errors.As(err, &cfgErr):
		close(v.loop)
		return err
	case err != nil:
		v.mu.Lock()
		v.lastErr = err
		v.mu.Unlock()
		v.log.Warn().Err(err).Msg("vault login failed; retrying in the background")
	}
	go v.run(first)
	return nil
}

// configError is a problem with the broker's own configuration (not Vault's answer).
type configError struct{ err error }

func (e *configError) Error() string { return e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

// checkInputs reads the configured auth inputs once, so a missing variable or file stops the
// broker at start.
func (v *Vault) checkInputs() error {
	a := v.opts.Auth
	if a.Method == AuthToken {
		_, err := readInput("vault token", a.TokenEnv, a.TokenFile)
		return err
	}
	if _, err := readInput("vault approle role_id", a.RoleIDEnv, a.RoleIDFile); err != nil {
		return err
	}
	_, err := readInput("vault approle secret_id", a.SecretIDEnv, a.SecretIDFile)
	return err
}

// readInput reads a credential from an env var or a file. Errors name the source, never the
// content.
func readInput(what, env, file string) (string, error) {
	if env != "" {
		v := strings.TrimSpace(os.Getenv(env))
		if v == "" {
			return "", &configError{fmt.Errorf("%s: environment variable %s is not set", what, env)}
		}
		return v, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", &configError{fmt.Errorf("%s: reading %s: %v", what, file, errors.Unwrap(err))}
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", &configError{fmt.Errorf("%s: %s is empty", what, file)}
	}
	return v, nil
}

// login obtains a token by the configured method and makes it current. It returns the secret
// to hand to the lifetime watcher.
func (v *Vault) login(ctx context.Context) (*api.Secret, error) {
	v.loginMu.Lock()
	defer v.loginMu.Unlock()
	if v.opts.Auth.Method == AuthToken {
		return v.loginToken(ctx)
	}
	return v.loginAppRole(ctx)
}

func (v *Vault) loginToken(ctx context.Context) (*api.Secret, error) {
	a := v.opts.Auth
	token, err := readInput("vault token", a.TokenEnv, a.TokenFile)
	if err != nil {
		return nil, err
	}
	// Use it right away: reads work as soon as Vault answers, even before the lookup does.
	v.client.SetToken(token)
	v.mu.Lock()
	v.tok.set = true
	v.mu.Unlock()

	self, err := v.client.Auth().Token().LookupSelfWithContext(ctx)
	if err != nil {
		return nil, vaultFailure("looking up the vault token", err)
	}
	accessor, _ := self.TokenAccessor()
	ttl, _ := self.TokenTTL()
	renewable, _ := self.TokenIsRenewable()

	v.mu.Lock()
	ended := accessor != "" && accessor == v.tok.ended
	v.mu.Unlock()
	if ended {
		return nil, fmt.Errorf("the vault token can no longer be renewed and expires in %s; provide a new one", ttl)
	}
	v.setToken(accessor, ttl)
	v.log.Info().Dur("ttl", ttl).Bool("renewable", renewable).Msg("vault token in use")
	return &api.Secret{Auth: &api.SecretAuth{
		ClientToken:   token,
		Accessor:      accessor,
		Renewable:     renewable,
		LeaseDuration: int(ttl / time.Second),
	}}, nil
}

func (v *Vault) loginAppRole(ctx context.Context) (*api.Secret, error) {
	a := v.opts.Auth
	roleID, err := readInput("vault approle role_id", a.RoleIDEnv, a.RoleIDFile)
	if err != nil {
		return nil, err
	}
	secretID, err := readInput("vault approle secret_id", a.SecretIDEnv, a.SecretIDFile)
	if err != nil {
		return nil, err
	}
	s, err := v.anon.Logical().WriteWithContext(ctx, "auth/"+a.Mount+"/login", map[string]any{
		"role_id":   roleID,
		"secret_id": secretID,
	})
	if err != nil {
		return nil, vaultFailure("approle login at auth/"+a.Mount, err)
	}
	if s == nil || s.Auth == nil || s.Auth.ClientToken == "" {
		return nil, errors.New("approle login at auth/" + a.Mount + ": vault returned no token")
	}
	v.client.SetToken(s.Auth.ClientToken)
	ttl := time.Duration(s.Auth.LeaseDuration) * time.Second
	v.setToken(s.Auth.Accessor, ttl)
	v.log.Info().Dur("ttl", ttl).Bool("renewable", s.Auth.Renewable).Msg("vault approle login")
	return s, nil
}

// setToken records a new current token.
func (v *Vault) setToken(accessor string, ttl time.Duration) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if accessor != v.tok.accessor || v.tok.epoch == 0 {
		v.tok.epoch++
	}
	v.tok.set, v.tok.accessor = true, accessor
	v.tok.expires, v.tok.margin = time.Time{}, ttl/5
	if ttl > 0 {
		v.tok.expires = time.Now().Add(ttl)
	}
	v.lastErr = nil
}

// run is the auth loop: log in (retrying with backoff), keep the token alive while it can be,
// log in again.
func (v *Vault) run(auth *api.Secret) {
	defer close(v.loop)
	ctx := v.bg
	var retry backoff
	for ctx.Err() == nil {
		v.loginBackoff(&retry)
		if auth == nil {
			a, err := v.login(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				v.mu.Lock()
				v.lastErr = err
				v.mu.Unlock()
				d := retry.next()
				v.log.Warn().Err(err).Str("retry_in", d.Round(time.Millisecond).String()).Msg("vault login failed")
				sleep(ctx, d)
				continue
			}
			auth = a
		}
		began := time.Now()
		v.watch(ctx, auth)
		auth = nil
		if time.Since(began) < minWatch {
			sleep(ctx, retry.next())
		} else {
			retry.reset()
		}
	}
}

// watch keeps the token alive and returns when a new login is needed (or ctx is done).
func (v *Vault) watch(ctx context.Context, auth *api.Secret) {
	checks := backoff{min: tokenCheckMin, max: max(tokenCheckMin, time.Duration(v.retryMax.Load()))}
	var nextCheck time.Time
	// checkToken handles a kick: reads were refused, perhaps because the token is gone
	// (revoked, or Vault lost its storage). It reports whether to log in again.
	checkToken := func() bool {
		if time.Now().Before(nextCheck) {
			return false
		}
		cctx, cancel := context.WithTimeout(ctx, v.opts.Timeout)
		defer cancel()
		_, err := v.client.Auth().Token().LookupSelfWithContext(cctx)
		var re *api.ResponseError
		if errors.As(err, &re) && re.StatusCode == http.StatusForbidden {
			v.log.Warn().Msg("vault no longer accepts the token; logging in again")
			return true
		}
		nextCheck = time.Now().Add(checks.next())
		return false
	}

	if auth.Auth.LeaseDuration <= 0 {
		// A token that does not expire (a root or non-expiring token): nothing to renew.
		for {
			select {
			case <-ctx.Done():
				return
			case <-v.kick:
				if checkToken() {
					return
				}
			}
		}
	}

	w, err := v.client.NewLifetimeWatcher(&api.LifetimeWatcherInput{
		Secret:        auth,
		RenewBehavior: api.RenewBehaviorIgnoreErrors,
	})
	if err != nil { // only for a missing secret, which cannot happen here
		v.log.Error().Err(err).Msg("vault token watcher")
		return
	}
	go w.Start()
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-w.RenewCh():
			if r.Secret != nil && r.Secret.Auth != nil {
				ttl := time.Duration(r.Secret.Auth.LeaseDuration) * time.Second
				v.mu.Lock()
				v.tok.expires = r.RenewedAt.Add(ttl)
				v.mu.Unlock()
				v.log.Debug().Dur("ttl", ttl).Msg("vault token renewed")
			}
		case err := <-w.DoneCh():
			v.mu.Lock()
			v.tok.ended = auth.Auth.Accessor
			v.mu.Unlock()
			if err != nil {
				v.log.Warn().Err(vaultFailure("renewing", err)).Msg("renewing the vault token failed; logging in again")
			} else {
				v.log.Info().Msg("vault token cannot be renewed any longer; logging in again")
			}
			return
		case <-v.kick:
			if checkToken() {
				return
			}
		}
	}
}

// tokenCheck asks the auth loop to check the token (a read was refused with 403).
func (v *Vault) tokenCheck() {
	select {
	case v.kick <- struct{}{}:
	default:
	}
}

// token returns the current token state, or an error if there is no token to use.
func (v *Vault) token() (tokenState, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	switch {
	case v.closed:
		return tokenState{}, &vaultError{msg: "vault client is closed"}
	case !v.tok.set && v.lastErr != nil:
		return tokenState{}, &vaultError{msg: "not logged in to vault: " + v.lastErr.Error(), cause: v.lastErr}
	case !v.tok.set:
		return tokenState{}, &vaultError{msg: "not logged in to vault yet"}
	}
	return v.tok, nil
}

// ensureToken logs in once if there is no token yet, for Check without Start.
func (v *Vault) ensureToken(ctx context.Context) error {
	if _, err := v.token(); err == nil {
		return nil
	}
	if _, err := v.login(ctx); err != nil {
		return &vaultError{msg: "vault login failed: " + err.Error(), cause: err}
	}
	return nil
}

// Close stops the background work, revokes the leases of dynamic secrets that have not
// expired and, for approle, the broker's own token. Cached values in a Store keep serving
// until they are stale; Fetch fails from now on.
func (v *Vault) Close(ctx context.Context) error {
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return nil
	}
	v.closed = true
	loop := v.loop
	leases := make([]*lease, 0, len(v.leases))
	for l := range v.leases {
		leases = append(leases, l)
	}
	v.leases = map[*lease]struct{}{}
	hasToken := v.tok.set
	v.mu.Unlock()

	v.cancel()
	if loop != nil {
		select {
		case <-loop:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	v.wg.Wait() // lease watchers

	var errs []error
	now := time.Now()
	for _, l := range leases {
		if l.expired(now) {
			continue
		}
		if err := v.client.Sys().RevokeWithContext(ctx, l.id); err != nil {
			errs = append(errs, vaultFailure("revoking the lease of "+l.path, err))
			continue
		}
		v.log.Info().Str("path", l.path).Msg("vault lease revoked")
	}
	if v.opts.Auth.Method == AuthAppRole && hasToken {
		// Also revokes any lease this token created. Never done for an operator's token.
		if err := v.client.Auth().Token().RevokeSelfWithContext(ctx, ""); err != nil {
			errs = append(errs, vaultFailure("revoking the broker's vault token", err))
		}
	}
	v.client.ClearToken()
	return errors.Join(errs...)
}

// vaultError is a Vault failure as Fetch and Check report it: a message naming the path and
// the problem (never a value), matching ErrUnavailable under errors.Is.
type vaultError struct {
	msg   string
	cause error
}

func (e *vaultError) Error() string        { return e.msg }
func (e *vaultError) Unwrap() error        { return e.cause }
func (e *vaultError) Is(target error) bool { return target == ErrUnavailable }

// vaultFailure describes an error from the API client. Vault's own error messages are kept;
// unparsable bodies are not (they may come from something other than Vault).
func vaultFailure(doing string, err error) error {
	var re *api.ResponseError
	if errors.As(err, &re) {
		msg := fmt.Sprintf("%s: vault answered %d", doing, re.StatusCode)
		if !re.RawError && len(re.Errors) > 0 {
			msg += ": " + strings.Join(re.Errors, "; ")
		}
		return &vaultError{msg: msg, cause: err}
	}
	return &vaultError{msg: fmt.Sprintf("%s: %v", doing, err), cause: err}
}
