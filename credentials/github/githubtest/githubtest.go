// Package githubtest is a GitHub stand-in for tests: an HTTPS server on loopback, with its
// own CA, that plays one GitHub App installation. It verifies app JWTs with the App's public
// key, issues scoped installation tokens that expire, enforces their scope on a few API
// endpoints and on git's smart-HTTP protocol (real repositories served by git http-backend),
// and revokes them on DELETE /installation/token. GET /echo/authorization answers the
// Authorization header it received, as a careless upstream would. It is imported by tests only.
package githubtest

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/capbroker/capbroker/internal/testpki"
)

// Fault makes the token endpoint misbehave.
type Fault int

const (
	None      Fault = iota
	Down            // answers 503
	Garbage         // answers 201 with a body that is not JSON
	NoToken         // answers 201 without a token
	Expired         // answers a token that expired an hour ago
	Wider           // answers a token with more permissions and all repositories
	BadSecret       // answers 500 with a body holding a secret-looking value (BodyCanary)
)

// BodyCanary is what a BadSecret answer carries; it must never reach an error or a log.
const BodyCanary = "ghs_BODY_CANARY_must_never_be_logged"

// Options describe the installation.
type Options struct {
	AppID          string
	InstallationID int64
	PublicKey      *rsa.PublicKey // the App's; app JWTs are verified with it
	Owner          string         // default "o"
	Repos          []string       // the installation's repositories
	// GitRoot holds bare repositories as <GitRoot>/<Owner>/<name>.git, served over smart HTTP.
	GitRoot string
	// Permissions of the installation; default contents, issues: write; metadata: read.
	Permissions map[string]string
	TTL         time.Duration    // token lifetime; default 1h
	Now         func() time.Time // GitHub's clock; default time.Now
	// Certificate is served instead of one from the stand-in's own CA.
	Certificate *tls.Certificate
}

// Server is a running stand-in.
type Server struct {
	URL    string // https://127.0.0.1:PORT
	CAFile string // PEM of the CA its certificate is from ("" with Options.Certificate)
	Pool   *x509.CertPool

	opts Options
	srv  *httptest.Server
	git  http.Handler

	mu       sync.Mutex
	tokens   map[string]*issued
	order    []string
	revoked  []string
	mints    int
	fault    Fault
	hold     chan struct{}
	log      []string // method path auth-kind, for asserting what reached GitHub
	jwtFails int
	asked    []Asked
}

// Asked is what one token request asked for, as its body said (nil: left out, the
// installation's own).
type Asked struct {
	Repositories []string
	Permissions  map[string]string
}

type issued struct {
	repos   []string // nil: every repository of the installation
	perms   map[string]string
	expires time.Time
	revoked bool
}

var levels = map[string]int{"read": 1, "write": 2, "admin": 3}

// Start runs a stand-in until the test ends.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	if o.Owner == "" {
		o.Owner = "o"
	}
	if o.Permissions == nil {
		o.Permissions = map[string]string{"contents": "write", "issues": "write", "metadata": "read"}
	}
	if o.TTL == 0 {
		o.TTL = time.Hour
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	s := &Server{opts: o, tokens: map[string]*issued{}}
	if o.GitRoot != "" {
		out, err := exec.Command("git", "--exec-path").Output()
		if err != nil {
			t.Fatalf("githubtest: git --exec-path: %v", err)
		}
		s.git = &cgi.Handler{
			Path: filepath.Join(strings.TrimSpace(string(out)), "git-http-backend"),
			Env: []string{"GIT_PROJECT_ROOT=" + o.GitRoot, "GIT_HTTP_EXPORT_ALL=1",
				"REMOTE_USER=x-access-token", "GIT_CONFIG_NOSYSTEM=1", "HOME=" + o.GitRoot},
		}
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	cert := o.Certificate
	if cert == nil {
		pki := testpki.New(t, "githubtest CA")
		cert, s.CAFile, s.Pool = &pki.Leaf, pki.File, pki.Pool
	}
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{*cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	s.srv = srv
	s.URL = srv.URL
	return s
}

// Client trusts the stand-in's CA (own-CA mode only).
func (s *Server) Client() *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.Pool}}}
}

// SetFault makes the token endpoint misbehave from now on.
func (s *Server) SetFault(f Fault) {
	s.mu.Lock()
	s.fault = f
	s.mu.Unlock()
}

// Hold makes mints wait until release is called (to line up concurrent requests).
func (s *Server) Hold() (release func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	s.hold = ch
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.hold = nil
			s.mu.Unlock()
			close(ch)
		})
	}
}

// Mints is how many tokens were asked for (answered or not).
func (s *Server) Mints() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mints
}

// JWTFailures is how many token requests had an app JWT that did not verify.
func (s *Server) JWTFailures() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.jwtFails
}

// Issued returns every token issued, oldest first.
func (s *Server) Issued() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.order)
}

// Revoked returns the tokens revoked through DELETE /installation/token.
func (s *Server) Revoked() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.revoked)
}

// Asked returns what every token request whose app JWT verified asked for, oldest first.
func (s *Server) Asked() []Asked {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.asked)
}

// Seen returns "METHOD PATH AUTH" for every request, AUTH being bearer, basic, or none.
func (s *Server) Seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.log)
}

// Scope returns what a token may reach (nil repos: all of the installation's).
func (s *Server) Scope(tok string) (repos []string, perms map[string]string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	it, ok := s.tokens[tok]
	if !ok {
		return nil, nil, false
	}
	return slices.Clone(it.repos), it.perms, true
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Date", s.opts.Now().UTC().Format(http.TimeFormat))
	kind := "none"
	if _, _, ok := r.BasicAuth(); ok {
		kind = "basic"
	} else if strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") {
		kind = "bearer"
	}
	s.mu.Lock()
	s.log = append(s.log, r.Method+" "+r.URL.Path+" "+kind)
	s.mu.Unlock()

	tokensPath := "/app/installations/" + strconv.FormatInt(s.opts.InstallationID, 10) + "/access_tokens"
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")
	switch {
	case r.Method == http.MethodPost && r.URL.Path == tokensPath:
		s.mint(w, r)
	case r.Method == http.MethodDelete && r.URL.Path == "/installation/token":
		s.revoke(w, r)
	case len(parts) >= 3 && strings.HasSuffix(parts[1], ".git"):
		s.gitRequest(w, r, parts[0], strings.TrimSuffix(parts[1], ".git"))
	case r.Method == http.MethodGet && len(parts) == 3 && parts[0] == "repos":
		if _, ok := s.authorize(w, r, false, parts[1], parts[2], "metadata", "read"); ok {
			writeJSON(w, http.StatusOK, map[string]any{"name": parts[2], "full_name": parts[1] + "/" + parts[2]})
		}
	case r.Method == http.MethodPost && len(parts) == 4 && parts[0] == "repos" && parts[3] == "issues":
		if _, ok := s.authorize(w, r, false, parts[1], parts[2], "issues", "write"); ok {
			writeJSON(w, http.StatusCreated, map[string]any{"number": 1, "state": "open"})
		}
	case r.Method == http.MethodGet && r.URL.Path == "/echo/authorization":
		// A careless upstream that echoes the credential: the broker must scrub it.
		writeJSON(w, http.StatusOK, map[string]any{"authorization": r.Header.Get("Authorization")})
	default:
		writeJSON(w, http.StatusNotFound, map[string]any{"message": "Not Found"})
	}
}

// bearer returns the token of an API request (Bearer or token scheme) or a git request
// (Basic auth password).
func bearer(r *http.Request) string {
	if _, p, ok := r.BasicAuth(); ok {
		return p
	}
	h := r.Header.Get("Authorization")
	for _, p := range []string{"Bearer ", "token "} {
		if strings.HasPrefix(h, p) {
			return strings.TrimPrefix(h, p)
		}
	}
	return ""
}

// authorize answers the refusal itself and reports false when the request's token may not
// use perm at level on owner/repo.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request, git bool, owner, repo, perm, level string) (*issued, bool) {
	tok := bearer(r)
	if _, p, ok := r.BasicAuth(); git {
		tok = p // git over HTTPS authenticates with Basic only, as at GitHub
		if !ok {
			tok = ""
		}
	}
	s.mu.Lock()
	it := s.tokens[tok]
	s.mu.Unlock()
	if it == nil || it.revoked || !s.opts.Now().Before(it.expires) {
		w.Header().Set("WWW-Authenticate", `Basic realm="GitHub"`)
		writeJSON(w, http.StatusUnauthorized, map[string]any{"message": "Bad credentials"})
		return nil, false
	}
	inInstallation := owner == s.opts.Owner && slices.Contains(s.opts.Repos, repo)
	if !inInstallation || (it.repos != nil && !slices.Contains(it.repos, repo)) {
		writeJSON(w, http.StatusNotFound, map[string]any{"message": "Not Found"})
		return nil, false
	}
	if levels[it.perms[perm]] < levels[level] {
		writeJSON(w, http.StatusForbidden, map[string]any{"message": "Resource not accessible by integration"})
		return nil, false
	}
	return it, true
}

func (s *Server) gitRequest(w http.ResponseWriter, r *http.Request, owner, repo string) {
	if s.git == nil {
		http.NotFound(w, r)
		return
	}
	service := r.URL.Query().Get("service")
	if strings.HasSuffix(r.URL.Path, "/info/refs") && service == "" {
		http.Error(w, "dumb HTTP is not served", http.StatusForbidden)
		return
	}
	level := "read"
	if service == "git-receive-pack" || strings.HasSuffix(r.URL.Path, "/git-receive-pack") {
		level = "write"
	}
	if _, ok := s.authorize(w, r, true, owner, repo, "contents", level); !ok {
		return
	}
	s.git.ServeHTTP(w, r)
}

func (s *Server) mint(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.mints++
	hold, fault := s.hold, s.fault
	s.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
	}
	if err := s.verifyJWT(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")); err != nil {
		s.mu.Lock()
		s.jwtFails++
		s.mu.Unlock()
		writeJSON(w, http.StatusUnauthorized, map[string]any{"message": "A JSON web token could not be decoded: " + err.Error()})
		return
	}
	var req struct {
		Repositories []string          `json:"repositories"`
		Permissions  map[string]string `json:"permissions"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"message": "Problems parsing JSON"})
		return
	}
	s.mu.Lock()
	s.asked = append(s.asked, Asked{Repositories: slices.Clone(req.Repositories), Permissions: maps.Clone(req.Permissions)})
	s.mu.Unlock()
	for _, name := range req.Repositories {
		if !slices.Contains(s.opts.Repos, name) {
			writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"message": "There is at least one repository that does not exist or is not accessible to the parent installation."})
			return
		}
	}
	perms := map[string]string{}
	for k, v := range s.opts.Permissions {
		perms[k] = v
	}
	if req.Permissions != nil {
		perms = map[string]string{"metadata": "read"}
		for k, v := range req.Permissions {
			if levels[v] == 0 || levels[v] > levels[s.opts.Permissions[k]] {
				writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"message": "The permissions requested are not granted to this installation."})
				return
			}
			perms[k] = v
		}
	}
	switch fault {
	case Down:
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"message": "unavailable"})
		return
	case BadSecret:
		writeJSON(w, http.StatusInternalServerError, map[string]any{"message": BodyCanary})
		return
	case Garbage:
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("<html>" + BodyCanary + "</html>"))
		return
	}
	tok := "ghs_" + randHex(18)
	it := &issued{repos: req.Repositories, perms: perms, expires: s.opts.Now().Add(s.opts.TTL).Truncate(time.Second)}
	ans := map[string]any{"token": tok, "expires_at": it.expires.UTC().Format(time.RFC3339), "permissions": perms}
	selection := "all"
	if req.Repositories != nil {
		selection = "selected"
		var rs []map[string]any
		for _, n := range req.Repositories {
			rs = append(rs, map[string]any{"name": n, "full_name": s.opts.Owner + "/" + n})
		}
		ans["repositories"] = rs
	}
	ans["repository_selection"] = selection
	switch fault {
	case NoToken:
		delete(ans, "token")
	case Expired:
		ans["expires_at"] = s.opts.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	case Wider:
		wide := map[string]string{}
		for k, v := range s.opts.Permissions {
			wide[k] = v
		}
		ans["permissions"] = wide
		ans["repository_selection"] = "all"
		it.perms, it.repos = wide, nil
	}
	s.mu.Lock()
	s.tokens[tok] = it
	s.order = append(s.order, tok)
	s.mu.Unlock()
	writeJSON(w, http.StatusCreated, ans)
}

func (s *Server) verifyJWT(raw string) error {
	claims := jwt.MapClaims{}
	_, err := jwt.ParseWithClaims(raw, claims, func(*jwt.Token) (any, error) { return s.opts.PublicKey, nil },
		jwt.WithValidMethods([]string{"RS256"}), jwt.WithTimeFunc(s.opts.Now), jwt.WithIssuedAt(), jwt.WithExpirationRequired())
	if err != nil {
		return err
	}
	if fmt.Sprint(claims["iss"]) != s.opts.AppID {
		return fmt.Errorf("iss is not the app")
	}
	exp, _ := claims.GetExpirationTime()
	iat, _ := claims.GetIssuedAt()
	if iat == nil || exp.Sub(s.opts.Now()) > 10*time.Minute || exp.Sub(iat.Time) > 10*time.Minute+time.Second {
		return fmt.Errorf("'Expiration time' claim ('exp') is too far in the future")
	}
	return nil
}

func (s *Server) revoke(w http.ResponseWriter, r *http.Request) {
	tok := bearer(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	it := s.tokens[tok]
	if it == nil || it.revoked || !s.opts.Now().Before(it.expires) {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	it.revoked = true
	s.revoked = append(s.revoked, tok)
	w.WriteHeader(http.StatusNoContent)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
