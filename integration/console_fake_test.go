package integration

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capbroker/capbroker/broker/console"
)

// fakeAdmin is a small stand-in for the broker's admin API (/work/wt/I21-API.md), with the
// console mounted: the browser tests of what the console does on its own (a flood of
// decisions, a dropped notice) run against it, where the real broker cannot be made to
// produce them on cue. It keeps to the API's names, auth and CSRF rules.
type fakeAdmin struct {
	srv   *httptest.Server
	token string

	mu       sync.Mutex
	sessions map[string]string // cookie value -> csrf token
	pending  map[string]map[string]any
	answers  map[string]chan agentResult // pending id -> the held agent's answer
	grants   map[string]map[string]any
	subs     map[chan string]struct{}
	seq      int
}

func newFakeAdmin(t *testing.T) *fakeAdmin {
	t.Helper()
	f := &fakeAdmin{token: randHex(16), sessions: map[string]string{}, pending: map[string]map[string]any{},
		answers: map[string]chan agentResult{}, grants: map[string]map[string]any{}, subs: map[chan string]struct{}{}}
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
		f.mu.Lock()
		list := []map[string]any{}
		for _, p := range f.pending {
			list = append(list, p)
		}
		f.mu.Unlock()
		writeJSONFake(w, 200, map[string]any{"pending": list})
	}))
	mux.HandleFunc("GET /api/grants", f.auth(func(w http.ResponseWriter, r *http.Request, _ string) {
		f.mu.Lock()
		list := []map[string]any{}
		for _, g := range f.grants {
			list = append(list, g)
		}
		f.mu.Unlock()
		writeJSONFake(w, 200, map[string]any{"grants": list})
	}))
	mux.HandleFunc("DELETE /api/grants/{id}", f.auth(func(w http.ResponseWriter, r *http.Request, _ string) {
		f.mu.Lock()
		_, ok := f.grants[r.PathValue("id")]
		delete(f.grants, r.PathValue("id"))
		f.mu.Unlock()
		if !ok {
			writeJSONFake(w, 404, map[string]any{"error": "not_found", "reason": "no such grant"})
			return
		}
		f.send("grant", map[string]any{"id": r.PathValue("id"), "state": "revoked"})
		writeJSONFake(w, 200, map[string]any{})
	}))
	mux.HandleFunc("POST /api/approvals/{id}/{action}", f.auth(func(w http.ResponseWriter, r *http.Request, user string) {
		var body struct {
			Scope, Duration, Method, Comment string
			PathPrefix                       string `json:"path_prefix"`
		}
		_ = json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body)
		id, action := r.PathValue("id"), r.PathValue("action")
		f.mu.Lock()
		p, ok := f.pending[id]
		answer := f.answers[id]
		delete(f.pending, id)
		delete(f.answers, id)
		var grant map[string]any
		if ok && action == "approve" && body.Scope != "once" {
			d, _ := time.ParseDuration(body.Duration)
			switch body.Method {
			case "":
				body.Method = p["method"].(string)
			case "*":
				body.Method = ""
			}
			f.seq++
			grant = map[string]any{"id": fmt.Sprintf("gr-%d", f.seq), "agent": p["agent"], "method": body.Method,
				"host": p["host"], "path_prefix": body.PathPrefix, "expires": time.Now().Add(d).UTC().Format(time.RFC3339),
				"created_by": "admin", "comment": body.Comment, "kind": body.Scope}
			f.grants[grant["id"].(string)] = grant
		}
		f.mu.Unlock()
		if !ok || (action != "approve" && action != "deny") {
			writeJSONFake(w, 404, map[string]any{"error": "not_found", "reason": "no such pending approval"})
			return
		}
		if answer != nil {
			if action == "approve" {
				answer <- agentResult{status: 200, body: "path=" + p["path"].(string)}
			} else {
				answer <- agentResult{status: 403, body: `{"error":"denied_by_approver","reason":"denied by admin: ` + body.Comment + `"}`}
			}
		}
		f.send("approval", map[string]any{"id": id, "state": action + "d"})
		if grant != nil {
			f.send("grant", map[string]any{"id": grant["id"], "state": "added"})
		}
		writeJSONFake(w, 200, map[string]any{"grant": grant})
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

func (f *fakeAdmin) subscribers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.subs)
}

// hold adds a pending approval as the broker would show it.
func (f *fakeAdmin) hold(agent, method, path string, headers map[string]string, body string) string {
	f.mu.Lock()
	f.seq++
	id := fmt.Sprintf("ap-%d", f.seq)
	now := time.Now().UTC()
	f.pending[id] = map[string]any{"id": id, "agent": agent, "source_ip": "127.0.0.1", "phase": "request",
		"method": method, "scheme": "https", "host": "api.example.test", "port": 443, "path": path,
		"query_keys": []string{}, "headers": headers, "body_preview": body, "body_size": len(body),
		"reason":  "the policy asks a person for " + method + " " + strings.SplitN(path, "?", 2)[0],
		"created": now.Format(time.RFC3339), "expires": now.Add(2 * time.Minute).Format(time.RFC3339),
		"scopes": []string{"once", "agent", "always"}}
	f.mu.Unlock()
	f.send("approval", map[string]any{"id": id, "state": "pending"})
	return id
}

// request is the agent's request through the fake "broker": a path under /held/ is held
// until approved, denied or timed out (timeout), unless a grant covers it; the rest is
// allowed. Each answer is also a decision event.
func (f *fakeAdmin) request(method, path string, headers map[string]string, body string, timeout time.Duration) <-chan agentResult {
	out := make(chan agentResult, 1)
	decide := func(r agentResult, decision, reason string, approval map[string]any) {
		ev := map[string]any{"time": time.Now().UTC().Format(time.RFC3339), "msg": "decision", "agent": agentID,
			"phase": "request", "method": method, "scheme": "https", "host": "api.example.test", "port": 443,
			"path": path, "decision": decision, "reason": reason, "credentials": []string{"canary"}, "status": r.status}
		if approval != nil {
			ev["approval"] = approval
		}
		f.send("decision", ev)
		out <- r
	}
	if strings.HasPrefix(path, "/denied/") {
		decide(agentResult{status: 403, body: `{"error":"denied"}`}, "deny", "not allowed by the test policy", nil)
		return out
	}
	if !strings.HasPrefix(path, "/held/") {
		decide(agentResult{status: 200, body: "path=" + path}, "allow", "", nil)
		return out
	}
	f.mu.Lock()
	for _, g := range f.grants {
		if g["agent"] == agentID && (g["method"] == "" || g["method"] == method) && strings.HasPrefix(path, g["path_prefix"].(string)) {
			f.mu.Unlock()
			decide(agentResult{status: 200, body: "path=" + path}, "allow", "", map[string]any{"outcome": "granted", "by": g["created_by"], "grant": g["id"]})
			return out
		}
	}
	f.mu.Unlock()
	id := f.hold(agentID, method, path, headers, body)
	answer := make(chan agentResult, 1)
	f.mu.Lock()
	f.answers[id] = answer
	f.pending[id]["expires"] = time.Now().Add(timeout).UTC().Format(time.RFC3339)
	f.mu.Unlock()
	go func() {
		select {
		case r := <-answer:
			decision, outcome := "allow", "approved"
			if r.status != 200 {
				decision, outcome = "deny", "denied"
			}
			decide(r, decision, "asked a person", map[string]any{"id": id, "outcome": outcome, "by": "admin", "scope": "once"})
		case <-time.After(timeout):
			f.mu.Lock()
			_, still := f.pending[id]
			delete(f.pending, id)
			delete(f.answers, id)
			f.mu.Unlock()
			if !still { // answered just now
				decide(<-answer, "allow", "asked a person", map[string]any{"id": id, "outcome": "approved", "by": "admin", "scope": "once"})
				return
			}
			f.send("approval", map[string]any{"id": id, "state": "timeout"})
			decide(agentResult{status: 403, body: `{"error":"approval_timeout","reason":"nobody decided in time"}`}, "deny", "approval_timeout", map[string]any{"id": id, "outcome": "timeout"})
		}
	}()
	return out
}
