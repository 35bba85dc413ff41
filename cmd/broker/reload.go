package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker"
	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/credentials"
	"github.com/capbroker/capbroker/internal/svcdial"
)

// reloadSettle is how long a change to the config file must be quiet before it is reloaded,
// so that an editor's write-rename-chmod burst, or a ConfigMap's symlink swap, reloads once.
const reloadSettle = 200 * time.Millisecond

// warmTimeout bounds the first read of the credentials a reload adds or changes.
const warmTimeout = 10 * time.Second

// readyStore is the credentials /readyz reports on: those of the running config.
type readyStore struct {
	p atomic.Pointer[credentialSet]
}

func (r *readyStore) Status() map[string]credentials.CredentialStatus { return r.p.Load().Status() }

// reloader reloads the whole config from its file, on SIGHUP and when the file changes. A
// config that does not validate, or whose agents or credentials cannot be built, is refused
// with its problems logged, and the running one stays. Everything runs on one goroutine
// (run), so reloads never overlap.
type reloader struct {
	path    string     // "" for broker dev: nothing to reload
	flags   serveFlags // re-applied to every reloaded config
	log     zerolog.Logger
	b       *broker.Broker
	metrics *broker.Metrics // counts reloads; /readyz shows the last refused one
	// auditFile is audit.file, reopened on SIGHUP so that logrotate can rename it; nil when
	// the audit log goes to stdout.
	auditFile *audit.File
	ready     *readyStore

	cur   *config.Config // the running config
	creds *credentialSet // its credentials; the Vault client is kept across reloads
	last  []byte         // the file as last loaded, to ignore events that changed nothing

	changed <-chan struct{} // file changes (watch)
	done    chan struct{}   // closed when run has returned
}

// watch starts watching the config file; a change made after it returns is seen by run.
func (r *reloader) watch(ctx context.Context) {
	if r.path == "" {
		return
	}
	c, err := watchFile(ctx, r.path)
	if err != nil {
		r.log.Warn().Err(err).Str("config", r.path).Msg("config file not watched; reload with SIGHUP")
	}
	r.changed = c
}

// run handles SIGHUP (hup) and file changes until ctx ends.
func (r *reloader) run(ctx context.Context, hup <-chan os.Signal) {
	defer close(r.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.reopenAudit()
			r.reload(ctx, "SIGHUP", true)
		case <-r.changed:
			r.reload(ctx, "file changed", false)
		}
	}
}

// reopenAudit reopens audit.file at its path: after a rotation renamed it, the events that
// follow go to a new file there. If that fails the events go on to the renamed file.
func (r *reloader) reopenAudit() {
	if r.auditFile == nil {
		return
	}
	if err := r.auditFile.Reopen(); err != nil {
		r.log.Error().Err(err).Msg("audit.file not reopened; audit events go on to the file already open")
		return
	}
	r.log.Info().Msg("audit.file reopened")
}

// reload loads the file and, if it is a good config, makes it the running one. force reloads
// even when the file's bytes have not changed (SIGHUP: a token file or variable may have).
func (r *reloader) reload(ctx context.Context, trigger string, force bool) {
	log := r.log.With().Str("trigger", trigger).Str("config", r.path).Logger()
	if r.path == "" {
		log.Warn().Msg("config reload: broker dev runs the embedded config; nothing to reload")
		return
	}
	raw, err := os.ReadFile(r.path)
	if err == nil && !force && bytes.Equal(raw, r.last) {
		return
	}
	var cfg *config.Config
	if err == nil {
		cfg, err = config.Parse(raw)
	}
	if err == nil {
		err = r.flags.apply(cfg)
	}
	if err != nil {
		r.refused(log, err)
		return
	}
	r.keepRestartOnly(log, cfg)
	// The broker's own clients follow the new upstream.proxy from here (the credentials read
	// now included), or the running one again if the config is refused.
	prevDialer, prevStore := own.use(cfg), own.store.Load()
	proxyChanged := !reflect.DeepEqual(r.cur.Upstream.Proxy, cfg.Upstream.Proxy)
	if proxyChanged {
		// Kept-alive connections of the own clients went the old way: their next requests dial.
		svcdial.CloseIdle()
	}
	creds, stats, err := r.buildCredentials(ctx, cfg, log)
	if err != nil {
		own.restore(prevDialer, prevStore)
		r.refused(log, err)
		return
	}
	creds.retire(r.creds)
	if err := r.b.Reload(cfg, creds); err != nil {
		if creds.vault != r.creds.vault {
			_ = creds.close(ctx) // the Vault client this config would have added
		}
		own.restore(prevDialer, prevStore)
		r.refused(log, err)
		return
	}
	if proxyChanged {
		log.Info().Msg("upstream.proxy changed: the broker's own connections follow it from now")
	}
	r.ready.p.Store(creds)
	if cfg.Vault != nil && creds.vault != nil {
		creds.vault.SetRetryMax(cfg.Vault.RefreshInterval) // login retries follow refresh_interval
	}
	r.creds.stopFresh()
	creds.keepFresh(ctx)
	// Dynamic secrets of removed and replaced credentials are no longer renewed.
	r.creds.store.Release(append(stats.removed, stats.resourced...)...)
	r.cur, r.creds, r.last = cfg, creds, raw
	if r.metrics != nil {
		r.metrics.ConfigReload(time.Now(), nil)
	}
	// Where a key may be sent is the most important thing a reload changes: each change of
	// a credential's hosts is a line of its own.
	for _, h := range stats.hosts {
		log.Warn().Str("credential", h.name).Strs("hosts_added", h.added).Strs("hosts_removed", h.removed).
			Strs("hosts", h.now).Msg("credential hosts changed: it may now be sent to these hosts")
	}
	log.Info().Int("agents", len(cfg.Agents)).Int("credentials", len(cfg.Credentials)).
		Strs("credentials_added", stats.added).Strs("credentials_changed", stats.changed).
		Strs("credentials_source_changed", stats.resourced).
		Strs("credentials_removed", stats.removed).Str("policy_mode", cfg.Policy.Mode).Msg("config reloaded")
}

// refused logs why a config was not loaded, each problem on its own in "problems", and
// counts it in the metrics (and /readyz).
func (r *reloader) refused(log zerolog.Logger, err error) {
	if r.metrics != nil {
		r.metrics.ConfigReload(time.Now(), err)
	}
	log.Error().Strs("problems", strings.Split(err.Error(), "\n")).
		Msg("config reload refused; the running config stays: " + strings.ReplaceAll(err.Error(), "\n", "; "))
}

// keepRestartOnly puts back in cfg the running values of the keys a reload cannot apply, and
// warns about each that changed: the listeners, the CA, the policy source, the audit
// destination, the fleet and the Vault connection are set up once, at start.
func (r *reloader) keepRestartOnly(log zerolog.Logger, cfg *config.Config) {
	old := r.cur
	keep := func(key string, cur, next any, restore func()) {
		if !reflect.DeepEqual(cur, next) {
			log.Warn().Str("key", key).Msg(key + " changed: it needs a restart to take effect; the running value stays")
			restore()
		}
	}
	keep("proxy.listen", old.Proxy.Listen, cfg.Proxy.Listen, func() { cfg.Proxy.Listen = old.Proxy.Listen })
	keep("transparent.listen", old.Transparent.Listen, cfg.Transparent.Listen, func() { cfg.Transparent.Listen = old.Transparent.Listen })
	keep("tls.agent_curves", old.TLS.AgentCurves, cfg.TLS.AgentCurves, func() { cfg.TLS.AgentCurves = old.TLS.AgentCurves })
	keep("admin.listen", old.Admin.Listen, cfg.Admin.Listen, func() { cfg.Admin.Listen = old.Admin.Listen })
	keep("admin", old.Admin, cfg.Admin, func() { cfg.Admin = old.Admin })
	keep("approvals", old.Approvals, cfg.Approvals, func() { cfg.Approvals = old.Approvals })
	keep("budgets", old.Budgets, cfg.Budgets, func() { cfg.Budgets = old.Budgets })
	keep("fleet", old.Fleet, cfg.Fleet, func() { cfg.Fleet = old.Fleet })
	keep("ca", old.CA, cfg.CA, func() { cfg.CA = old.CA })
	keep("policy.dir", old.Policy.Dir, cfg.Policy.Dir, func() { cfg.Policy.Dir = old.Policy.Dir })
	keep("policy.bundle", old.Policy.Bundle, cfg.Policy.Bundle, func() { cfg.Policy.Bundle = old.Policy.Bundle })
	keep("audit.file", old.Audit.File, cfg.Audit.File, func() { cfg.Audit.File = old.Audit.File })
	keep("audit.format", old.Audit.Format, cfg.Audit.Format, func() { cfg.Audit.Format = old.Audit.Format })
	keep("audit.instance", old.Audit.Instance, cfg.Audit.Instance, func() { cfg.Audit.Instance = old.Audit.Instance })
	keep("transparent", old.Transparent, cfg.Transparent, func() { cfg.Transparent = old.Transparent })
	keep("ssh", old.SSH, cfg.SSH, func() { cfg.SSH = old.SSH }) // the SSH front door reads it at start
	if old.Vault != nil && cfg.Vault != nil {
		o, n := *old.Vault, *cfg.Vault
		o.RefreshInterval, o.MaxStale = n.RefreshInterval, n.MaxStale // these do apply
		keep("vault", o, n, func() {
			v := o
			cfg.Vault = &v
		})
	}
}

// credentialStats says what a reload changes in the credentials, by name: added, removed,
// changed in any way (hosts, injection, source...), and among those the ones whose source
// changed (read again) and whose hosts changed.
type credentialStats struct {
	added, changed, resourced, removed []string
	hosts                              []hostsChange
}

// hostsChange is a credential whose hosts a reload changes.
type hostsChange struct {
	name                string
	added, removed, now []string
}

// buildCredentials builds the credential store of cfg from the running one: credentials whose
// source is unchanged keep their cached values (credentials.NewStoreFrom), the added and
// changed ones are read once now. The Vault client is the running one; a first vault section
// gets a new client.
func (r *reloader) buildCredentials(ctx context.Context, cfg *config.Config, log zerolog.Logger) (*credentialSet, credentialStats, error) {
	var st credentialStats
	set, err := buildCredentialsWith(cfg, log, r.creds.known, r.creds.vault, r.creds.store, r.unchanged(cfg))
	if err != nil {
		return nil, st, err
	}
	if set.vault != r.creds.vault {
		if err := set.vault.Start(ctx); err != nil {
			return nil, st, fmt.Errorf("vault: %w", err)
		}
	}
	st = credentialChanges(r.cur.Credentials, cfg.Credentials)
	wctx, cancel := context.WithTimeout(ctx, warmTimeout)
	defer cancel()
	for _, err := range set.store.Warm(wctx) {
		log.Warn().Err(err).Msg("credential not ready; requests granted it get 503 until it is")
	}
	return set, st, nil
}

// credentialChanges compares the credentials of two configs.
func credentialChanges(before, after []config.Credential) credentialStats {
	var st credentialStats
	old := map[string]config.Credential{}
	for _, c := range before {
		old[c.Name] = c
	}
	for _, c := range after {
		prev, ok := old[c.Name]
		delete(old, c.Name)
		if !ok {
			st.added = append(st.added, c.Name)
			continue
		}
		if reflect.DeepEqual(prev, c) {
			continue
		}
		st.changed = append(st.changed, c.Name)
		if !reflect.DeepEqual(prev.Source, c.Source) {
			st.resourced = append(st.resourced, c.Name)
		}
		if added, removed := diff(prev.Hosts, c.Hosts), diff(c.Hosts, prev.Hosts); len(added)+len(removed) > 0 {
			st.hosts = append(st.hosts, hostsChange{name: c.Name, added: added, removed: removed, now: c.Hosts})
		}
	}
	for name := range old {
		st.removed = append(st.removed, name)
	}
	sort.Strings(st.removed)
	return st
}

// diff is what b has that a has not, compared case-insensitively (as hosts are matched).
func diff(a, b []string) []string {
	in := map[string]bool{}
	for _, h := range a {
		in[strings.ToLower(h)] = true
	}
	out := []string{}
	for _, h := range b {
		if !in[strings.ToLower(h)] {
			out = append(out, h)
		}
	}
	return out
}

// unchanged reports, for cfg, which credentials have the same source as in the running config.
func (r *reloader) unchanged(cfg *config.Config) func(string) bool {
	old := map[string]config.Source{}
	for _, c := range r.cur.Credentials {
		old[c.Name] = c.Source
	}
	same := map[string]bool{}
	for _, c := range cfg.Credentials {
		if s, ok := old[c.Name]; ok && reflect.DeepEqual(s, c.Source) {
			same[c.Name] = true
		}
	}
	return func(name string) bool { return same[name] }
}

// watchFile reports changes to the file at path. It watches the file's directory, so that a
// file replaced by rename (editors, `kubectl` ConfigMap updates swapping a ..data symlink) is
// seen; events come at most once per reloadSettle.
func watchFile(ctx context.Context, path string) (<-chan struct{}, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	if err := w.Add(dir); err != nil {
		w.Close()
		return nil, err
	}
	name := filepath.Base(path)
	out := make(chan struct{}, 1)
	go func() {
		defer w.Close()
		timer := time.NewTimer(time.Hour)
		timer.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if b := filepath.Base(ev.Name); b == name || b == "..data" {
					timer.Reset(reloadSettle)
				}
			case _, ok := <-w.Errors:
				if !ok {
					return
				}
			case <-timer.C:
				select {
				case out <- struct{}{}:
				default: // a reload is already due
				}
			}
		}
	}()
	return out, nil
}
