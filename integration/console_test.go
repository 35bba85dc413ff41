package integration

// Browser tests of the web console (docs/console.md): Debian's Chromium, headless, driven
// through the DevTools protocol (chromedp). A person's clicks in the console decide the
// requests an agent makes; the console must render agent-controlled text as text and refuse
// nothing it should accept, accept nothing from another origin.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// agentResult is what the agent's request got back.
type agentResult struct {
	status int
	body   string
	err    error
}

// chromiumPath finds Debian's Chromium (scripts/install-test-tools.sh installs it).
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	requireTool(t, "chromium is missing")
	return ""
}

// newBrowser starts a headless Chromium and returns a context for its first tab.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	exe := chromiumPath(t)
	opts := append([]chromedp.ExecAllocatorOption{}, chromedp.DefaultExecAllocatorOptions[:]...)
	opts = append(opts, chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(1280, 800), chromedp.UserDataDir(t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("starting %s: %v", exe, err)
	}
	return ctx
}

// do runs browser actions, bounded by waitTimeout.
func do(t *testing.T, ctx context.Context, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	if err := chromedp.Do(tctx, actions...); err != nil {
		t.Fatalf("browser: %v", err)
	}
}

func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	v, err := chromedp.Run(tctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// waitJS waits until the expression is true in the page. (chromedp.Poll builds its predicate
// with new Function, which the console's CSP refuses; evaluation through the DevTools
// protocol is not subject to it.)
func waitJS(t *testing.T, ctx context.Context, what, expr string) {
	t.Helper()
	eventually(t, what, func() bool {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("!!("+expr+")"))
		return err == nil && ok
	})
}

// eventually polls cond until it holds, failing the test after waitTimeout.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// api calls the admin API with the bearer token, as the CLI does.
func api(t *testing.T, b brokerBackend, method, path string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		j, _ := json.Marshal(body)
		rd = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, b.adminURL()+path, rd)
	req.Header.Set("Authorization", "Bearer "+b.adminToken())
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// pendingID waits for the pending approval of the request with this path, and returns its id.
func pendingID(t *testing.T, b brokerBackend, path string) string {
	t.Helper()
	var id string
	var seen []any
	defer func() {
		if id == "" {
			t.Logf("pending approvals seen: %v", seen)
		}
	}()
	eventually(t, "a pending approval for "+path, func() bool {
		_, r := api(t, b, "GET", "/api/approvals", nil)
		list, _ := r["pending"].([]any)
		seen = list
		for _, p := range list {
			// The broker reports the normalised path: "<" and ">" percent-encoded.
			if m, _ := p.(map[string]any); m != nil && (m["path"] == path || m["path"] == angles.Replace(path)) {
				id, _ = m["id"].(string)
				return true
			}
		}
		return false
	})
	return id
}

var angles = strings.NewReplacer("<", "%3C", ">", "%3E")

func grants(t *testing.T, b brokerBackend) []map[string]any {
	t.Helper()
	_, r := api(t, b, "GET", "/api/grants", nil)
	list, _ := r["grants"].([]any)
	var out []map[string]any
	for _, g := range list {
		if m, ok := g.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

func recv(t *testing.T, ch <-chan agentResult) agentResult {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("agent request: %v", r.err)
		}
		return r
	case <-time.After(waitTimeout):
		t.Fatal("the agent's request got no answer")
		return agentResult{}
	}
}

func stillWaiting(t *testing.T, ch <-chan agentResult) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("the held request was answered (%d %s); it should still wait", r.status, r.body)
	default:
	}
}

// card is the CSS selector of a pending approval's card.
func card(id string) string { return fmt.Sprintf(`#pending article[data-id=%q]`, id) }

// login opens the console, which asks for the token, and signs in; a wrong token first.
func login(t *testing.T, ctx context.Context, adminURL, token string) {
	t.Helper()
	do(t, ctx, chromedp.Navigate(adminURL+"/console/"),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), "not-the-token"),
		chromedp.Click(chromedp.ID("login-button")),
		chromedp.WaitVisible(chromedp.ID("login-error")),
		chromedp.Evaluate[chromedp.Void](`document.getElementById('token').value = ''`),
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.ID("login-button")),
		chromedp.WaitVisible(chromedp.ID("app")),
	)
	waitJS(t, ctx, "the live stream", `document.getElementById('stream').textContent === 'live'`)
}

// runConsoleTests drives the console against b, in one browser, in order: each step leaves
// the page as the next expects.
func runConsoleTests(t *testing.T, b brokerBackend) context.Context {
	ctx := newBrowser(t)
	login(t, ctx, b.adminURL(), b.adminToken())

	t.Run("approve once", func(t *testing.T) {
		res := b.request(t, "GET", "/held/approve/one", nil, "")
		id := pendingID(t, b, "/held/approve/one")
		do(t, ctx, chromedp.WaitVisible(chromedp.CSS(card(id))))
		if got := eval[string](t, ctx, `document.querySelector('`+card(id)+` h3').textContent`); !strings.Contains(got, "/held/approve/one") {
			t.Errorf("card title %q lacks the path", got)
		}
		stillWaiting(t, res)
		do(t, ctx, chromedp.Click(chromedp.CSS(card(id)+" button.approve")))
		if r := recv(t, res); r.status != 200 {
			t.Errorf("approved request: status %d, body %s", r.status, r.body)
		}
		do(t, ctx, chromedp.WaitNotPresent(chromedp.CSS(card(id))))
	})

	t.Run("a webhook's link brings its card into view", func(t *testing.T) {
		res := b.request(t, "GET", "/held/linked/one", nil, "")
		id := pendingID(t, b, "/held/linked/one")
		// A fresh load, as a chat message's link opens it: the session cookie signs it in.
		do(t, ctx, chromedp.Navigate(b.adminURL()+"/console/?from=chat#approval-"+id),
			chromedp.WaitVisible(chromedp.CSS(card(id)+".linked")))
		if got := eval[string](t, ctx, `document.activeElement.closest('article') ? document.activeElement.closest('article').dataset.id : ''`); got != id {
			t.Errorf("focus is in card %q, want %q", got, id)
		}
		do(t, ctx, chromedp.Click(chromedp.CSS(card(id)+" button.approve")))
		if r := recv(t, res); r.status != 200 {
			t.Errorf("approved request: status %d", r.status)
		}
		do(t, ctx, chromedp.WaitNotPresent(chromedp.CSS(card(id))))
		waitJS(t, ctx, "the live stream", `document.getElementById('stream').textContent === 'live'`)
	})

	t.Run("deny with a comment", func(t *testing.T) {
		res := b.request(t, "GET", "/held/deny/one", nil, "")
		id := pendingID(t, b, "/held/deny/one")
		do(t, ctx, chromedp.WaitVisible(chromedp.CSS(card(id))),
			chromedp.SendKeys(chromedp.CSS(card(id)+" input.comment"), "not today"),
			chromedp.Click(chromedp.CSS(card(id)+" button.deny")))
		r := recv(t, res)
		if r.status != 403 || !strings.Contains(r.body, "denied_by_approver") {
			t.Errorf("denied request: status %d, body %s", r.status, r.body)
		}
		do(t, ctx, chromedp.WaitNotPresent(chromedp.CSS(card(id))))
	})

	t.Run("timeout", func(t *testing.T) {
		res := b.request(t, "GET", "/held/short/one", nil, "")
		id := pendingID(t, b, "/held/short/one")
		do(t, ctx, chromedp.WaitVisible(chromedp.CSS(card(id))))
		waitJS(t, ctx, "the countdown", `/times out in|timed out/.test(document.querySelector('`+card(id)+` .expires').textContent)`)
		r := recv(t, res)
		if r.status != 403 || !strings.Contains(r.body, "approval_timeout") {
			t.Errorf("timed-out request: status %d, body %s", r.status, r.body)
		}
		do(t, ctx, chromedp.WaitNotPresent(chromedp.CSS(card(id))))
	})

	t.Run("grant covers the next request, revoke ends it", func(t *testing.T) {
		res := b.request(t, "POST", "/held/grant/a", map[string]string{"Content-Type": "application/json"}, `{"n":1}`)
		id := pendingID(t, b, "/held/grant/a")
		c := card(id)
		do(t, ctx, chromedp.WaitVisible(chromedp.CSS(c)),
			chromedp.Click(chromedp.CSS(c+` input[value="agent"]`)),
			chromedp.WaitVisible(chromedp.CSS(c+" input.prefix")),
			chromedp.SetValue(chromedp.CSS(c+" input.prefix"), "/held/grant/"),
			chromedp.SendKeys(chromedp.CSS(c+" input.comment"), "deploy window"),
			chromedp.Click(chromedp.CSS(c+" button.approve")))
		if r := recv(t, res); r.status != 200 {
			t.Fatalf("approved request: status %d, body %s", r.status, r.body)
		}
		gs := grants(t, b)
		if len(gs) != 1 || gs[0]["path_prefix"] != "/held/grant/" || gs[0]["method"] != "POST" || gs[0]["comment"] != "deploy window" {
			t.Fatalf("grants after approving for the agent: %v", gs)
		}
		gid, _ := gs[0]["id"].(string)
		item := fmt.Sprintf(`#grants li[data-id=%q]`, gid)
		do(t, ctx, chromedp.WaitVisible(chromedp.CSS(item)))
		if got := eval[string](t, ctx, `document.querySelector('`+item+`').textContent`); !strings.Contains(got, "/held/grant/") || !strings.Contains(got, "deploy window") {
			t.Errorf("grant shown as %q", got)
		}
		// The next matching request is not held.
		if r := recv(t, b.request(t, "POST", "/held/grant/b", nil, `{"n":2}`)); r.status != 200 {
			t.Errorf("request under the grant: status %d, body %s", r.status, r.body)
		}
		waitJS(t, ctx, "the decision the grant answered", `[...document.querySelectorAll('#live li')].some(li =>
			li.textContent.includes('/held/grant/b') && li.textContent.includes('covered by a grant'))`)
		do(t, ctx, chromedp.Click(chromedp.CSS(item+" button.revoke")), chromedp.WaitNotPresent(chromedp.CSS(item)))
		if gs := grants(t, b); len(gs) != 0 {
			t.Fatalf("grants after revoking: %v", gs)
		}
		// Held again once revoked.
		res = b.request(t, "POST", "/held/grant/c", nil, `{"n":3}`)
		id = pendingID(t, b, "/held/grant/c")
		do(t, ctx, chromedp.WaitVisible(chromedp.CSS(card(id))), chromedp.Click(chromedp.CSS(card(id)+" button.deny")))
		if r := recv(t, res); r.status != 403 {
			t.Errorf("request after the revocation, denied: status %d", r.status)
		}
	})

	t.Run("always becomes policy data, shown as a grant and revocable", func(t *testing.T) {
		res := b.request(t, "PUT", "/held/always/a", nil, "x")
		id := pendingID(t, b, "/held/always/a")
		c := card(id)
		mark := b.e.broker.logs.mark()
		do(t, ctx, chromedp.WaitVisible(chromedp.CSS(c)),
			chromedp.Click(chromedp.CSS(c+` input[value="always"]`)),
			chromedp.WaitVisible(chromedp.CSS(c+" .always-note")),
			// (chromedp's SetValue refuses an empty value.)
			chromedp.Evaluate[chromedp.Void](`document.querySelector('`+c+` input.method').value = ''`),
			chromedp.SetValue(chromedp.CSS(c+" input.prefix"), "/held/always/"),
			chromedp.Click(chromedp.CSS(c+" button.approve")))
		if r := recv(t, res); r.status != 200 {
			t.Fatalf("approved request: status %d, body %s", r.status, r.body)
		}
		b.e.broker.logs.waitFrom(t, mark, `"message":"policy reloaded"`) // approved.json changed
		gs := grants(t, b)
		if len(gs) != 1 || gs[0]["kind"] != "always" || gs[0]["method"] != "" || gs[0]["path_prefix"] != "/held/always/" {
			t.Fatalf("grants after approving always: %v", gs)
		}
		item := fmt.Sprintf(`#grants li[data-id=%q]`, gs[0]["id"])
		do(t, ctx, chromedp.WaitVisible(chromedp.CSS(item)))
		if got := eval[string](t, ctx, `document.querySelector('`+item+`').textContent`); !strings.Contains(got, "always") || !strings.Contains(got, "any method") {
			t.Errorf("always grant shown as %q", got)
		}
		if r := recv(t, b.request(t, "DELETE", "/held/always/b", nil, "")); r.status != 200 {
			t.Errorf("a request the always approval covers: status %d, body %s", r.status, r.body)
		}
		mark = b.e.broker.logs.mark()
		do(t, ctx, chromedp.Click(chromedp.CSS(item+" button.revoke")), chromedp.WaitNotPresent(chromedp.CSS(item)))
		b.e.broker.logs.waitFrom(t, mark, `"message":"policy reloaded"`)
		res = b.request(t, "DELETE", "/held/always/c", nil, "")
		id = pendingID(t, b, "/held/always/c")
		do(t, ctx, chromedp.WaitVisible(chromedp.CSS(card(id))), chromedp.Click(chromedp.CSS(card(id)+" button.deny")))
		if r := recv(t, res); r.status != 403 {
			t.Errorf("request after revoking always, denied: status %d", r.status)
		}
	})

	t.Run("agent data is shown as text", func(t *testing.T) {
		const path = "/held/xss/<script>window.__xss=1</script><svg/onload=window.__xss=6>"
		header := `<script>window.__xss=2</script><img src=x onerror="window.__xss=3">`
		body := `{"html":"<img src=x onerror=window.__xss=4><script>window.__xss=5</script>"}`
		res := b.request(t, "POST", path, map[string]string{"X-Note": header, "Content-Type": "application/json"}, body)
		id := pendingID(t, b, path)
		c := card(id)
		do(t, ctx, chromedp.WaitVisible(chromedp.CSS(c)))
		text := eval[string](t, ctx, `document.querySelector('`+c+`').textContent`)
		for _, want := range []string{"<script>window.__xss=1</script><svg/onload=window.__xss=6>", header, "<img src=x onerror=window.__xss=4>"} {
			if !strings.Contains(text, want) {
				t.Errorf("the card does not show %q as text:\n%s", want, text)
			}
		}
		// No element was made from agent data (this catches an HTML sink even where the CSP
		// would stop the script), and nothing ran.
		if n := eval[int](t, ctx, `document.querySelectorAll('#app svg, #app img, #app script, #app iframe').length`); n != 0 {
			t.Errorf("%d elements were created from agent data", n)
		}
		do(t, ctx, chromedp.Click(chromedp.CSS(c+" button.deny")))
		recv(t, res)
		waitJS(t, ctx, "the decision row", `[...document.querySelectorAll('#live li')].some(li => li.textContent.includes('/held/xss/'))`)
		if n := eval[int](t, ctx, `document.querySelectorAll('#app svg, #app img, #app script, #app iframe').length`); n != 0 {
			t.Errorf("%d elements were created from agent data in the live list", n)
		}
		if x := eval[string](t, ctx, `String(window.__xss)`); x != "undefined" {
			t.Errorf("agent data ran as script: window.__xss = %s", x)
		}
	})

	t.Run("CSRF from another origin is refused", func(t *testing.T) {
		res := b.request(t, "GET", "/held/csrf/one", nil, "")
		id := pendingID(t, b, "/held/csrf/one")
		before := len(grants(t, b))
		target := b.adminURL() + "/api/approvals/" + id + "/approve"
		// A page on another loopback port: the browser holds the console's session cookie
		// (same site: only the port differs), so only the CSRF token and Origin checks stop it.
		evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprintf(w, `<!doctype html><title>start</title>
<form id="f" method="POST" action="%[1]s" enctype="text/plain"><input name='{"scope":"always","comment":"' value='"}'></form>
<script>
const t = %[1]q;
const body = JSON.stringify({scope: "always", comment: "csrf"});
fetch(t, {method: "POST", mode: "no-cors", credentials: "include", headers: {"Content-Type": "text/plain"}, body})
  .then(() => fetch(t, {method: "POST", credentials: "include", headers: {"Content-Type": "application/json", "X-CSRF-Token": "guess"}, body}))
  .then(() => "read", e => "blocked")
  .then(r => { document.title = r; document.getElementById("f").submit(); });
</script>`, target)
		}))
		defer evil.Close()
		tab, cancel := chromedp.NewContext(ctx)
		defer cancel()
		var mu sync.Mutex
		statuses := []int64{}
		responses := chromedp.Events(tab, network.ResponseReceived)
		go func() {
			for ev, err := range responses {
				if err != nil {
					return
				}
				if ev.Response.URL == target && ev.Type != network.ResourceTypePreflight {
					mu.Lock()
					statuses = append(statuses, ev.Response.Status)
					mu.Unlock()
				}
			}
		}()
		do(t, tab, chromedp.Navigate(evil.URL))
		// The no-cors fetch and the form post reach the API and are refused; the fetch with
		// a custom header never gets past its preflight.
		eventually(t, "the form post's answer", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(statuses) >= 2
		})
		mu.Lock()
		for _, s := range statuses {
			if s != 403 {
				t.Errorf("a cross-origin approval got status %d, want 403 (all: %v)", s, statuses)
			}
		}
		mu.Unlock()
		stillWaiting(t, res)
		if len(grants(t, b)) != before {
			t.Error("a cross-origin request made a grant")
		}
		if id2 := pendingID(t, b, "/held/csrf/one"); id2 != id {
			t.Fatalf("pending id changed: %s", id2)
		}
		// The console's own call still works.
		do(t, ctx, chromedp.WaitVisible(chromedp.CSS(card(id))), chromedp.Click(chromedp.CSS(card(id)+" button.approve")))
		if r := recv(t, res); r.status != 200 {
			t.Errorf("approved from the console: status %d", r.status)
		}
	})

	t.Run("live decisions and filters", func(t *testing.T) {
		if r := recv(t, b.request(t, "GET", "/open/live", nil, "")); r.status != 200 {
			t.Fatalf("allowed request: %d", r.status)
		}
		waitJS(t, ctx, "the allowed decision", `[...document.querySelectorAll('#live li')].some(li => li.textContent.includes('/open/live') && li.querySelector('.o.allow'))`)
		waitJS(t, ctx, "the denied decision", `[...document.querySelectorAll('#live li')].some(li => li.textContent.includes('/held/deny/one') && li.querySelector('.o.deny'))`)
		do(t, ctx, chromedp.SetValue(chromedp.ID("filter-outcome"), "deny"),
			chromedp.Evaluate[chromedp.Void](`document.getElementById('filter-outcome').dispatchEvent(new Event('change'))`))
		if n := eval[int](t, ctx, `[...document.querySelectorAll('#live li')].filter(li => !li.querySelector('.o.deny')).length`); n != 0 {
			t.Errorf("%d rows that are not denials shown under the deny filter", n)
		}
		if n := eval[int](t, ctx, `document.querySelectorAll('#live li').length`); n == 0 {
			t.Error("no denial shown under the deny filter")
		}
		do(t, ctx, chromedp.SetValue(chromedp.ID("filter-agent"), agentID),
			chromedp.SetValue(chromedp.ID("filter-outcome"), ""),
			chromedp.Evaluate[chromedp.Void](`document.getElementById('filter-outcome').dispatchEvent(new Event('change'))`))
		if n := eval[int](t, ctx, `[...document.querySelectorAll('#live li')].filter(li => li.textContent.includes('/open/live')).length`); n == 0 {
			t.Error("the agent filter hides the agent's own decisions")
		}
	})

	t.Run("status", func(t *testing.T) {
		_, st := api(t, b, "GET", "/api/status", nil)
		ready, _ := st["ready"].(map[string]any)
		want, _ := ready["status"].(string)
		if want == "" {
			t.Fatalf("status without readiness: %v", st)
		}
		waitJS(t, ctx, "readiness "+want, `document.getElementById('ready').textContent === '`+want+`'`)
		rev, _ := st["policy_revision"].(string)
		if rev == "" {
			t.Fatalf("no policy revision: %v", st)
		}
		waitJS(t, ctx, "the policy revision "+rev, `document.getElementById('revision').textContent.includes('`+rev+`')`)
	})

	t.Run("sign out", func(t *testing.T) {
		do(t, ctx, chromedp.WaitVisible(chromedp.ID("logout")), chromedp.Click(chromedp.ID("logout")),
			chromedp.WaitVisible(chromedp.ID("token")))
		status, err := chromedp.Run(ctx, chromedp.Evaluate[int](`fetch('/api/approvals', {credentials: 'same-origin'}).then(r => r.status)`, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatal(err)
		}
		if status != 401 {
			t.Errorf("the API after signing out: status %d, want 401", status)
		}
		login(t, ctx, b.adminURL(), b.adminToken())
	})
	return ctx
}

// screenshots shows the console with pending approvals and live decisions at desktop and
// phone widths; with CAPBROKER_SCREENSHOTS=1 it writes docs/console-{desktop,phone}.png.
func screenshots(t *testing.T, ctx context.Context, b brokerBackend) {
	t.Run("screenshots", func(t *testing.T) {
		for i := range 6 {
			recv(t, b.request(t, "GET", fmt.Sprintf("/open/repos/acme/app/pulls/%d", i+1), nil, ""))
		}
		recv(t, b.request(t, "GET", "/denied/admin/users", nil, ""))
		asked := b.request(t, "POST", "/held/repos/acme/app/issues", nil, `{"title":"flaky test"}`)
		api(t, b, "POST", "/api/approvals/"+pendingID(t, b, "/held/repos/acme/app/issues")+"/approve", map[string]string{"comment": "fine"})
		recv(t, asked)
		var held []<-chan agentResult
		held = append(held, b.request(t, "POST", "/held/repos/acme/app/git/refs/heads/main",
			map[string]string{"Content-Type": "application/json", "User-Agent": "git/2.43.0"}, `{"sha":"4e1c0ffee","force":true}`))
		held = append(held, b.request(t, "DELETE", "/held/v1/projects/prod-db", map[string]string{"User-Agent": "curl/8.5.0"}, ""))
		pendingID(t, b, "/held/repos/acme/app/git/refs/heads/main")
		pendingID(t, b, "/held/v1/projects/prod-db")
		waitJS(t, ctx, "two cards", `document.querySelectorAll('#pending article').length === 2`)
		do(t, ctx, chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`))
		for _, shot := range []struct {
			name          string
			width, height int64
		}{{"desktop", 1280, 800}, {"phone", 390, 844}, {"narrow", 375, 667}} {
			do(t, ctx, chromedp.EmulateViewport(shot.width, shot.height, chromedp.EmulateScale(1)))
			waitJS(t, ctx, "the layout", fmt.Sprintf("window.innerWidth === %d", shot.width))
			// Usable at this width: nothing wider than the screen, big touch targets.
			if w := eval[int](t, ctx, `document.documentElement.scrollWidth`); w > int(shot.width) {
				wide := eval[[]string](t, ctx, fmt.Sprintf(`[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().left + e.scrollWidth > %d).map(e => e.tagName + '.' + e.className + ' ' + e.scrollWidth + ' ' + e.textContent.slice(0, 40))`, shot.width))
				t.Errorf("%s: the page is %dpx wide on a %dpx screen: %v", shot.name, w, shot.width, wide)
			}
			if small := eval[[]string](t, ctx, `[...document.querySelectorAll('#app button, #app select, #app input[type=text]')]
				.filter(e => e.offsetParent && e.getBoundingClientRect().height < 44).map(e => e.outerHTML.slice(0, 80))`); len(small) > 0 && shot.name != "desktop" {
				t.Errorf("%s: controls under 44px tall: %v", shot.name, small)
			}
			buf, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
			if err != nil {
				t.Fatal(err)
			}
			img, err := png.Decode(bytes.NewReader(buf))
			if err != nil || img.Bounds().Dx() != int(shot.width) {
				t.Fatalf("%s screenshot: %v, %v", shot.name, err, img.Bounds())
			}
			if os.Getenv("CAPBROKER_SCREENSHOTS") == "1" && shot.name != "narrow" {
				out := filepath.Join("..", "docs", "console-"+shot.name+".png")
				if err := os.WriteFile(out, buf, 0o644); err != nil {
					t.Fatal(err)
				}
				t.Logf("wrote %s (%d bytes)", out, len(buf))
			}
		}
		do(t, ctx, chromedp.EmulateViewport(1280, 800))
		for _, id := range []string{pendingID(t, b, "/held/repos/acme/app/git/refs/heads/main"), pendingID(t, b, "/held/v1/projects/prod-db")} {
			api(t, b, "POST", "/api/approvals/"+id+"/deny", map[string]string{"comment": "end of test"})
		}
		for _, h := range held {
			recv(t, h)
		}
	})
}

// TestConsoleFlood sends the console decisions faster than a browser draws them: the page
// keeps the newest 500 rows, stays usable, and says how many the stream dropped.
func TestConsoleFlood(t *testing.T) {
	f := newFakeAdmin(t)
	ctx := newBrowser(t)
	login(t, ctx, f.srv.URL, f.token)
	const n = 20000
	start := time.Now()
	for i := range n {
		f.send("decision", map[string]any{"time": time.Now().UTC().Format(time.RFC3339), "agent": fmt.Sprintf("agent-%d", i%7),
			"phase": "request", "method": "GET", "scheme": "https", "host": "api.example.test", "port": 443,
			"path": fmt.Sprintf("/flood/%d", i), "decision": "allow", "status": 200, "credentials": []string{"canary"}})
	}
	f.send("dropped", map[string]any{"count": 1234})
	waitJS(t, ctx, "the last flood row", fmt.Sprintf(`document.querySelector('#live li') && document.querySelector('#live li').textContent.includes('/flood/%d')`, n-1))
	t.Logf("%d decisions sent and drawn in %v (%.0f/s)", n, time.Since(start), n/time.Since(start).Seconds())
	do(t, ctx, chromedp.WaitVisible(chromedp.ID("dropped")))
	if got := eval[string](t, ctx, `document.getElementById('dropped').textContent`); !strings.Contains(got, "1234") {
		t.Errorf("dropped notice %q", got)
	}
	if rows := eval[int](t, ctx, `document.querySelectorAll('#live li').length`); rows != 500 {
		t.Errorf("%d rows in the page, want 500", rows)
	}
	if last := eval[string](t, ctx, `document.querySelector('#live li:last-child').textContent`); !strings.Contains(last, fmt.Sprintf("/flood/%d", n-500)) {
		t.Errorf("oldest row shown: %q, want /flood/%d", last, n-500)
	}
	// Still responsive: a filter applies at once, over the rows kept.
	do(t, ctx, chromedp.SetValue(chromedp.ID("filter-agent"), "agent-3"),
		chromedp.Evaluate[chromedp.Void](`document.getElementById('filter-agent').dispatchEvent(new Event('change'))`))
	if other := eval[int](t, ctx, `[...document.querySelectorAll('#live li')].filter(li => !li.textContent.includes('agent-3')).length`); other != 0 {
		t.Errorf("%d rows of other agents under the agent filter", other)
	}
}

// consolePolicy asks a person about everything under /held/ (/held/short/ with a 3s
// timeout) that no "always" approval covers, allows /open/, refuses the rest.
const consolePolicy = `package broker

default decision := {"allow": false, "reason": "not allowed by the test policy"}

decision := {"allow": true, "intercept": true} if {
	input.phase == "connect"
	input.request.host == "127.0.0.1"
}

decision := {"allow": true, "credentials": ["canary"]} if {
	input.phase == "request"
	startswith(input.request.path, "/open/")
}

# The reason repeats the path as the agent sent it (raw_path, not normalised): agent text.
decision := {"ask": {"reason": sprintf("%s %s changes things: a person decides", [input.request.method, input.request.raw_path]), "timeout": "2m"}, "credentials": ["canary"]} if {
	input.phase == "request"
	startswith(input.request.path, "/held/")
	not startswith(input.request.path, "/held/short/")
	not approved
}

# An "always" approval is policy data (approved.json in the policy dir).
decision := {"allow": true, "credentials": ["canary"]} if {
	input.phase == "request"
	approved
}

approved if {
	some a in data.approved
	a.agent == input.agent.id
	a.host == input.request.host
	a.method in {"", input.request.method}
	startswith(input.request.path, a.path_prefix)
}

decision := {"ask": {"reason": "a short question", "timeout": "3s"}} if {
	input.phase == "request"
	startswith(input.request.path, "/held/short/")
}
`

// brokerBackend is the real broker: an admin token, the policy above, and curl as the agent
// (paths under /held/ ask a person, /held/short/ with a 3s timeout).
type brokerBackend struct {
	e     *env
	token string
}

func newBrokerBackend(t *testing.T) brokerBackend {
	t.Helper()
	token := randHex(16)
	e := newEnv(t, envOpts{policy: consolePolicy, admin: "token_env: CAPBROKER_ADMIN_TOKEN",
		env: []string{"CAPBROKER_ADMIN_TOKEN=" + token}})
	return brokerBackend{e: e, token: token}
}

func (b brokerBackend) adminURL() string   { return "http://" + b.e.broker.adminAddr }
func (b brokerBackend) adminToken() string { return b.token }

// request runs curl through the broker as the agent; its answer arrives on the channel.
func (b brokerBackend) request(t *testing.T, method, path string, headers map[string]string, body string) <-chan agentResult {
	args := []string{"-g", "--path-as-is", "-o", "-", "-w", "\n%{http_code}", "-X", method}
	for k, v := range headers {
		args = append(args, "-H", k+": "+v)
	}
	if body != "" {
		args = append(args, "--data-binary", body)
	}
	args = append(args, b.e.url(path))
	out := make(chan agentResult, 1)
	go func() {
		text, err := b.e.curl(args...)
		text = strings.TrimRight(text, "\n")
		i := strings.LastIndexByte(text, '\n')
		code, cerr := strconv.Atoi(text[i+1:])
		if err != nil || cerr != nil {
			out <- agentResult{err: fmt.Errorf("curl %s: %v %v: %s", path, err, cerr, text)}
			return
		}
		out <- agentResult{status: code, body: text[:max(i, 0)]}
	}()
	return out
}

// TestConsole drives the console on the real broker: a person's clicks decide what curl,
// as the agent, gets back.
func TestConsole(t *testing.T) {
	b := newBrokerBackend(t)
	ctx := runConsoleTests(t, b)
	screenshots(t, ctx, b)
}
