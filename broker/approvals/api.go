package approvals

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"
)

// SessionCookie is the console's session cookie.
const SessionCookie = "capbroker_session"

// Session limits.
const (
	sessionTTL  = 12 * time.Hour
	maxSessions = 1024
	maxAPIBody  = 64 << 10
)

// APIOptions configure the admin API.
type APIOptions struct {
	Queue *Queue
	// Token is the admin bearer token; "" for none.
	Token string
	// MTLS: the admin listener requires client certificates (the name is the CN).
	MTLS bool
	// Status returns the policy revision and the /readyz body.
	Status func() (revision string, ready map[string]any)
	// Origins are more origins (scheme://host[:port]) that may send approvals, besides the
	// admin listener's own: the console's public URL when it is behind a reverse proxy.
	Origins []string
	Now     func() time.Time
}

// API serves /api/ on the admin listener.
type API struct {
	o    APIOptions
	mux  *http.ServeMux
	csrf string // the CSRF token when no authentication is configured (loopback only)
	// usageOf reports GET /api/usage (SetUsage).
	usageOf func(ctx context.Context) (any, error)

	mu       sync.Mutex
	sessions map[string]*session
	guesses  guesses
}

type session struct {
	user    string
	csrf    string
	expires time.Time
}

// identity is who is calling and how.
type identity struct {
	user string
	how  string // token, cert, cookie, local
	sess *session
}

// NewAPI builds the admin API handler.
func NewAPI(o APIOptions) *API {
	if o.Now == nil {
		o.Now = time.Now
	}
	a := &API{o: o, mux: http.NewServeMux(), csrf: randomHex(32), sessions: map[string]*session{}}
	a.mux.HandleFunc("POST /api/login", a.login)
	a.mux.HandleFunc("POST /api/logout", a.authed(a.logout))
	a.mux.HandleFunc("GET /api/session", a.authed(a.session))
	a.mux.HandleFunc("GET /api/status", a.authed(a.status))
	a.mux.HandleFunc("GET /api/approvals", a.authed(a.pending))
	a.mux.HandleFunc("POST /api/approvals/{id}/approve", a.authed(a.approve))
	a.mux.HandleFunc("POST /api/approvals/{id}/deny", a.authed(a.deny))
	a.mux.HandleFunc("GET /api/grants", a.authed(a.grants))
	a.mux.HandleFunc("DELETE /api/grants/{id}", a.authed(a.revoke))
	a.mux.HandleFunc("GET /api/events", a.authed(a.events))
	a.mux.HandleFunc("GET /api/usage", a.authed(a.usage))
	a.mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		apiError(w, http.StatusNotFound, "not_found", "no such API endpoint")
	})
	return a
}

// SetUsage sets the function GET /api/usage reports from (the budgets' counters). Call
// before serving; without it the endpoint answers an empty list.
func (a *API) SetUsage(f func(ctx context.Context) (any, error)) { a.usageOf = f }

func (a *API) usage(w http.ResponseWriter, r *http.Request, _ *identity) {
	var u any = []any{}
	if a.usageOf != nil {
		var err error
		if u, err = a.usageOf(r.Context()); err != nil {
			apiError(w, http.StatusServiceUnavailable, "usage_unavailable", err.Error())
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"usage": u})
}

// SetStatus sets the function GET /api/status reports from. Call before serving.
func (a *API) SetStatus(f func() (revision string, ready map[string]any)) { a.o.Status = f }

func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if !a.sameOrigin(w, r) {
		return
	}
	if !a.authConfigured() && !loopbackHost(r.Host) {
		// Without authentication the API answers loopback names only: a page whose DNS name
		// was rebound to 127.0.0.1 must not drive it.
		apiError(w, http.StatusForbidden, "forbidden", "without admin authentication the API answers requests to a loopback address only")
		return
	}
	a.mux.ServeHTTP(w, r)
}

func (a *API) authConfigured() bool { return a.o.Token != "" || a.o.MTLS }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

func apiError(w http.ResponseWriter, status int, code, reason string) {
	writeJSON(w, status, map[string]string{"error": code, "reason": reason})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// authenticate says who is calling, or nil.
func (a *API) authenticate(r *http.Request) *identity {
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 && a.o.MTLS {
		name := r.TLS.PeerCertificates[0].Subject.CommonName
		if name == "" {
			name = "client-certificate"
		}
		if s := a.cookieSession(r); s != nil {
			return &identity{user: s.user, how: "cookie", sess: s}
		}
		return &identity{user: name, how: "cert"}
	}
	if auth := r.Header.Get("Authorization"); auth != "" {
		tok, ok := strings.CutPrefix(auth, "Bearer ")
		if ok && a.o.Token != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(a.o.Token)) == 1 {
			return &identity{user: "token", how: "token"}
		}
		return nil
	}
	if s := a.cookieSession(r); s != nil {
		return &identity{user: s.user, how: "cookie", sess: s}
	}
	if !a.authConfigured() {
		return &identity{user: "local", how: "local"}
	}
	return nil
}

func (a *API) cookieSession(r *http.Request) *session {
	c, err := r.Cookie(SessionCookie)
	if err != nil || c.Value == "" {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.sessions[c.Value]
	if s == nil {
		return nil
	}
	if !a.o.Now().Before(s.expires) {
		delete(a.sessions, c.Value)
		return nil
	}
	return s
}

// ownOrigin is the origin the admin listener was addressed by.
func ownOrigin(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// requestOrigin is the request's Origin, or the origin of its Referer; "" when neither.
func requestOrigin(r *http.Request) string {
	if o := r.Header.Get("Origin"); o != "" {
		return o
	}
	if ref := r.Header.Get("Referer"); ref != "" {
		u, err := url.Parse(ref)
		if err != nil || u.Host == "" {
			return "null"
		}
		return u.Scheme + "://" + u.Host
	}
	return ""
}

func (a *API) originAllowed(origin string, r *http.Request) bool {
	if strings.EqualFold(origin, ownOrigin(r)) {
		return true
	}
	for _, o := range a.o.Origins {
		if strings.EqualFold(origin, o) {
			return true
		}
	}
	return false
}

// sameOrigin refuses, on every API route, a request a page of another origin made a browser
// send: one whose Origin (or, without one, Referer) is neither the admin listener's own nor
// one of Origins, or, with neither header, one the browser marks as cross-site
// (Sec-Fetch-Site). A read is refused too: what is held, and for whom, is not another site's
// to read. Clients that are not browsers send none of these headers.
func (a *API) sameOrigin(w http.ResponseWriter, r *http.Request) bool {
	origin := requestOrigin(r)
	switch {
	case origin != "" && !a.originAllowed(origin, r):
		apiError(w, http.StatusForbidden, "csrf", fmt.Sprintf("requests from origin %q are refused: the admin API answers its own origin (and approvals.console_url) only", origin))
		return false
	case origin == "" && crossSite(r.Header.Get("Sec-Fetch-Site")):
		apiError(w, http.StatusForbidden, "csrf", "requests a browser marks as cross-site (Sec-Fetch-Site) are refused: the admin API answers its own origin only")
		return false
	}
	return true
}

func crossSite(fetchSite string) bool {
	return strings.EqualFold(fetchSite, "cross-site") || strings.EqualFold(fetchSite, "same-site")
}

// checkCSRF refuses a state-changing request a browser may have been made to send by another
// site (a foreign Origin is refused before, by sameOrigin): with cookie (or no)
// authentication, one without the session's X-CSRF-Token, or (cookie) without an Origin or
// Referer of our own.
func (a *API) checkCSRF(w http.ResponseWriter, r *http.Request, id *identity) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	origin := requestOrigin(r)
	var want string
	switch id.how {
	case "cookie":
		if origin == "" {
			apiError(w, http.StatusForbidden, "csrf", "a request with a session cookie must carry an Origin or Referer header")
			return false
		}
		want = id.sess.csrf
	case "local":
		want = a.csrf
	default:
		return true // bearer token or client certificate: not sent by a browser on its own
	}
	got := r.Header.Get("X-CSRF-Token")
	if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		apiError(w, http.StatusForbidden, "csrf", "missing or wrong X-CSRF-Token header (GET /api/session gives it)")
		return false
	}
	return true
}

func (a *API) authed(h func(http.ResponseWriter, *http.Request, *identity)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		bearer := r.Header.Get("Authorization") != ""
		if bearer && a.throttled(w, r) {
			return
		}
		id := a.authenticate(r)
		if id == nil {
			if bearer {
				a.guessed(r)
			}
			apiError(w, http.StatusUnauthorized, "unauthorized", "log in (POST /api/login), or send Authorization: Bearer <admin token>")
			return
		}
		if !a.checkCSRF(w, r, id) {
			return
		}
		h(w, r, id)
	}
}

func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAPIBody))
	if err != nil {
		apiError(w, http.StatusBadRequest, "bad_request", "the request body could not be read")
		return false
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return true
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		apiError(w, http.StatusBadRequest, "bad_request", "the body is not the expected JSON: "+err.Error())
		return false
	}
	return true
}

func (a *API) login(w http.ResponseWriter, r *http.Request) {
	if a.throttled(w, r) {
		return
	}
	var body struct {
		Token string `json:"token"`
	}
	if !decodeBody(w, r, &body) {
		return
	}
	var user string
	switch {
	case a.o.MTLS && r.TLS != nil && len(r.TLS.PeerCertificates) > 0:
		user = r.TLS.PeerCertificates[0].Subject.CommonName
	case a.o.Token != "":
		if subtle.ConstantTimeCompare([]byte(body.Token), []byte(a.o.Token)) != 1 {
			a.guessed(r)
			apiError(w, http.StatusUnauthorized, "unauthorized", "wrong admin token")
			return
		}
		user = "token"
	default:
		user = "local"
	}
	s := &session{user: user, csrf: randomHex(32), expires: a.o.Now().Add(sessionTTL)}
	key := randomHex(32)
	a.mu.Lock()
	if len(a.sessions) >= maxSessions {
		now := a.o.Now()
		for k, old := range a.sessions {
			if !now.Before(old.expires) || len(a.sessions) >= maxSessions {
				delete(a.sessions, k)
			}
		}
	}
	a.sessions[key] = s
	a.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: key, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil, MaxAge: int(sessionTTL / time.Second)})
	writeJSON(w, http.StatusOK, map[string]string{"user": user, "csrf": s.csrf})
}

func (a *API) logout(w http.ResponseWriter, r *http.Request, id *identity) {
	if c, err := r.Cookie(SessionCookie); err == nil {
		a.mu.Lock()
		delete(a.sessions, c.Value)
		a.mu.Unlock()
	}
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: "", Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, MaxAge: -1})
	writeJSON(w, http.StatusOK, map[string]any{})
}

func (a *API) session(w http.ResponseWriter, _ *http.Request, id *identity) {
	csrf := ""
	switch id.how {
	case "cookie":
		csrf = id.sess.csrf
	case "local":
		csrf = a.csrf
	}
	writeJSON(w, http.StatusOK, map[string]string{"user": id.user, "csrf": csrf})
}

func (a *API) status(w http.ResponseWriter, _ *http.Request, id *identity) {
	rev, ready := "", map[string]any{}
	if a.o.Status != nil {
		rev, ready = a.o.Status()
	}
	writeJSON(w, http.StatusOK, map[string]any{"policy_revision": rev, "ready": ready, "user": id.user})
}

func (a *API) pending(w http.ResponseWriter, _ *http.Request, _ *identity) {
	writeJSON(w, http.StatusOK, map[string]any{"pending": a.o.Queue.Pending(), "recent": a.o.Queue.Recent()})
}

func (a *API) approve(w http.ResponseWriter, r *http.Request, id *identity) {
	var body struct {
		Scope      string `json:"scope"`
		Duration   string `json:"duration"`
		Method     string `json:"method"`
		PathPrefix string `json:"path_prefix"`
		Comment    string `json:"comment"`
	}
	if !decodeBody(w, r, &body) {
		return
	}
	ap := Approval{By: id.user, Scope: body.Scope, Method: body.Method, PathPrefix: body.PathPrefix, Comment: body.Comment}
	if body.Duration != "" {
		d, err := time.ParseDuration(body.Duration)
		if err != nil || d <= 0 {
			apiError(w, http.StatusBadRequest, "bad_request", "duration must be a positive duration such as 30m")
			return
		}
		ap.Duration = d
	}
	g, err := a.o.Queue.Approve(r.PathValue("id"), ap)
	if err != nil {
		queueError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"grant": g})
}

func (a *API) deny(w http.ResponseWriter, r *http.Request, id *identity) {
	var body struct {
		Comment string `json:"comment"`
	}
	if !decodeBody(w, r, &body) {
		return
	}
	if err := a.o.Queue.Deny(r.PathValue("id"), id.user, body.Comment); err != nil {
		queueError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{})
}

func (a *API) grants(w http.ResponseWriter, _ *http.Request, _ *identity) {
	writeJSON(w, http.StatusOK, map[string]any{"grants": a.o.Queue.Grants()})
}

func (a *API) revoke(w http.ResponseWriter, r *http.Request, id *identity) {
	if err := a.o.Queue.Revoke(r.PathValue("id"), id.user); err != nil {
		queueError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{})
}

func queueError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, ErrNotFound):
		apiError(w, http.StatusNotFound, "not_found", "no such pending request or grant (it may have been decided, timed out or been withdrawn)")
	case errors.Is(err, ErrScope):
		apiError(w, http.StatusConflict, "scope_not_offered", err.Error())
	case errors.Is(err, ErrBadRequest):
		apiError(w, http.StatusBadRequest, "bad_request", err.Error())
	default:
		apiError(w, http.StatusInternalServerError, "internal_error", err.Error())
	}
}

// events streams decisions and approval changes as server-sent events. The stream's buffer is
// its own (SubscriberBuffer events): a reader that falls behind loses events, and is told how
// many ("dropped"), while the broker goes on.
func (a *API) events(w http.ResponseWriter, r *http.Request, _ *identity) {
	fl, ok := w.(http.Flusher)
	if !ok {
		apiError(w, http.StatusInternalServerError, "internal_error", "streaming unsupported")
		return
	}
	sub := a.o.Queue.Events.Subscribe(SubscriberBuffer)
	defer a.o.Queue.Events.Unsubscribe(sub)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, ": capbroker events\n\n")
	// The decisions made before, then the live ones: subscribed first, so that none falls
	// between; one made in between comes twice (the console keeps one per request_id).
	for _, ev := range a.o.Queue.Events.Recent() {
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev.Name, ev.Data)
	}
	fl.Flush()
	ping := time.NewTicker(15 * time.Second)
	defer ping.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-ping.C:
			if _, err := io.WriteString(w, ": ping\n\n"); err != nil {
				return
			}
		case ev := <-sub.C:
			if n := sub.Dropped(); n > 0 {
				fmt.Fprintf(w, "event: dropped\ndata: {\"count\":%d}\n\n", n)
			}
			if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev.Name, ev.Data); err != nil {
				return
			}
			// Write whatever else is waiting before flushing: one flush per burst.
		drain:
			for i := 0; i < 256; i++ {
				select {
				case ev = <-sub.C:
					fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev.Name, ev.Data)
				default:
					break drain
				}
			}
		}
		fl.Flush()
	}
}
