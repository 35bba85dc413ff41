package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/inject"
	"github.com/capbroker/capbroker/credentials"
	"github.com/capbroker/capbroker/credentials/aws"
)

// derive builds the minter or signer of every derived credential of cfg (config.Credential
// .Derived): each reads its root secret through the store, so that caching, leases, rotation
// and readiness work as for any credential.
func (s *credentialSet) derive(cfg *config.Config, log zerolog.Logger) error {
	s.minters, s.signers = map[string]credentials.Minter{}, map[string]credentials.Signer{}
	for i, c := range cfg.Credentials {
		if !c.Derived() {
			continue
		}
		path := fmt.Sprintf("credentials[%d]", i)
		name := c.Name
		root := func(ctx context.Context) (credentials.Secret, error) { return s.store.Get(ctx, name) }
		switch {
		case c.AWSSigV4 != nil:
			sg, err := aws.New(root, aws.Options{Region: c.AWSSigV4.Region, Service: c.AWSSigV4.Service})
			if err != nil {
				return fmt.Errorf("%s.aws_sigv4: %w", path, err)
			}
			s.signers[name] = sg
		case c.GitHubApp != nil:
			m, err := s.githubApp(cfg, path+".github_app", c, root, log)
			if err != nil {
				return fmt.Errorf("%s.github_app: %w", path, err)
			}
			s.minters[name] = m
		case c.OAuth2 != nil || c.GoogleServiceAccount != nil:
			m, err := s.oauth2Minter(cfg, c, root, log)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			s.minters[name] = m
		default:
			return fmt.Errorf("%s: this build of the broker cannot derive this credential", path)
		}
	}
	return nil
}

// Minter returns the minter of a credential that mints tokens, nil for any other.
func (s *credentialSet) Minter(name string) credentials.Minter { return s.minters[name] }

// Signer returns the signer of a credential that signs requests, nil for any other.
func (s *credentialSet) Signer(name string) credentials.Signer { return s.signers[name] }

// Get reads a credential's value through the store.
func (s *credentialSet) Get(ctx context.Context, name string) (credentials.Secret, error) {
	return s.store.Get(ctx, name)
}

// Known returns the values of the credential the store holds, without reading its source.
// Minted tokens are not among them: the broker records each in its registry of known secrets
// as it sends it (inject.Known).
func (s *credentialSet) Known(name string) []credentials.Secret { return s.store.Known(name) }

// room is what the minter of the named credential asks before minting (credentials.Room).
func (s *credentialSet) room(name string) credentials.Room {
	if s.known == nil {
		return nil
	}
	return func() error { return s.known.Room(name) }
}

// knownRetain is how long the registry of known secrets keeps a value that is not a minted
// token after it was last sent: inject.DefaultRetain, or the refresh interval if longer.
func knownRetain(cfg *config.Config) time.Duration {
	if cfg.Vault != nil {
		return max(cfg.Vault.RefreshInterval, inject.DefaultRetain)
	}
	return inject.DefaultRetain
}

// Status reports every credential: a derived one is ready when its root secret is (if it has
// one in the store) and its minter can serve.
func (s *credentialSet) Status() map[string]credentials.CredentialStatus {
	out := s.store.Status()
	for name, m := range s.minters {
		ds := m.Status()
		st, hasRoot := out[name]
		if !hasRoot {
			st.Ready = true
		}
		st.Ready = st.Ready && ds.Ready
		if ds.LastError != "" {
			st.Error = ds.LastError
		}
		st.ValidUntil, st.LastRefresh = ds.ValidUntil, ds.LastRefresh
		out[name] = st
	}
	return out
}

// retire makes s the successor of prev (a reload): prev's minters are kept for revoking what
// they minted at stop, not for minting.
func (s *credentialSet) retire(prev *credentialSet) {
	s.retired = map[string][]credentials.Minter{}
	for name, ms := range prev.retired {
		s.retired[name] = append(s.retired[name], ms...)
	}
	for name, m := range prev.minters {
		s.retired[name] = append(s.retired[name], m)
	}
}

// closeDerived revokes what the minters, current and retired, can revoke (GitHub installation
// tokens), when the broker stops.
func (s *credentialSet) closeDerived(ctx context.Context) error {
	var errs []error
	revoke := func(name string, m credentials.Minter) {
		if err := m.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("credential %q: revoking minted tokens: %w", name, err))
		}
	}
	for name, m := range s.minters {
		revoke(name, m)
	}
	for name, ms := range s.retired {
		for _, m := range ms {
			revoke(name, m)
		}
	}
	return errors.Join(errs...)
}
