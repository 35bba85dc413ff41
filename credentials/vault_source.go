package credentials

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/rs/zerolog"
)

// VaultRef names one credential value in Vault.
type VaultRef struct {
	// Mount is the secrets engine mount, e.g. "secret". Required for KV; for a lease it is
	// optional and, when set, prefixed to Path.
	Mount string
	// Path is the secret's path inside the mount (KV), or the path that issues the dynamic
	// secret (lease), e.g. "database/creds/readonly".
	Path string
	// Field is the key inside the secret's data whose value is the credential.
	Field string
	// Fields makes the credential the secret's whole data, every string member of it, as a
	// secret with fields (an AWS key: access key id, secret key, session token); Field is
	// then empty.
	Fields bool
	// KVVersion is 1 or 2; 0 means 2. KV v2 reads <mount>/data/<path>, KV v1 <mount>/<path>.
	KVVersion int
	// Lease marks a dynamic secret: a read of the path issues it with a lease, which is
	// renewed while renewable and replaced before it ends.
	Lease bool
}

// Validate reports every problem with the reference.
func (r VaultRef) Validate() error {
	var errs []error
	if strings.Trim(r.Path, "/") == "" {
		errs = append(errs, errors.New("vault path is required"))
	}
	switch {
	case r.Field == "" && !r.Fields:
		errs = append(errs, errors.New("vault field is required"))
	case r.Field != "" && r.Fields:
		errs = append(errs, errors.New("vault field: the whole secret is read, name no field"))
	}
	if !r.Lease && strings.Trim(r.Mount, "/") == "" {
		errs = append(errs, errors.New("vault mount is required for a KV secret"))
	}
	switch {
	case r.Lease && r.KVVersion != 0:
		errs = append(errs, errors.New("vault kv_version does not apply to a lease"))
	case r.KVVersion != 0 && r.KVVersion != 1 && r.KVVersion != 2:
		errs = append(errs, fmt.Errorf("vault kv_version %d: must be 1 or 2", r.KVVersion))
	}
	for _, seg := range strings.Split(r.Mount+"/"+r.Path, "/") {
		if seg == ".." || seg == "." {
			errs = append(errs, fmt.Errorf("vault path %s/%s: %q segments are not allowed", r.Mount, r.Path, seg))
			break
		}
	}
	return errors.Join(errs...)
}

// name is the secret as an operator writes it: "secret/github" (what `vault kv get` takes),
// or the path of a dynamic secret.
func (r VaultRef) name() string {
	m, p := strings.Trim(r.Mount, "/"), strings.Trim(r.Path, "/")
	if m == "" {
		return p
	}
	return m + "/" + p
}

// apiPath is the path of the logical read.
func (r VaultRef) apiPath() string {
	if !r.Lease && r.KVVersion != 1 {
		return strings.Trim(r.Mount, "/") + "/data/" + strings.Trim(r.Path, "/")
	}
	return r.name()
}

// Source returns the Store's source for one credential. Errors from its Fetch match
// ErrUnavailable and name the Vault path and the problem, never a value; the Store adds the
// credential's name.
func (v *Vault) Source(name string, ref VaultRef) Source {
	if err := ref.Validate(); err != nil {
		return badRef{err: &vaultError{msg: err.Error(), cause: err}}
	}
	if ref.Lease {
		return &leaseSource{v: v, name: name, ref: ref}
	}
	return &kvSource{v: v, ref: ref}
}

// Check reads the credential once, for `broker check-config`: it logs in if needed and reports
// a missing secret, a missing field or a denied permission, naming the credential and never
// the value. For a lease it asks Vault whether the token may read the path
// (sys/capabilities-self) rather than issuing a dynamic secret.
func (v *Vault) Check(ctx context.Context, name string, ref VaultRef) error {
	err := ref.Validate()
	if err == nil {
		err = v.ensureToken(ctx)
	}
	if err == nil {
		if ref.Lease {
			err = v.checkCapability(ctx, ref)
		} else {
			_, err = v.readKV(ctx, ref)
		}
	}
	if err != nil {
		return fmt.Errorf("credential %q: %w", name, err)
	}
	return nil
}

func (v *Vault) checkCapability(ctx context.Context, ref VaultRef) error {
	caps, err := v.client.Sys().CapabilitiesSelfWithContext(ctx, ref.apiPath())
	if err != nil {
		return vaultFailure("checking access to "+ref.apiPath(), err)
	}
	if !slices.Contains(caps, "read") && !slices.Contains(caps, "root") {
		return &vaultError{msg: fmt.Sprintf("permission denied: the broker's vault token cannot read %s (its capabilities there: %s)",
			ref.apiPath(), strings.Join(caps, ", "))}
	}
	return nil
}

type badRef struct{ err error }

func (b badRef) Fetch(context.Context) (Secret, error) { return Secret{}, b.err }

// kvSource reads a KV secret each time the Store asks (every refresh interval).
type kvSource struct {
	v   *Vault
	ref VaultRef
}

// Fetch implements Source.
func (s *kvSource) Fetch(ctx context.Context) (Secret, error) {
	return s.v.readKV(ctx, s.ref)
}

func (v *Vault) readKV(ctx context.Context, ref VaultRef) (Secret, error) {
	if _, err := v.token(); err != nil {
		return Secret{}, err
	}
	sec, err := v.read(ctx, ref)
	if err != nil {
		return Secret{}, err
	}
	var data map[string]any
	if sec != nil {
		data = sec.Data
		if ref.KVVersion != 1 {
			data, _ = sec.Data["data"].(map[string]any) // nil when deleted or destroyed
		}
	}
	if data == nil {
		msg := fmt.Sprintf("vault secret %s not found", ref.name())
		switch {
		case ref.KVVersion != 1:
			msg += fmt.Sprintf(" (KV v2: read %s; deleted versions count as missing; for a KV v1 mount set kv_version: 1)", ref.apiPath())
		case sec != nil && slices.ContainsFunc(sec.Warnings, func(w string) bool { return strings.Contains(w, "versioned") }):
			msg += fmt.Sprintf(" (%s is a KV v2 mount: remove kv_version: 1)", strings.Trim(ref.Mount, "/"))
		}
		return Secret{}, &vaultError{msg: msg}
	}
	return extract(data, ref)
}

// read does the logical read and turns failures into vaultErrors.
func (v *Vault) read(ctx context.Context, ref VaultRef) (*api.Secret, error) {
	sec, err := v.client.Logical().ReadWithContext(ctx, ref.apiPath())
	if err == nil {
		return sec, nil
	}
	what := "vault secret " + ref.name()
	if ref.Lease {
		what = "vault dynamic secret " + ref.name()
	}
	var re *api.ResponseError
	if errors.As(err, &re) && re.StatusCode == http.StatusForbidden {
		v.tokenCheck()
		return nil, &vaultError{msg: fmt.Sprintf("permission denied reading %s: the broker's vault token needs read on %s",
			what, ref.apiPath()), cause: err}
	}
	return nil, vaultFailure("reading "+what, err)
}

// extract returns the credential in a secret's data: its field, or with Fields every string
// member.
func extract(data map[string]any, ref VaultRef) (Secret, error) {
	if !ref.Fields {
		v, err := field(data, ref)
		return NewSecret(v), err
	}
	f := make(map[string]string, len(data))
	for k, raw := range data {
		if v, ok := raw.(string); ok {
			f[k] = v
		}
	}
	s := NewFields(f)
	if s.IsZero() {
		return Secret{}, &vaultError{msg: fmt.Sprintf("vault secret %s has no string field", ref.name())}
	}
	return s, nil
}

// field extracts the credential from a secret's data.
func field(data map[string]any, ref VaultRef) (string, error) {
	raw, ok := data[ref.Field]
	if !ok {
		return "", &vaultError{msg: fmt.Sprintf("vault secret %s has no field %q", ref.name(), ref.Field)}
	}
	var val string
	switch x := raw.(type) {
	case string:
		val = x
	case json.Number:
		val = x.String()
	default:
		return "", &vaultError{msg: fmt.Sprintf("vault secret %s field %q is not a string", ref.name(), ref.Field)}
	}
	if val == "" {
		return "", &vaultError{msg: fmt.Sprintf("vault secret %s field %q is empty", ref.name(), ref.Field)}
	}
	return val, nil
}

// leaseSource serves a dynamic secret. Fetch returns the current lease's value while the lease
// is good, and issues a new one only when it is not: renewal has ended (maximum TTL reached,
// not renewable, or failing), less than a fifth of its TTL is left, or the token that issued
// it has been replaced (Vault revokes a token's leases when the token ends). So the Store's
// periodic refresh does not issue a new lease every interval.
type leaseSource struct {
	v    *Vault
	name string
	ref  VaultRef

	mu  sync.Mutex // serialises issuing
	cur *lease
}

// lease is one issued dynamic secret.
type lease struct {
	id    string
	path  string
	val   Secret
	epoch uint64 // of the token that issued it

	margin time.Duration // a fifth of the TTL it was issued with

	mu      sync.Mutex
	expires time.Time     // zero when Vault gave no lease duration
	ended   bool          // renewal is over; replace it
	stop    chan struct{} // closed to stop its renewal
}

// replaceAt is when the lease should no longer be handed out: a fifth of its original TTL
// before it expires. Zero if it does not expire.
func (l *lease) replaceAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.expires.IsZero() {
		return time.Time{}
	}
	return l.expires.Add(-l.margin)
}

func (l *lease) expired(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.expires.IsZero() && !now.Before(l.expires)
}

func (l *lease) good(now time.Time, epoch uint64) bool {
	l.mu.Lock()
	ended := l.ended
	l.mu.Unlock()
	r := l.replaceAt()
	return !ended && l.epoch == epoch && (r.IsZero() || now.Before(r))
}

// Fetch implements Source.
func (s *leaseSource) Fetch(ctx context.Context) (Secret, error) {
	tok, err := s.v.token()
	if err != nil {
		return Secret{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.cur == nil || !s.cur.good(now, tok.epoch) {
		l, err := s.issue(ctx, tok.epoch)
		if err != nil {
			return Secret{}, err
		}
		if s.cur != nil {
			s.cur.stopRenewing()
		}
		s.cur = l
	}
	return s.secret(s.cur, tok), nil
}

// secret wraps the lease's value with the times the Store must respect: ask again by the
// lease's (or the issuing token's) replacement time, never serve it after either expires.
func (s *leaseSource) secret(l *lease, tok tokenState) Secret {
	refreshBy := l.replaceAt()
	l.mu.Lock()
	expires := l.expires
	l.mu.Unlock()
	if !tok.expires.IsZero() {
		tokRefresh := tok.expires.Add(-tok.margin)
		if refreshBy.IsZero() || tokRefresh.Before(refreshBy) {
			refreshBy = tokRefresh
		}
		if expires.IsZero() || tok.expires.Before(expires) {
			expires = tok.expires
		}
	}
	return l.val.expiring(refreshBy, expires)
}

// issue reads the path, which makes Vault issue a new secret and lease, and starts renewing it.
func (s *leaseSource) issue(ctx context.Context, epoch uint64) (*lease, error) {
	sec, err := s.v.read(ctx, s.ref)
	if err != nil {
		return nil, err
	}
	if sec == nil || sec.Data == nil {
		return nil, &vaultError{msg: fmt.Sprintf("vault dynamic secret %s: nothing at this path", s.ref.name())}
	}
	val, err := extract(sec.Data, s.ref)
	if err != nil {
		return nil, err
	}
	l := &lease{id: sec.LeaseID, path: s.ref.name(), val: val, epoch: epoch, stop: make(chan struct{})}
	ttl := time.Duration(sec.LeaseDuration) * time.Second
	if ttl > 0 {
		l.expires, l.margin = time.Now().Add(ttl), ttl/5
	}
	log := s.v.log.With().Str("credential", s.name).Str("path", l.path).Logger()
	if l.id == "" {
		log.Warn().Msg("vault returned no lease for a credential configured with lease: true")
		return l, nil
	}
	if err := s.v.track(l, sec.Renewable); err != nil {
		s.revokeNow(l)
		return nil, err
	}
	log.Info().Dur("ttl", ttl).Bool("renewable", sec.Renewable).Msg("vault dynamic secret issued")
	if sec.Renewable {
		s.v.renew(l, sec, log)
	}
	return l, nil
}

// revokeNow revokes a lease that was issued while the Vault was closing.
func (s *leaseSource) revokeNow(l *lease) {
	ctx, cancel := context.WithTimeout(context.Background(), s.v.opts.Timeout)
	defer cancel()
	_ = s.v.client.Sys().RevokeWithContext(ctx, l.id)
}

func (l *lease) stopRenewing() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
}

// track registers a lease for revocation at Close, and forgets leases that have expired. For a
// renewable lease it also accounts for the renewal goroutine (under v.mu, so never after Close
// has started waiting); renew must then be called.
func (v *Vault) track(l *lease, renewable bool) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return &vaultError{msg: "vault client is closed"}
	}
	if renewable {
		v.wg.Add(1)
	}
	now := time.Now()
	for old := range v.leases {
		if old.expired(now) {
			delete(v.leases, old)
		}
	}
	v.leases[l] = struct{}{}
	return nil
}

// renew keeps a renewable lease alive with a lifetime watcher until it cannot be renewed any
// longer, the lease is replaced, or the Vault is closed. track has done v.wg.Add for it.
func (v *Vault) renew(l *lease, sec *api.Secret, log zerolog.Logger) {
	w, err := v.client.NewLifetimeWatcher(&api.LifetimeWatcherInput{
		Secret:        sec,
		RenewBehavior: api.RenewBehaviorIgnoreErrors,
	})
	if err != nil { // only for a missing secret, which cannot happen here
		v.wg.Done()
		log.Error().Err(err).Msg("vault lease watcher")
		return
	}
	go func() {
		defer v.wg.Done()
		go w.Start()
		defer w.Stop()
		for {
			select {
			case <-v.bg.Done():
				return
			case <-l.stop:
				return
			case r := <-w.RenewCh():
				if r.Secret == nil {
					continue
				}
				ttl := time.Duration(r.Secret.LeaseDuration) * time.Second
				l.mu.Lock()
				l.expires = r.RenewedAt.Add(ttl)
				l.mu.Unlock()
				log.Debug().Dur("ttl", ttl).Msg("vault lease renewed")
			case err := <-w.DoneCh():
				l.mu.Lock()
				l.ended = true
				l.mu.Unlock()
				if err != nil {
					log.Warn().Err(vaultFailure("renewing", err)).Msg("renewing the vault lease failed; a new secret will be issued")
				} else {
					log.Info().Msg("vault lease cannot be renewed any longer; a new secret will be issued")
				}
				return
			}
		}
	}()
}

var (
	_ Source = (*kvSource)(nil)
	_ Source = (*leaseSource)(nil)
	_ Source = badRef{}
)

// Release stops renewing the current lease: the credential is no longer configured (a config
// reload removed or replaced it; Store.Release). The lease is left to expire at the end of its
// TTL, so a request in flight that was given its value keeps working; Close still revokes it
// if it has not expired.
func (s *leaseSource) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != nil {
		s.cur.stopRenewing()
	}
}
