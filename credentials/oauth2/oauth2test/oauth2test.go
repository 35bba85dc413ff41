// Package oauth2test is a stand-in OAuth2 authorisation server and protected API for tests:
// TLS on 127.0.0.1 with its own CA, a token endpoint that enforces grant types, client
// authentication (client_secret_basic, client_secret_post, private_key_jwt verified with the
// client's public key), scopes, expiry and refresh-token rotation, a Google-style token_uri
// that verifies service account assertions (JWT bearer grant, RS256), and an API that accepts
// only live bearer tokens it issued. It is imported by tests only.
package oauth2test

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/capbroker/capbroker/internal/testpki"
)

// Token prefixes, so tests can look for any issued token in logs.
const (
	AccessTokenPrefix  = "oauth2test-at-"
	RefreshTokenPrefix = "oauth2test-rt-"
)

// Client is a registered OAuth2 client.
type Client struct {
	ID string
	// Auth is the one authentication method the client may use: client_secret_basic,
	// client_secret_post or private_key_jwt.
	Auth string
	// Secret for client_secret_*; PublicKey (and Alg, default RS256) for private_key_jwt.
	Secret    string
	PublicKey crypto.PublicKey
	Alg       string
	// Grants the client may use: client_credentials, refresh_token.
	Grants []string
	// Scopes the client may be given; a request without scope gets all of them.
	Scopes []string
}

// Server is a running stand-in.
type Server struct {
	URL       string // https://127.0.0.1:port
	TokenURL  string // the OAuth2 token endpoint
	GoogleURL string // the token_uri of service account keys from AddServiceAccount
	APIURL    string // the protected API: GET answers 200 with the token's scopes, or 401
	CAFile    string // PEM of the CA that issued the server's certificate
	CA        *x509.CertPool
	srv       *httptest.Server

	mu        sync.Mutex
	lifetime  time.Duration
	rotate    bool
	clients   map[string]Client
	accounts  map[string]*rsa.PublicKey // service accounts by email
	refresh   map[string]*grant         // refresh tokens
	tokens    map[string]*grant         // access tokens
	jtis      map[string]bool           // client assertion IDs seen
	calls     int                       // requests to the token endpoints
	apiCalls  int
	override  http.HandlerFunc // answers token requests instead, when set
	gate      chan struct{}    // token requests wait for it to be closed, when set
	arrived   chan struct{}    // gets a value for each token request that waits at the gate
	lastForm  url.Values       // the last token request's form (secrets included: tests only)
	lastAsked []string         // scopes of the last successful token request
}

// grant is what a token carries.
type grant struct {
	client  string
	scopes  []string
	expires time.Time
	revoked bool
	used    bool // refresh tokens: used once, then invalid (rotation)
}

// Start runs a stand-in until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	pki := testpki.New(t, "oauth2test CA")
	s := &Server{
		CAFile: pki.File, CA: pki.Pool,
		lifetime: time.Hour, rotate: true,
		clients: map[string]Client{}, accounts: map[string]*rsa.PublicKey{},
		refresh: map[string]*grant{}, tokens: map[string]*grant{}, jtis: map[string]bool{},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /token", s.gated(s.token))
	mux.HandleFunc("POST /google/token", s.gated(s.google))
	mux.HandleFunc("/api/", s.api)
	s.srv = httptest.NewUnstartedServer(mux)
	// 127.0.0.2 too: a test may put the stand-in behind a relay there (a proxied origin).
	leaf := pki.Server(t, time.Now().Add(24*time.Hour), "localhost", "127.0.0.1", "127.0.0.2")
	s.srv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	s.srv.StartTLS()
	t.Cleanup(s.srv.Close)
	s.URL = s.srv.URL
	s.TokenURL = s.URL + "/token"
	s.GoogleURL = s.URL + "/google/token"
	s.APIURL = s.URL + "/api/"
	return s
}

// HTTPClient trusts the stand-in's CA.
func (s *Server) HTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.CA}, Proxy: nil}}
}

// Close stops the server: the endpoint is down from now on (connections refused).
func (s *Server) Close() { s.srv.Close() }

// AddClient registers a client.
func (s *Server) AddClient(c Client) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clients[c.ID] = c
}

// SetLifetime sets expires_in of the tokens issued from now on.
func (s *Server) SetLifetime(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lifetime = d
}

// SetRotation turns refresh-token rotation on (the default) or off.
func (s *Server) SetRotation(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rotate = on
}

// Override answers token requests with h instead (nil restores the real endpoint).
func (s *Server) Override(h http.HandlerFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.override = h
}

// Hold makes token requests wait until the returned function is called. Each request that
// waits sends on arrived first.
func (s *Server) Hold() (arrived <-chan struct{}, release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	gate, arr := make(chan struct{}), make(chan struct{}, 1000)
	s.gate, s.arrived = gate, arr
	var once sync.Once
	return arr, func() {
		once.Do(func() {
			s.mu.Lock()
			s.gate = nil
			s.mu.Unlock()
			close(gate)
		})
	}
}

// Calls is how many requests the token endpoints have had.
func (s *Server) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// APICalls is how many requests the API has had.
func (s *Server) APICalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.apiCalls
}

// LastForm is the form of the last token request (it holds secrets: tests only).
func (s *Server) LastForm() url.Values {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastForm
}

// LastScopes are the scopes granted by the last successful token request.
func (s *Server) LastScopes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastAsked
}

// IssueRefreshToken issues a refresh token to a client, for the scopes given (all the
// client's when none), as an authorisation code exchange would have.
func (s *Server) IssueRefreshToken(clientID string, scopes ...string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(scopes) == 0 {
		scopes = s.clients[clientID].Scopes
	}
	rt := RefreshTokenPrefix + random()
	s.refresh[rt] = &grant{client: clientID, scopes: slices.Clone(scopes)}
	return rt
}

// RefreshTokenValid reports whether rt can still be used.
func (s *Server) RefreshTokenValid(rt string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.refresh[rt]
	return g != nil && !g.used && !g.revoked
}

// Revoke revokes an access token: the API answers 401 to it from now on.
func (s *Server) Revoke(at string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.tokens[at]; g != nil {
		g.revoked = true
	}
}

// RevokeAll revokes every access token issued so far.
func (s *Server) RevokeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.tokens {
		g.revoked = true
	}
}

// Issued returns every access token issued so far.
func (s *Server) Issued() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for at := range s.tokens {
		out = append(out, at)
	}
	return out
}

// AddServiceAccount creates a service account and returns its JSON key, whose token_uri is
// GoogleURL and whose private key is a fresh RSA key.
func (s *Server) AddServiceAccount(t testing.TB, email string, scopes ...string) []byte {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.accounts[email] = &key.PublicKey
	s.clients[email] = Client{ID: email, Scopes: scopes}
	s.mu.Unlock()
	b, _ := json.Marshal(map[string]string{
		"type":           "service_account",
		"project_id":     "oauth2test",
		"private_key_id": "key-" + random()[:8],
		"private_key":    string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email":   email,
		"client_id":      "1234567890",
		"auth_uri":       s.URL + "/auth",
		"token_uri":      s.GoogleURL,
	})
	return b
}

func random() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// gated counts a token request, holds it at the gate if one is set, and lets an override
// answer it.
func (s *Server) gated(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.calls++
		gate, arrived := s.gate, s.arrived
		s.mu.Unlock()
		if gate != nil {
			arrived <- struct{}{}
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
		s.mu.Lock()
		o := s.override
		s.mu.Unlock()
		if o != nil {
			o(w, r)
			return
		}
		h(w, r)
	}
}

// oauthError answers an RFC 6749 §5.2 error.
func oauthError(w http.ResponseWriter, status int, code, desc string) {
	w.Header().Set("Content-Type", "application/json")
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Basic realm="oauth2test"`)
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code, "error_description": desc})
}

// token is the OAuth2 token endpoint.
func (s *Server) token(w http.ResponseWriter, r *http.Request) {
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/x-www-form-urlencoded") {
		oauthError(w, http.StatusBadRequest, "invalid_request", "form body required")
		return
	}
	if err := r.ParseForm(); err != nil || len(r.URL.Query()) > 0 {
		oauthError(w, http.StatusBadRequest, "invalid_request", "bad form, or parameters in the query")
		return
	}
	form := r.PostForm
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastForm = form
	c, ok := s.authenticate(r, form)
	if !ok {
		oauthError(w, http.StatusUnauthorized, "invalid_client", "client authentication failed")
		return
	}
	gt := form.Get("grant_type")
	if !slices.Contains(c.Grants, gt) {
		oauthError(w, http.StatusBadRequest, "unauthorized_client", "grant type not allowed for this client")
		return
	}
	asked := strings.Fields(form.Get("scope"))
	var scopes []string
	var newRT string
	switch gt {
	case "client_credentials":
		if len(asked) == 0 {
			asked = c.Scopes
		}
		for _, sc := range asked {
			if !slices.Contains(c.Scopes, sc) {
				oauthError(w, http.StatusBadRequest, "invalid_scope", "scope not allowed")
				return
			}
		}
		scopes = asked
	case "refresh_token":
		rt := form.Get("refresh_token")
		g := s.refresh[rt]
		if g == nil || g.used || g.revoked || g.client != c.ID {
			oauthError(w, http.StatusBadRequest, "invalid_grant", "refresh token invalid, used or revoked")
			return
		}
		if len(asked) == 0 {
			asked = g.scopes
		}
		for _, sc := range asked {
			if !slices.Contains(g.scopes, sc) {
				oauthError(w, http.StatusBadRequest, "invalid_scope", "scope beyond the refresh token's")
				return
			}
		}
		scopes = asked
		if s.rotate {
			g.used = true
			newRT = RefreshTokenPrefix + random()
			s.refresh[newRT] = &grant{client: c.ID, scopes: g.scopes}
		}
	default:
		oauthError(w, http.StatusBadRequest, "unsupported_grant_type", "unsupported grant type")
		return
	}
	s.issue(w, c.ID, scopes, newRT)
}

// issue answers a token response. s.mu is held.
func (s *Server) issue(w http.ResponseWriter, client string, scopes []string, rt string) {
	at := AccessTokenPrefix + random()
	s.tokens[at] = &grant{client: client, scopes: slices.Clone(scopes), expires: time.Now().Add(s.lifetime)}
	s.lastAsked = slices.Clone(scopes)
	resp := map[string]any{
		"access_token": at,
		"token_type":   "Bearer",
		"expires_in":   int(s.lifetime / time.Second),
		"scope":        strings.Join(scopes, " "),
	}
	if rt != "" {
		resp["refresh_token"] = rt
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(resp)
}

// authenticate checks that the request uses exactly one client authentication method, the
// one the client is registered with, and that it is valid. s.mu is held.
func (s *Server) authenticate(r *http.Request, form url.Values) (Client, bool) {
	user, pass, basic := r.BasicAuth()
	post := form.Has("client_secret")
	assertion := form.Has("client_assertion") || form.Has("client_assertion_type")
	n := 0
	for _, b := range []bool{basic, post, assertion} {
		if b {
			n++
		}
	}
	if n != 1 {
		return Client{}, false
	}
	switch {
	case basic:
		// RFC 6749 §2.3.1: the ID and secret are form-urlencoded before Basic encoding.
		id, err1 := url.QueryUnescape(user)
		secret, err2 := url.QueryUnescape(pass)
		c, ok := s.clients[id]
		if err1 != nil || err2 != nil || !ok || c.Auth != "client_secret_basic" || c.Secret != secret ||
			(form.Has("client_id") && form.Get("client_id") != id) {
			return Client{}, false
		}
		return c, true
	case post:
		c, ok := s.clients[form.Get("client_id")]
		if !ok || c.Auth != "client_secret_post" || c.Secret != form.Get("client_secret") {
			return Client{}, false
		}
		return c, true
	}
	// private_key_jwt (RFC 7523 §2.2)
	if form.Get("client_assertion_type") != "urn:ietf:params:oauth:client-assertion-type:jwt-bearer" {
		return Client{}, false
	}
	c, ok := s.clients[form.Get("client_id")]
	if !ok || c.Auth != "private_key_jwt" {
		return Client{}, false
	}
	alg := c.Alg
	if alg == "" {
		alg = "RS256"
	}
	claims := jwt.RegisteredClaims{}
	_, err := jwt.ParseWithClaims(form.Get("client_assertion"), &claims,
		func(*jwt.Token) (any, error) { return c.PublicKey, nil },
		jwt.WithValidMethods([]string{alg}), jwt.WithAudience(s.TokenURL), jwt.WithIssuer(c.ID),
		jwt.WithSubject(c.ID), jwt.WithExpirationRequired(), jwt.WithIssuedAt())
	if err != nil || claims.ID == "" || s.jtis[claims.ID] || claims.ExpiresAt.Sub(time.Now()) > 10*time.Minute {
		return Client{}, false
	}
	s.jtis[claims.ID] = true
	return c, true
}

// google is a Google-style token_uri: the JWT bearer grant with a service account assertion.
func (s *Server) google(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		oauthError(w, http.StatusBadRequest, "invalid_request", "bad form")
		return
	}
	if r.PostForm.Get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
		oauthError(w, http.StatusBadRequest, "unsupported_grant_type", "jwt-bearer only")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastForm = r.PostForm
	var claims struct {
		jwt.RegisteredClaims
		Scope string `json:"scope"`
	}
	var key *rsa.PublicKey
	_, err := jwt.ParseWithClaims(r.PostForm.Get("assertion"), &claims, func(t *jwt.Token) (any, error) {
		iss, _ := t.Claims.GetIssuer()
		if k := s.accounts[iss]; k != nil {
			key = k
			return k, nil
		}
		return nil, jwt.ErrTokenUnverifiable
	}, jwt.WithValidMethods([]string{"RS256"}), jwt.WithAudience(s.GoogleURL), jwt.WithExpirationRequired(), jwt.WithIssuedAt())
	if err != nil || key == nil || claims.ExpiresAt.Sub(claims.IssuedAt.Time) > time.Hour {
		oauthError(w, http.StatusBadRequest, "invalid_grant", "Invalid JWT Signature.")
		return
	}
	c := s.clients[claims.Issuer]
	scopes := strings.Fields(claims.Scope)
	if len(scopes) == 0 {
		oauthError(w, http.StatusBadRequest, "invalid_scope", "Invalid OAuth scope or ID token audience provided.")
		return
	}
	for _, sc := range scopes {
		if !slices.Contains(c.Scopes, sc) {
			oauthError(w, http.StatusBadRequest, "invalid_scope", "Invalid OAuth scope or ID token audience provided.")
			return
		}
	}
	s.issue(w, c.ID, scopes, "")
}

// api is the protected API: 200 with the token's scopes for a live token it issued, 401
// otherwise. GET /api/echo also echoes the token in the body (for scrubbing tests).
func (s *Server) api(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.apiCalls++
	at, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	g := s.tokens[at]
	s.mu.Unlock()
	if !ok || g == nil || g.revoked || !time.Now().Before(g.expires) {
		w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
		http.Error(w, `{"error":"invalid_token"}`, http.StatusUnauthorized)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	resp := map[string]any{"ok": true, "client": g.client, "scopes": g.scopes}
	if r.URL.Path == "/api/echo" {
		resp["token"] = at
	}
	_ = json.NewEncoder(w).Encode(resp)
}
