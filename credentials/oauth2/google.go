package oauth2

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/jwt"
)

// GoogleConfig describes a Google service account credential. The root secret (Deps.Root) is
// the account's JSON key as Google issues it: type "service_account", client_email,
// private_key, private_key_id and token_uri.
type GoogleConfig struct {
	// Scopes are asked for when the decision does not narrow them, and bound what it may ask.
	Scopes []string
	// Subject is the user to impersonate (domain-wide delegation); "" for the account itself.
	Subject string
}

// Validate reports every problem with the configuration.
func (c GoogleConfig) Validate() error {
	var errs []error
	if len(c.Scopes) == 0 {
		errs = append(errs, errors.New("scopes are required"))
	}
	for _, s := range c.Scopes {
		if s == "" || strings.ContainsAny(s, " \t\r\n\"\\") {
			errs = append(errs, fmt.Errorf("scope %q is not a single scope token", s))
		}
	}
	return errors.Join(errs...)
}

// NewGoogle builds a Minter for a Google service account: each token is obtained with the JWT
// bearer grant (RFC 7523) at the key's token_uri, the assertion signed with the key.
func NewGoogle(name string, cfg GoogleConfig, deps Deps) (*Minter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("credential %q: %w", name, err)
	}
	if deps.Root == nil {
		return nil, fmt.Errorf("credential %q: no source for the service account key", name)
	}
	hc, skew := endpointClient(deps.HTTPClient)
	g := &google{cfg: cfg, root: deps.Root, http: hc}
	m := newMinter(name, slices.Clone(cfg.Scopes), deps, g.mint)
	m.skew = skew
	return m, nil
}

type google struct {
	cfg  GoogleConfig
	root Root
	http *http.Client
}

// serviceAccountKey is the part of a service account JSON key the grant uses.
type serviceAccountKey struct {
	Type         string `json:"type"`
	ClientEmail  string `json:"client_email"`
	PrivateKeyID string `json:"private_key_id"`
	PrivateKey   string `json:"private_key"`
	TokenURI     string `json:"token_uri"`
}

// parseKey reads and checks a service account key. Errors name the problem, never a value.
func parseKey(raw string) (*serviceAccountKey, error) {
	var k serviceAccountKey
	if err := json.Unmarshal([]byte(raw), &k); err != nil {
		return nil, failure("the service account key is not a JSON key")
	}
	var missing []string
	for _, f := range []struct{ name, v string }{
		{"client_email", k.ClientEmail}, {"private_key", k.PrivateKey}, {"token_uri", k.TokenURI},
	} {
		if f.v == "" {
			missing = append(missing, f.name)
		}
	}
	switch {
	case k.Type != "service_account":
		return nil, failure("the key is not a service account key (its type is not \"service_account\")")
	case len(missing) > 0:
		return nil, failure("the service account key has no %s", strings.Join(missing, ", "))
	}
	if u, err := url.Parse(k.TokenURI); err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil {
		return nil, failure("the service account key's token_uri is not an https:// URL")
	}
	block, _ := pem.Decode([]byte(k.PrivateKey))
	if block == nil {
		return nil, failure("the service account key's private_key is not PEM")
	}
	if _, err := x509.ParsePKCS8PrivateKey(block.Bytes); err != nil {
		if _, err := x509.ParsePKCS1PrivateKey(block.Bytes); err != nil {
			return nil, failure("the service account key's private_key is not an RSA private key")
		}
	}
	return &k, nil
}

func (g *google) mint(ctx context.Context, scopes []string) (*oauth2.Token, error) {
	if scopes == nil {
		scopes = g.cfg.Scopes
	}
	root, err := g.root(ctx)
	if err != nil {
		return nil, &mintError{class: "reading the service account key: " + err.Error()}
	}
	k, err := parseKey(root.Reveal())
	if err != nil {
		return nil, err
	}
	conf := &jwt.Config{
		Email:        k.ClientEmail,
		PrivateKey:   []byte(k.PrivateKey),
		PrivateKeyID: k.PrivateKeyID,
		Scopes:       scopes,
		TokenURL:     k.TokenURI,
		Subject:      g.cfg.Subject,
	}
	return conf.TokenSource(context.WithValue(ctx, oauth2.HTTPClient, g.http)).Token()
}
