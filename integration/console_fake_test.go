package integration

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/capbroker/capbroker/broker/console"
)

// fakeAdmin is a small stand-in for the broker's admin API (docs/approvals.md) with the
// console mounted, sending the events a test asks for: a flood of decisions faster than any
// agent makes them, a "dropped" notice, neither of which the real broker produces on cue.
// It keeps to the API's names, and to its auth and CSRF rules.
type fakeAdmin struct {
	srv   *httptest.Server
	token string

	mu       sync.Mutex
	sessions map[string]string // cookie value -> csrf token
	subs     map[chan string]struct{}
}

func newFakeAdmin(t *testing.T) *fakeAdmin {
	t.Helper()
	f := &fakeAdmin{token: randHex(16), sessions: map[string]string{}, subs: map[chan string]struct{}{}}
	mux := http.NewServeMux()
	mux.Handle("/console", console.Handler())
	mux.Handle("/console/", console.Handler())
	mux.HandleFunc("POST /api/login", f.login)
	mux.HandleFunc("POST /api/logout", f.auth(func(w http.ResponseWriter, r *http.Request, _ string) {
		if c, err := r.Cookie("capbroker_session"); err == nil {
			f.mu.Lock()
			delete(f.sessions, c.Value)
			f.mu.Unlock()
		}
		writeJSONFake(w, 200, map[string]any{})
	}))
	mux.HandleFunc("GET /api/session", f.auth(func(w http.ResponseWriter, r *http.Request, csrf string) {
		writeJSONFake(w, 200, map[string]any{"user": "admin", "csrf": csrf})
	}))
	mux.HandleFunc("GET /api/status", f.auth(func(w http.ResponseWriter, r *http.Request, _ string) {
		writeJSONFake(w, 200, map[string]any{"policy_revision": "fake-rev-1", "user": "admin",
			"ready": map[string]any{"status": "ready", "credentials_ready": []string{"canary"}}})
	}))
	mux.HandleFunc("GET /api/approvals", f.auth(func(w http.ResponseWriter, r *http.Request, _ string) {
		writeJSONFake(w, 200, map[string]any{"pending": []any{}})
	}))
	mux.HandleFunc("GET /api/grants", f.auth(func(w http.ResponseWriter, r *http.Request, _ string) {
		writeJSONFake(w, 200, map[string]any{"grants": []any{}})
	}))
	mux.HandleFunc("GET /api/events", f.auth(f.events))
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func writeJSONFake(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (f *fakeAdmin) login(w http.ResponseWriter, r *http.Request) {
	var body struct{ Token string }
	if json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&body) != nil ||
		subtle.ConstantTimeCompare([]byte(body.Token), []byte(f.token)) != 1 {
		writeJSONFake(w, 401, map[string]any{"error": "unauthorized", "reason": "token refused"})
		return
	}
	sid, csrf := randHex(16), randHex(16)
	f.mu.Lock()
	f.sessions[sid] = csrf
	f.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: "capbroker_session", Value: sid, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	writeJSONFake(w, 200, map[string]any{"csrf": csrf})
}

// auth admits a session cookie (with the CSRF token and a same Origin on POST/DELETE) or
// the bearer token.
func (f *fakeAdmin) auth(h func(w http.ResponseWriter, r *http.Request, csrf string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if o := r.Header.Get("Origin"); o != "" && o != "http://"+r.Host {
			writeJSONFake(w, 403, map[string]any{"error": "csrf", "reason": "foreign origin"})
			return
		}
		if r.Header.Get("Authorization") == "Bearer "+f.token {
			h(w, r, "")
			return
		}
		c, err := r.Cookie("capbroker_session")
		f.mu.Lock()
		csrf, ok := "", false
		if err == nil {
			csrf, ok = f.sessions[c.Value]
		}
		f.mu.Unlock()
		if !ok {
			writeJSONFake(w, 401, map[string]any{"error": "unauthorized", "reason": "log in"})
			return
		}
		if r.Method != http.MethodGet && (r.Header.Get("Origin") == "" || r.Header.Get("X-CSRF-Token") != csrf) {
			writeJSONFake(w, 403, map[string]any{"error": "csrf", "reason": "missing CSRF token"})
			return
		}
		h(w, r, csrf)
	}
}

func (f *fakeAdmin) events(w http.ResponseWriter, r *http.Request, _ string) {
	ch := make(chan string, 4096)
	f.mu.Lock()
	f.subs[ch] = struct{}{}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.subs, ch)
		f.mu.Unlock()
	}()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(200)
	w.(http.Flusher).Flush()
	for {
		select {
		case <-r.Context().Done():
			return
		case m := <-ch:
			_, _ = io.WriteString(w, m)
			for more := true; more; {
				select {
				case m := <-ch:
					_, _ = io.WriteString(w, m)
				default:
					more = false
				}
			}
			w.(http.Flusher).Flush()
		}
	}
}

// send broadcasts one event to every subscriber; it blocks (the fake has no drop policy: the
// tests send what they expect the page to receive).
func (f *fakeAdmin) send(event string, data any) {
	b, _ := json.Marshal(data)
	msg := fmt.Sprintf("event: %s\ndata: %s\n\n", event, b)
	f.mu.Lock()
	subs := make([]chan string, 0, len(f.subs))
	for ch := range f.subs {
		subs = append(subs, ch)
	}
	f.mu.Unlock()
	for _, ch := range subs {
		ch <- msg
	}
}
