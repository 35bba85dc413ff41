package main

import (
	"context"
	"errors"

	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/credentials"
	"github.com/capbroker/capbroker/credentials/github"
)

// githubApp builds the minter of a github_app credential: the App's key is read through the
// store (root), or with transit never leaves Vault. It talks to the API with verified TLS
// (system roots plus upstream.ca_file) and no proxy. path is the credential's key path.
func (s *credentialSet) githubApp(cfg *config.Config, path string, c config.Credential, root func(context.Context) (credentials.Secret, error), log zerolog.Logger) (credentials.Minter, error) {
	g := c.GitHubApp
	client, err := credentials.EndpointClient(cfg.Upstream.CAFile, ownDial(cfg))
	if err != nil {
		return nil, err
	}
	opts := github.Options{
		Name: c.Name, AppID: g.AppID, InstallationID: g.InstallationID, APIURL: g.APIURL,
		HTTPClient: client, Log: log.With().Str("component", "github_app").Logger(),
		Room: s.room(c.Name),
	}
	if t := g.Transit; t != nil {
		if s.vault == nil {
			return nil, errors.New("transit needs the vault section")
		}
		mount, key, v := t.Mount, t.Key, s.vault
		if mount == "" {
			mount = "transit"
		}
		opts.SignRS256 = func(ctx context.Context, in []byte) ([]byte, error) {
			return v.TransitSignRS256(ctx, mount, key, in)
		}
	} else {
		opts.PrivateKey = root
	}
	app, err := github.New(opts)
	if err != nil {
		return nil, err
	}
	// check-config signs a JWT: the key can be read, or Vault signs with it.
	s.checks[c.Name] = app.Check
	if _, ok := s.paths[c.Name]; !ok {
		s.paths[c.Name] = path
	}
	return app, nil
}
