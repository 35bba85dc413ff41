package approvals

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

type apiClient struct {
	t   *testing.T
	srv *httptest.Server
}

func (c apiClient) do(method, path, body string, hdr map[string]string) (int, map[string]any, *http.Response) {
	c.t.Helper()
	req, _ := http.NewRequest(method, c.srv.URL+path, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.srv.Client().Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &out)
	return resp.StatusCode, out, resp
}

func newAPI(t *testing.T, token string) (*fixture, apiClient) {
	f := newFixture(t, Options{})
	api := NewAPI(APIOptions{Queue: f.q, Token: token, Status: func() (string, map[string]any) {
		return "rev-1", map[string]any{"status": "ready"}
	}})
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	return f, apiClient{t, srv}
}

func TestAPITokenAuthAndCSRF(t *testing.T) {
	f, c := newAPI(t, "s3cret-admin")
	own := c.srv.URL
	bearer := map[string]string{"Authorization": "Bearer s3cret-admin"}

	if code, _, _ := c.do("GET", "/api/approvals", "", nil); code != 401 {
		t.Fatalf("no auth: %d", code)
	}
	if code, _, _ := c.do("GET", "/api/approvals", "", map[string]string{"Authorization": "Bearer wrong"}); code != 401 {
		t.Fatalf("wrong token: %d", code)
	}
	code, body, _ := c.do("GET", "/api/status", "", bearer)
	if code != 200 || body["policy_revision"] != "rev-1" || body["user"] != "token" {
		t.Fatalf("status: %d %v", code, body)
	}

	p, ch := hold(t, f.q, context.Background(), req("a1", "POST", "/x"))
	// A bearer call needs no CSRF token, but a foreign Origin is refused all the same.
	withOrigin := map[string]string{"Authorization": "Bearer s3cret-admin", "Origin": "https://evil.example"}
	if code, body, _ := c.do("POST", "/api/approvals/"+p.ID+"/approve", `{}`, withOrigin); code != 403 || body["error"] != "csrf" {
		t.Fatalf("foreign origin with bearer: %d %v", code, body)
	}

	// Browser login: a cookie and a CSRF token.
	if code, _, _ := c.do("POST", "/api/login", `{"token":"nope"}`, map[string]string{"Origin": own}); code != 401 {
		t.Fatalf("login with a wrong token: %d", code)
	}
	code, body, resp := c.do("POST", "/api/login", `{"token":"s3cret-admin"}`, map[string]string{"Origin": own})
	if code != 200 || body["csrf"] == "" {
		t.Fatalf("login: %d %v", code, body)
	}
	csrf := body["csrf"].(string)
	var cookie *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == SessionCookie {
			cookie = ck
		}
	}
	if cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode || cookie.Path != "/" {
		t.Fatalf("cookie: %+v", cookie)
	}
	ck := SessionCookie + "=" + cookie.Value
	code, body, _ = c.do("GET", "/api/session", "", map[string]string{"Cookie": ck})
	if code != 200 || body["csrf"] != csrf || body["user"] != "token" {
		t.Fatalf("session: %d %v", code, body)
	}
	approve := "/api/approvals/" + p.ID + "/approve"
	refused := map[string]map[string]string{
		"no csrf token":   {"Cookie": ck, "Origin": own},
		"wrong token":     {"Cookie": ck, "Origin": own, "X-CSRF-Token": "x" + csrf},
		"foreign origin":  {"Cookie": ck, "Origin": "http://evil.example", "X-CSRF-Token": csrf},
		"no origin":       {"Cookie": ck, "X-CSRF-Token": csrf},
		"foreign referer": {"Cookie": ck, "Referer": "http://evil.example/page", "X-CSRF-Token": csrf},
	}
	for name, h := range refused {
		if code, body, _ := c.do("POST", approve, `{"scope":"once"}`, h); code != 403 || body["error"] != "csrf" {
			t.Errorf("%s: %d %v", name, code, body)
		}
	}
	if len(f.q.Pending()) != 1 {
		t.Fatal("a refused approval approved")
	}
	code, body, _ = c.do("POST", approve, `{"scope":"agent","duration":"10m","comment":"fine"}`,
		map[string]string{"Cookie": ck, "Referer": own + "/console/", "X-CSRF-Token": csrf})
	if code != 200 || body["grant"] == nil {
		t.Fatalf("approve: %d %v", code, body)
	}
	if out := <-ch; out.State != StateApproved || out.By != "token" || out.Scope != ScopeAgent {
		t.Fatalf("outcome: %+v", out)
	}
	gid := body["grant"].(map[string]any)["id"].(string)
	code, body, _ = c.do("GET", "/api/grants", "", bearer)
	if gs := body["grants"].([]any); code != 200 || len(gs) != 1 {
		t.Fatalf("grants: %v", body)
	}
	if code, _, _ := c.do("DELETE", "/api/grants/"+gid, "", map[string]string{"Cookie": ck, "Origin": own}); code != 403 {
		t.Fatalf("revoke without csrf: %d", code)
	}
	if code, _, _ := c.do("DELETE", "/api/grants/"+gid, "", map[string]string{"Cookie": ck, "Origin": own, "X-CSRF-Token": csrf}); code != 200 {
		t.Fatalf("revoke: %d", code)
	}
	if code, body, _ := c.do("POST", approve, `{}`, bearer); code != 404 || body["error"] != "not_found" {
		t.Fatalf("approve a decided request: %d %v", code, body)
	}
	// Logging out ends the session.
	c.do("POST", "/api/logout", "", map[string]string{"Cookie": ck, "Origin": own, "X-CSRF-Token": csrf})
	if code, _, _ := c.do("GET", "/api/session", "", map[string]string{"Cookie": ck}); code != 401 {
		t.Fatalf("session after logout: %d", code)
	}
}

func TestAPIWithoutAuthIsLoopbackAndCSRFBound(t *testing.T) {
	f, c := newAPI(t, "")
	p, ch := hold(t, f.q, context.Background(), req("a1", "POST", "/x"))
	code, body, _ := c.do("GET", "/api/session", "", nil)
	if code != 200 || body["user"] != "local" || body["csrf"] == "" {
		t.Fatalf("session: %d %v", code, body)
	}
	csrf := body["csrf"].(string)
	deny := "/api/approvals/" + p.ID + "/deny"
	if code, _, _ := c.do("POST", deny, `{}`, nil); code != 403 {
		t.Fatalf("without the csrf token: %d", code)
	}
	// A name rebound to 127.0.0.1 by another site's DNS is not served.
	req, _ := http.NewRequest("GET", c.srv.URL+"/api/session", nil)
	req.Host = "evil.example:80"
	resp, err := c.srv.Client().Do(req)
	if err != nil || resp.StatusCode != 403 {
		t.Fatalf("rebound host: %v %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if code, _, _ := c.do("POST", deny, `{"comment":"no"}`, map[string]string{"X-CSRF-Token": csrf}); code != 200 {
		t.Fatalf("deny: %d", code)
	}
	if out := <-ch; out.State != StateDenied || out.By != "local" || out.Comment != "no" {
		t.Fatalf("outcome %+v", out)
	}
}

func TestAPIEventsStream(t *testing.T) {
	f, c := newAPI(t, "tok")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", c.srv.URL+"/api/events", nil)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := c.srv.Client().Do(req)
	if err != nil || resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events: %v %v", resp, err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if _, err := rd.ReadString('\n'); err != nil { // the opening comment: written once subscribed
		t.Fatal(err)
	}
	f.q.Events.AuditTap([]byte(`{"request_id":"r9","msg":"decision"}` + "\n"))
	var got []string
	for len(got) < 2 {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "event: ") || strings.HasPrefix(line, "data: ") {
			got = append(got, strings.TrimSpace(line))
		}
	}
	if got[0] != "event: decision" || got[1] != `data: {"request_id":"r9","msg":"decision"}` {
		t.Fatalf("stream: %q", got)
	}
}

// TestAPIRefusesForeignOriginOnEveryRoute: a page of another origin cannot read what is held
// (or anything else) through a visitor's browser, whatever the route and method.
func TestAPIRefusesForeignOriginOnEveryRoute(t *testing.T) {
	f, c := newAPI(t, "s3cret-admin")
	p, _ := hold(t, f.q, context.Background(), req("a1", "DELETE", "/v1/x"))
	bearer := "Bearer s3cret-admin"
	routes := []string{"GET /api/approvals", "GET /api/grants", "GET /api/status", "GET /api/session", "GET /api/events",
		"GET /api/usage", "POST /api/login", "POST /api/approvals/" + p.ID + "/approve", "DELETE /api/grants/x", "GET /api/nope"}
	foreign := map[string]map[string]string{
		"origin":           {"Origin": "https://evil.example"},
		"null origin":      {"Origin": "null"},
		"other port":       {"Origin": "http://127.0.0.1:1"},
		"referer":          {"Referer": "https://evil.example/x"},
		"fetch cross-site": {"Sec-Fetch-Site": "cross-site"},
		"fetch same-site":  {"Sec-Fetch-Site": "same-site"},
	}
	for _, route := range routes {
		method, path, _ := strings.Cut(route, " ")
		for name, h := range foreign {
			hdr := map[string]string{"Authorization": bearer}
			for k, v := range h {
				hdr[k] = v
			}
			if code, body, _ := c.do(method, path, `{"token":"s3cret-admin"}`, hdr); code != 403 || body["error"] != "csrf" {
				t.Errorf("%s, %s: %d %v", route, name, code, body)
			}
		}
	}
	// Its own origin, and no browser at all, are answered.
	for name, h := range map[string]map[string]string{
		"own origin": {"Origin": c.srv.URL, "Sec-Fetch-Site": "same-origin"},
		"no browser": {},
	} {
		h["Authorization"] = bearer
		if code, body, _ := c.do("GET", "/api/approvals", "", h); code != 200 || len(body["pending"].([]any)) != 1 {
			t.Errorf("%s: %d", name, code)
		}
	}
}

// TestAPIThrottlesTokenGuesses: after GuessBurst wrong tokens from one address, every attempt
// (the right token too) waits, by login or bearer; another address is not slowed.
func TestAPIThrottlesTokenGuesses(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	f := newFixture(t, Options{})
	api := NewAPI(APIOptions{Queue: f.q, Token: "s3cret-admin", Now: func() time.Time { return now }})
	do := func(remote, method, path, body, auth string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		r.RemoteAddr = remote
		if auth != "" {
			r.Header.Set("Authorization", "Bearer "+auth)
		}
		w := httptest.NewRecorder()
		api.ServeHTTP(w, r)
		return w
	}
	const guesser = "10.0.0.1:5000"
	for i := 0; i < GuessBurst; i++ {
		if w := do(guesser, "POST", "/api/login", `{"token":"guess"}`, ""); w.Code != 401 {
			t.Fatalf("guess %d: %d", i, w.Code)
		}
	}
	for name, w := range map[string]*httptest.ResponseRecorder{
		"login, wrong":  do(guesser, "POST", "/api/login", `{"token":"guess"}`, ""),
		"login, right":  do(guesser, "POST", "/api/login", `{"token":"s3cret-admin"}`, ""),
		"bearer, wrong": do(guesser, "GET", "/api/status", "", "guess"),
		"bearer, right": do(guesser, "GET", "/api/status", "", "s3cret-admin"),
	} {
		if w.Code != 429 || w.Header().Get("Retry-After") != "1" || !strings.Contains(w.Body.String(), "too_many_attempts") {
			t.Errorf("%s: %d %q %s", name, w.Code, w.Header().Get("Retry-After"), w.Body)
		}
	}
	if w := do("10.0.0.2:5000", "GET", "/api/status", "", "s3cret-admin"); w.Code != 200 {
		t.Fatalf("another address: %d", w.Code)
	}
	// The same /64 is one client; a second later, one more attempt is checked.
	for i := 0; i < GuessBurst; i++ {
		do(fmt.Sprintf("[2001:db8::%x]:1", i), "GET", "/api/status", "", "guess")
	}
	if w := do("[2001:db8::ffff]:1", "GET", "/api/status", "", "s3cret-admin"); w.Code != 429 {
		t.Fatalf("same /64: %d", w.Code)
	}
	now = now.Add(GuessInterval)
	if w := do(guesser, "GET", "/api/status", "", "s3cret-admin"); w.Code != 200 {
		t.Fatalf("after waiting: %d", w.Code)
	}
}

// TestAPIListsRecentlyDecided: GET /api/approvals lists, besides the pending requests, those
// decided before (newest first, with how and by whom, without the body preview): a console
// opened after a decision shows it, and an approver sees what the agent asked before.
func TestAPIListsRecentlyDecided(t *testing.T) {
	f, c := newAPI(t, "s3cret-admin")
	bearer := map[string]string{"Authorization": "Bearer s3cret-admin"}
	first := req("a1", "DELETE", "/repos/x")
	first.BodyPreview, first.BodySize = "the body", 8
	first.Headers, first.Query = map[string]string{"x-a": "1"}, map[string][]string{"force": {"true"}}
	p1, ch1 := hold(t, f.q, context.Background(), first)
	if err := f.q.Deny(p1.ID, "alice", "not today"); err != nil {
		t.Fatal(err)
	}
	<-ch1
	p2, ch2 := hold(t, f.q, context.Background(), req("a1", "GET", "/repos/y"))
	if _, err := f.q.Approve(p2.ID, Approval{By: "bob"}); err != nil {
		t.Fatal(err)
	}
	<-ch2
	p3, _ := hold(t, f.q, context.Background(), req("a2", "POST", "/z"))
	code, body, _ := c.do("GET", "/api/approvals", "", bearer)
	pending, _ := body["pending"].([]any)
	recent, _ := body["recent"].([]any)
	if code != 200 || len(pending) != 1 || pending[0].(map[string]any)["id"] != p3.ID || len(recent) != 2 {
		t.Fatalf("%d %v", code, body)
	}
	r0, r1 := recent[0].(map[string]any), recent[1].(map[string]any)
	if r0["id"] != p2.ID || r0["state"] != StateApproved || r0["by"] != "bob" || r0["scope"] != ScopeOnce || r0["path"] != "/repos/y" || r0["decided"] == "" {
		t.Errorf("newest: %v", r0)
	}
	if r1["id"] != p1.ID || r1["state"] != StateDenied || r1["by"] != "alice" || r1["comment"] != "not today" || r1["agent"] != "a1" ||
		r1["body_preview"] != "" || r1["body_size"] != float64(8) || r1["headers"] != nil || r1["query"] != nil {
		t.Errorf("older: %v", r1)
	}
	for i := 0; i < RecentMax+5; i++ {
		p, ch := hold(t, f.q, context.Background(), req("a3", "GET", "/n"))
		_ = f.q.Deny(p.ID, "c", "")
		<-ch
	}
	if n := len(f.q.Recent()); n != RecentMax {
		t.Errorf("remembered %d, want %d", n, RecentMax)
	}
}

// TestAPIEventsStreamStartsWithRecentDecisions: a stream opened after decisions were made
// starts with the last RecentDecisions of them, oldest first (none but decisions), then the
// live ones.
func TestAPIEventsStreamStartsWithRecentDecisions(t *testing.T) {
	f, c := newAPI(t, "tok")
	for i := range RecentDecisions + 3 {
		f.q.Events.AuditTap([]byte(fmt.Sprintf(`{"request_id":"r%d","msg":"decision"}`+"\n", i)))
	}
	f.q.Events.AuditTap([]byte(`{"id":"ap-1","msg":"approval"}` + "\n"))
	f.q.Events.AuditTap([]byte(`{"input":"` + strings.Repeat("x", recentLineMax) + `","msg":"decision"}` + "\n")) // too long to keep
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", c.srv.URL+"/api/events", nil)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := c.srv.Client().Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("events: %v %v", resp, err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	var data []string
	for len(data) < RecentDecisions {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			data = append(data, strings.TrimSpace(d))
		}
	}
	if data[0] != `{"request_id":"r3","msg":"decision"}` || data[RecentDecisions-1] != fmt.Sprintf(`{"request_id":"r%d","msg":"decision"}`, RecentDecisions+2) {
		t.Fatalf("replayed %q ... %q", data[0], data[RecentDecisions-1])
	}
	f.q.Events.AuditTap([]byte(`{"request_id":"live","msg":"decision"}` + "\n"))
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			if strings.TrimSpace(d) != `{"request_id":"live","msg":"decision"}` {
				t.Fatalf("after the replay: %q", d)
			}
			return
		}
	}
}
