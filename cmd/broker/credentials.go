package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/inject"
	"github.com/capbroker/capbroker/credentials"
	"github.com/capbroker/capbroker/credentials/aws"
)

// credentialSet is the credential store and, when the config has a vault section, the Vault
// client its vault sources read through.
type credentialSet struct {
	store  *credentials.Store
	vault  *credentials.Vault
	checks map[string]func(context.Context) error // one read of each credential, for check-config
	paths  map[string]string                      // the key path of each credential's source
	// stopFresh ends keepFresh's background refreshing (a reload replaced this set).
	stopFresh context.CancelFunc
	// The derived credentials' minters and signers, by name (derived.go).
	minters map[string]credentials.Minter
	signers map[string]credentials.Signer
	// retired holds, by name, the minters of the sets a reload replaced, to revoke what they
	// minted when the broker stops. (Their tokens are scrubbed until they expire by the
	// registry of known secrets, which recorded them as they were sent.)
	retired map[string][]credentials.Minter
	// known is the broker's registry of known secrets, which the minters ask for room before
	// minting; nil (check-config) is always room.
	known *inject.Known
}

// buildCredentials builds the sources named in the config. Nothing is fetched yet. known is
// the broker's registry of known secrets (nil when nothing will be sent).
func buildCredentials(cfg *config.Config, log zerolog.Logger, known *inject.Known) (*credentialSet, error) {
	return buildCredentialsWith(cfg, log, known, nil, nil, nil)
}

// buildCredentialsWith is buildCredentials for a reload: vault, when not nil, is the running
// Vault client, used rather than a new one (and kept, for Close, even if cfg has no vault
// section); the store takes over from old the credentials unchanged reports true for
// (credentials.NewStoreFrom).
func buildCredentialsWith(cfg *config.Config, log zerolog.Logger, known *inject.Known, vault *credentials.Vault, old *credentials.Store, unchanged func(string) bool) (*credentialSet, error) {
	set := &credentialSet{checks: map[string]func(context.Context) error{}, paths: map[string]string{}, vault: vault, known: known}
	opts := credentials.StoreOptions{Log: log}
	if v := cfg.Vault; v != nil {
		opts.Refresh, opts.MaxStale = v.RefreshInterval, v.MaxStale
	}
	if v := cfg.Vault; v != nil && set.vault == nil {
		vault, err := credentials.NewVault(credentials.VaultOptions{
			Address: v.Address, CAFile: v.CAFile, Namespace: v.Namespace, Log: log, RetryMax: v.RefreshInterval,
			Dial: ownDial(cfg),
			Auth: credentials.VaultAuth{
				Method: v.Auth.Method, TokenEnv: v.Auth.TokenEnv, TokenFile: v.Auth.TokenFile,
				RoleIDEnv: v.Auth.RoleIDEnv, RoleIDFile: v.Auth.RoleIDFile,
				SecretIDEnv: v.Auth.SecretIDEnv, SecretIDFile: v.Auth.SecretIDFile, Mount: v.Auth.Mount,
			},
		})
		if err != nil {
			return nil, fmt.Errorf("vault: %w", err)
		}
		set.vault = vault
	}
	sources := map[string]credentials.Source{}
	for i, c := range cfg.Credentials {
		if c.Source.IsZero() {
			continue // a derived credential whose root secret never leaves Vault
		}
		set.paths[c.Name] = fmt.Sprintf("credentials[%d].source", i)
		var src credentials.Source
		fields := c.AWSSigV4 != nil // the root secret is read whole, as fields
		switch s := c.Source; {
		case s.Env != "":
			src = credentials.Env{Name: s.Env, Fields: fields}
		case s.File != "":
			src = credentials.File{Path: s.File, Fields: fields}
		case s.EnvFields != nil:
			src = credentials.EnvFields(s.EnvFields)
		default:
			ref := credentials.VaultRef{Mount: s.Vault.Mount, Path: s.Vault.Path, Field: s.Vault.Field, KVVersion: s.Vault.KVVersion, Lease: s.Vault.Lease, Fields: fields}
			src = set.vault.Source(c.Name, ref)
			name := c.Name
			set.checks[name] = func(ctx context.Context) error { return set.vault.Check(ctx, name, ref) }
		}
		if fields {
			src = aws.KeySource{Source: src}
		}
		sources[c.Name] = src
		if _, ok := set.checks[c.Name]; !ok {
			set.checks[c.Name] = func(ctx context.Context) error { _, err := src.Fetch(ctx); return err }
		}
	}
	// The upstream proxies' passwords are kept in the store too, under names no credential
	// can take: refreshed, reported in /readyz and scrubbed like any secret.
	if p := cfg.Upstream.Proxy; p != nil {
		for i, s := range p.Proxies {
			if s.Password == nil {
				continue
			}
			name := config.ProxyCredentialName(s.Name)
			set.paths[name] = fmt.Sprintf("upstream.proxy.proxies[%d].password", i)
			var src credentials.Source
			switch pw := s.Password; {
			case pw.Env != "":
				src = credentials.Env{Name: pw.Env}
			case pw.File != "":
				src = credentials.File{Path: pw.File}
			default:
				ref := credentials.VaultRef{Mount: pw.Vault.Mount, Path: pw.Vault.Path, Field: pw.Vault.Field, KVVersion: pw.Vault.KVVersion, Lease: pw.Vault.Lease}
				src = set.vault.Source(name, ref)
			}
			sources[name] = src
			set.checks[name] = func(ctx context.Context) error { _, err := src.Fetch(ctx); return err }
		}
	}
	// The telemetry headers' secrets too (telemetry.headers[i].secret).
	if t := cfg.Telemetry; t != nil {
		for i, h := range t.Headers {
			if h.Secret == nil {
				continue
			}
			name := config.TelemetryCredentialName(i)
			set.paths[name] = name + ".secret"
			var src credentials.Source
			switch sec := h.Secret; {
			case sec.Env != "":
				src = credentials.Env{Name: sec.Env}
			case sec.File != "":
				src = credentials.File{Path: sec.File}
			default:
				ref := credentials.VaultRef{Mount: sec.Vault.Mount, Path: sec.Vault.Path, Field: sec.Vault.Field, KVVersion: sec.Vault.KVVersion, Lease: sec.Vault.Lease}
				src = set.vault.Source(name, ref)
			}
			sources[name] = src
			set.checks[name] = func(ctx context.Context) error { _, err := src.Fetch(ctx); return err }
		}
	}
	if old != nil && unchanged != nil {
		set.store = credentials.NewStoreFrom(old, sources, unchanged, opts)
	} else {
		set.store = credentials.NewStore(sources, opts)
	}
	own.store.Store(set.store) // the proxies' passwords of the broker's own connections

	if err := set.derive(cfg, log); err != nil {
		return nil, err
	}
	return set, nil
}

// start logs in to Vault (retrying in the background if it is unreachable), reads every
// credential once, and keeps them fresh in the background until ctx ends (retrying the
// unavailable ones with backoff). Problems with the credentials are logged; the broker
// starts anyway and /readyz names what is missing.
func (s *credentialSet) start(ctx context.Context, log zerolog.Logger) error {
	if s.vault != nil {
		if err := s.vault.Start(ctx); err != nil {
			return fmt.Errorf("vault: %w", err)
		}
	}
	for _, err := range s.store.Warm(ctx) {
		log.Warn().Err(err).Msg("credential not ready; requests granted it get 503 until it is")
	}
	s.keepFresh(ctx)
	return nil
}

// keepFresh re-reads the credentials in the background, each on its own schedule, until ctx
// ends or stopFresh is called.
func (s *credentialSet) keepFresh(ctx context.Context) {
	ctx, s.stopFresh = context.WithCancel(ctx)
	go s.store.Run(ctx)
}

// close revokes the minted tokens that can be revoked, then Vault leases, and stops renewals.
func (s *credentialSet) close(ctx context.Context) error {
	err := s.closeDerived(ctx)
	if s.vault == nil {
		return err
	}
	return errors.Join(err, s.vault.Close(ctx))
}

// check reads every credential once, as check-config does, and returns one error per
// credential that cannot be read (never its value).
func (s *credentialSet) check(ctx context.Context) []error {
	if s.vault != nil {
		if err := s.vault.Start(ctx); err != nil {
			return []error{fmt.Errorf("vault: %w", err)}
		}
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(s.checks)) { // sources, and keys that never leave Vault
		if err := s.checks[name](ctx); err != nil {
			// One mention of the credential, whether or not the source's error names it.
			msg := strings.TrimPrefix(err.Error(), fmt.Sprintf("credential %q: ", name))
			errs = append(errs, fmt.Errorf("%s: credential %q: %s", s.paths[name], name, msg))
		}
	}
	return errs
}

// vaultAddrs resolves the Vault address to the addresses agents must never reach through the broker.
func vaultAddrs(cfg *config.Config) []netip.AddrPort {
	if cfg.Vault == nil {
		return nil
	}
	u, err := url.Parse(cfg.Vault.Address)
	if err != nil {
		return nil
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil
	}
	ips, err := net.LookupIP(u.Hostname())
	if err != nil {
		return nil
	}
	var out []netip.AddrPort
	for _, ip := range ips {
		if a, ok := netip.AddrFromSlice(ip); ok {
			out = append(out, netip.AddrPortFrom(a.Unmap(), uint16(p)))
		}
	}
	return out
}
