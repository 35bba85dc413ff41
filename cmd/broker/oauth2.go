package main

import (
	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/credentials"
	"github.com/capbroker/capbroker/credentials/oauth2"
)

// oauth2Minter builds the minter of an oauth2 or google_service_account credential. Token
// endpoints are reached with the system roots plus upstream.ca_file.
func (s *credentialSet) oauth2Minter(cfg *config.Config, c config.Credential, root oauth2.Root, log zerolog.Logger) (credentials.Minter, error) {
	hc, err := credentials.EndpointClient(cfg.Upstream.CAFile, ownDial(cfg))
	if err != nil {
		return nil, err
	}
	deps := oauth2.Deps{Root: root, HTTPClient: hc, Log: log, Room: s.room(c.Name)}
	if g := c.GoogleServiceAccount; g != nil {
		return oauth2.NewGoogle(c.Name, oauth2.GoogleConfig{Scopes: g.Scopes, Subject: g.Subject}, deps)
	}
	o := c.OAuth2
	oc := oauth2.Config{
		TokenURL: o.TokenURL, Grant: o.Grant, ClientID: o.ClientID, ClientAuth: o.ClientAuth,
		Scopes: o.Scopes, Params: o.Params,
	}
	if k := o.PrivateKeyJWT; k != nil {
		oc.AssertionAlg, oc.AssertionKeyID = k.Alg, k.KeyID
	}
	if rt := o.RefreshToken; rt != nil {
		switch {
		case rt.Vault != nil:
			v := rt.Vault
			oc.RefreshToken = oauth2.VaultRefreshToken{Vault: s.vault, Name: c.Name,
				Ref: credentials.VaultRef{Mount: v.Mount, Path: v.Path, Field: v.Field, KVVersion: v.KVVersion}}
		case rt.File != "":
			oc.RefreshToken = oauth2.FileRefreshToken{Path: rt.File}
		}
	}
	return oauth2.New(c.Name, oc, deps)
}
