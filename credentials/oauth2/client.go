package oauth2

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/capbroker/capbroker/internal/svcdial"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/rs/zerolog"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"

	"github.com/capbroker/capbroker/credentials"
)

// Grants.
const (
	GrantClientCredentials = "client_credentials"
	GrantRefreshToken      = "refresh_token"
)

// Client authentication methods, named as in RFC 7591 (token_endpoint_auth_method).
const (
	AuthClientSecretBasic = "client_secret_basic" // HTTP Basic with the client secret
	AuthClientSecretPost  = "client_secret_post"  // client_id and client_secret in the form
	AuthPrivateKeyJWT     = "private_key_jwt"     // a JWT signed with the client's private key (RFC 7523)
)

// AssertionAlgs are the algorithms a private_key_jwt client assertion may be signed with.
var AssertionAlgs = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// reservedParams are set by the grant itself; Params may not override them.
var reservedParams = []string{"grant_type", "scope", "client_id", "client_secret", "client_assertion", "client_assertion_type", "refresh_token", "assertion"}

// assertionLifetime is how long a client assertion is valid.
const assertionLifetime = 2 * time.Minute

// Config describes an OAuth2 client. The root secret (Deps.Root) is the client secret, or the
// PEM private key for private_key_jwt.
type Config struct {
	TokenURL   string // https://
	Grant      string // client_credentials (default) or refresh_token
	ClientID   string
	ClientAuth string // client_secret_basic (default), client_secret_post or private_key_jwt
	// private_key_jwt: the assertion's algorithm (default RS256) and key ID ("kid", optional).
	AssertionAlg, AssertionKeyID string
	// Scopes are asked for when the decision does not narrow them, and bound what it may ask.
	Scopes []string
	// Params are added to every token request (audience, resource, ...).
	Params map[string]string
	// RefreshToken keeps the refresh token (refresh_token grant only).
	RefreshToken RefreshTokenStore
}

// Validate reports every problem with the configuration.
func (c Config) Validate() error {
	var errs []error
	if u, err := url.Parse(c.TokenURL); err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil {
		errs = append(errs, errors.New("token_url must be an https:// URL without credentials"))
	}
	switch c.Grant {
	case "", GrantClientCredentials:
		if c.RefreshToken != nil {
			errs = append(errs, errors.New("refresh_token is only used with grant refresh_token"))
		}
	case GrantRefreshToken:
		if c.RefreshToken == nil {
			errs = append(errs, errors.New("grant refresh_token needs refresh_token"))
		}
	default:
		errs = append(errs, fmt.Errorf("grant %q is not client_credentials or refresh_token", c.Grant))
	}
	if c.ClientID == "" {
		errs = append(errs, errors.New("client_id is required"))
	}
	switch c.ClientAuth {
	case "", AuthClientSecretBasic, AuthClientSecretPost:
		if c.AssertionAlg != "" || c.AssertionKeyID != "" {
			errs = append(errs, errors.New("the assertion algorithm and key ID are only used with private_key_jwt"))
		}
	case AuthPrivateKeyJWT:
		if c.AssertionAlg != "" && !slices.Contains(AssertionAlgs, c.AssertionAlg) {
			errs = append(errs, fmt.Errorf("assertion algorithm %q is not one of %s", c.AssertionAlg, strings.Join(AssertionAlgs, ", ")))
		}
	default:
		errs = append(errs, fmt.Errorf("client_auth %q is not client_secret_basic, client_secret_post or private_key_jwt", c.ClientAuth))
	}
	for _, s := range c.Scopes {
		if s == "" || strings.ContainsAny(s, " \t\r\n\"\\") {
			errs = append(errs, fmt.Errorf("scope %q is not a single scope token", s))
		}
	}
	for k := range c.Params {
		if slices.Contains(reservedParams, k) {
			errs = append(errs, fmt.Errorf("params may not set %q", k))
		}
	}
	return errors.Join(errs...)
}

// New builds a Minter for an OAuth2 client. It does not contact the endpoint.
func New(name string, cfg Config, deps Deps) (*Minter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("credential %q: %w", name, err)
	}
	if deps.Root == nil {
		return nil, fmt.Errorf("credential %q: no source for the client secret", name)
	}
	if cfg.Grant == "" {
		cfg.Grant = GrantClientCredentials
	}
	if cfg.ClientAuth == "" {
		cfg.ClientAuth = AuthClientSecretBasic
	}
	if cfg.ClientAuth == AuthPrivateKeyJWT && cfg.AssertionAlg == "" {
		cfg.AssertionAlg = "RS256"
	}
	hc, skew := endpointClient(deps.HTTPClient)
	c := &client{cfg: cfg, root: deps.Root, http: hc}
	m := newMinter(name, slices.Clone(cfg.Scopes), deps, c.mint)
	m.skew = skew
	c.log = m.log
	if cfg.Grant == GrantRefreshToken {
		m.after = c.writeBackError
	}
	return m, nil
}

// endpointClient returns a copy of hc (or a default client) that never follows a redirect (a
// token request carries the client's credentials, which must go to the token URL only) and
// watches the endpoint's clock against the wall clock, which dates the JWT assertions (the
// cache's clock, Deps.Now, is another matter).
func endpointClient(hc *http.Client) (*http.Client, *skewWatch) {
	if hc == nil {
		hc, _ = credentials.EndpointClient("", nil) // no CA file: cannot fail; no dialer: dials nothing
	}
	c := *hc
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	next := c.Transport
	if next == nil {
		next = svcdial.Transport(nil, nil, 0) // a client without a transport dials nothing
	}
	w := &skewWatch{next: next, now: time.Now}
	c.Transport = w
	return &c, w
}

// client performs the grants.
type client struct {
	cfg  Config
	root Root
	http *http.Client
	log  zerolog.Logger

	// refresh_token grant: the current refresh token, held in memory once read, and whether
	// it still has to be written back. One grant at a time, as each may rotate it.
	rtMu     sync.Mutex
	rt       credentials.Secret
	pending  bool
	writeErr string
}

// mint asks the token endpoint for a token.
func (c *client) mint(ctx context.Context, scopes []string) (*oauth2.Token, error) {
	if scopes == nil {
		scopes = c.cfg.Scopes
	}
	root, err := c.root(ctx)
	if err != nil {
		return nil, &mintError{class: "reading the client's secret: " + err.Error()}
	}
	if c.cfg.Grant == GrantClientCredentials {
		return c.request(ctx, scopes, root, nil)
	}
	return c.refresh(ctx, scopes, root)
}

// request makes one token request with the grant's own parameters added.
func (c *client) request(ctx context.Context, scopes []string, root credentials.Secret, grant url.Values) (*oauth2.Token, error) {
	params := url.Values{}
	for k, v := range c.cfg.Params {
		params.Set(k, v)
	}
	for k, v := range grant {
		params[k] = v
	}
	cc := clientcredentials.Config{
		ClientID: c.cfg.ClientID,
		TokenURL: c.cfg.TokenURL,
		Scopes:   scopes,
	}
	switch c.cfg.ClientAuth {
	case AuthClientSecretBasic:
		cc.ClientSecret, cc.AuthStyle = root.Reveal(), oauth2.AuthStyleInHeader
	case AuthClientSecretPost:
		cc.ClientSecret, cc.AuthStyle = root.Reveal(), oauth2.AuthStyleInParams
	case AuthPrivateKeyJWT:
		assertion, err := c.assertion(root)
		if err != nil {
			return nil, err
		}
		cc.AuthStyle = oauth2.AuthStyleInParams // client_id in the form, no secret
		params.Set("client_assertion_type", "urn:ietf:params:oauth:client-assertion-type:jwt-bearer")
		params.Set("client_assertion", assertion)
	}
	cc.EndpointParams = params
	return cc.Token(context.WithValue(ctx, oauth2.HTTPClient, c.http))
}

// assertion signs a private_key_jwt client assertion (RFC 7523 §3) with the root key.
func (c *client) assertion(root credentials.Secret) (string, error) {
	method := jwt.GetSigningMethod(c.cfg.AssertionAlg)
	if method == nil {
		return "", failure("assertion algorithm %s is not supported", c.cfg.AssertionAlg)
	}
	pem := []byte(root.Reveal())
	var key any
	var err error
	switch {
	case strings.HasPrefix(c.cfg.AssertionAlg, "RS"), strings.HasPrefix(c.cfg.AssertionAlg, "PS"):
		key, err = jwt.ParseRSAPrivateKeyFromPEM(pem)
	case strings.HasPrefix(c.cfg.AssertionAlg, "ES"):
		key, err = jwt.ParseECPrivateKeyFromPEM(pem)
	default:
		key, err = jwt.ParseEdPrivateKeyFromPEM(pem)
	}
	if err != nil {
		return "", failure("the client's private key is not a PEM %s key", c.cfg.AssertionAlg)
	}
	jti := make([]byte, 16)
	_, _ = rand.Read(jti)
	now := time.Now() // the wire's clock, not the cache's
	t := jwt.NewWithClaims(method, jwt.RegisteredClaims{
		Issuer:    c.cfg.ClientID,
		Subject:   c.cfg.ClientID,
		Audience:  jwt.ClaimStrings{c.cfg.TokenURL},
		ID:        hex.EncodeToString(jti),
		IssuedAt:  jwt.NewNumericDate(now),
		NotBefore: jwt.NewNumericDate(now.Add(-30 * time.Second)),
		ExpiresAt: jwt.NewNumericDate(now.Add(assertionLifetime)),
	})
	if c.cfg.AssertionKeyID != "" {
		t.Header["kid"] = c.cfg.AssertionKeyID
	}
	s, err := t.SignedString(key)
	if err != nil {
		return "", failure("signing the client assertion failed")
	}
	return s, nil
}
