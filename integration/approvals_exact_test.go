package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/capbroker/capbroker/internal/harness"
)

// An approval covers exactly what the person was shown (issue 33, findings 7 and 10): these
// tests attack the approval surfaces as a hostile agent would, and check what the agent got,
// what the upstream saw, what the person was shown and what the audit says.

// exactPolicy is askPolicy, plus a rule under /note/ that asks with a reason carrying the
// agent's X-Note header: agent-chosen text in what the approver reads.
const exactPolicy = askPolicy + `
decision := {"ask": {"reason": sprintf("the agent says: %s", [input.request.headers["x-note"]])}} if {
	input.phase == "request"
	startswith(input.request.path, "/note/")
}
`

// pendingOf returns the held request with id, as GET /api/approvals shows it.
func pendingOf(t *testing.T, a *admin, id string) map[string]any {
	t.Helper()
	code, list := a.call("GET", "/api/approvals", "", nil)
	pending, _ := list["pending"].([]any)
	for _, x := range pending {
		if p, _ := x.(map[string]any); p["id"] == id {
			return p
		}
	}
	t.Fatalf("%s is not pending: %d %v", id, code, list)
	return nil
}

// TestApprovalGrantCoversItsPortOnly: an "agent" grant approved for DELETE on 127.0.0.1:A does
// not let DELETE through to 127.0.0.1:B; the request to B is held and asked about again.
func TestApprovalGrantCoversItsPortOnly(t *testing.T) {
	e, a := askEnv(t, "")
	other := e.pki.serve(t, e.record(http.HandlerFunc(e.echo)), false, nil) // the same host, another port
	ev := a.events()

	c := e.curlStart("-i", "-X", "DELETE", e.url("/ask/things/1"))
	id := ev.approval("pending")
	g := a.approve(id, `{"scope": "agent"}`)["grant"].(map[string]any)
	if g["scheme"] != "https" || g["host"] != "127.0.0.1" || fmt.Sprint(g["port"]) != strings.TrimPrefix(e.up.URL, "https://127.0.0.1:") {
		t.Fatalf("grant: %v", g)
	}
	if out := c.wait(); !hasStatus(out, 200) {
		t.Fatalf("approved request:\n%s", out)
	}
	// The other port is asked about again, and nothing reaches it while it is held.
	c = e.curlStart("-i", "-X", "DELETE", other.URL+"/ask/things/2")
	id2 := ev.approval("pending")
	if p := pendingOf(t, a, id2); fmt.Sprint(p["port"]) != strings.TrimPrefix(other.URL, "https://127.0.0.1:") {
		t.Fatalf("held: %v", p)
	}
	if n := e.receivedUnder("/ask/things/2"); n != 0 {
		t.Fatalf("the other port was sent the request under the grant: %d", n)
	}
	a.call("POST", "/api/approvals/"+id2+"/deny", `{"comment": "not that port"}`, nil)
	if out := c.wait(); !hasStatus(out, 403) || !strings.Contains(out, `"error":"denied_by_approver"`) {
		t.Fatalf("the other port:\n%s", out)
	}
	if dec := decisionOf(t, e.broker, "/ask/things/2"); dec["decision"] != "deny" || dec["approval"].(map[string]any)["outcome"] != "denied" {
		t.Fatalf("the other port's decision: %v", dec)
	}
	// The grant's own port still answers without asking.
	if out, _ := e.curl("-i", "-X", "DELETE", e.url("/ask/things/3")); !hasStatus(out, 200) {
		t.Fatalf("the grant's port:\n%s", out)
	}
	if dec := decisionOf(t, e.broker, "/ask/things/3"); dec["approval"].(map[string]any)["outcome"] != "granted" {
		t.Fatalf("the grant's port: %v", dec)
	}
	e.broker.waitAuditWhere(t, 1, "the grant's event with its port", func(ev auditEvent) bool {
		return ev["msg"] == "approval" && ev["action"] == "grant" && ev["scheme"] == "https" && fmt.Sprint(ev["port"]) == fmt.Sprint(g["port"])
	})
}

// TestApprovalRefusesAmbiguousBody: a body whose JSON members a server may read as one is not
// held, so it cannot be approved: a duplicate past the 2 KiB preview, a letter-case variant,
// a folded one (U+017F), in a body labelled JSON or not.
func TestApprovalRefusesAmbiguousBody(t *testing.T) {
	e, a := askEnv(t, "")
	ev := a.events()
	pad := strings.Repeat("x", 3000)
	cases := map[string]struct{ ctype, body string }{
		"duplicate past the preview": {"application/json", `{"action":"archive","note":"` + pad + `","action":"purge_everything"}`},
		"case variant":               {"application/json", `{"action":"archive","Action":"purge_everything"}`},
		"folded variant":             {"application/json", `{"cascade":false,"ca` + "\u017f" + `cade":true}`},
		"labelled text":              {"text/plain", `{"action":"archive","note":"` + pad + `","action":"purge_everything"}`},
		"nested":                     {"application/merge-patch+json", `{"repo":{"action":"archive","ACTION":"purge"}}`},
	}
	i := 0
	for name, c := range cases {
		i++
		path := fmt.Sprintf("/ask/ambiguous/%d", i)
		out, _ := e.curl("-i", "-X", "POST", "-H", "Content-Type: "+c.ctype, "--data-binary", c.body, e.url(path))
		if !hasStatus(out, 400) || !strings.Contains(out, `"error":"ambiguous_request"`) || strings.Contains(out, "purge_everything") {
			t.Errorf("%s: the agent got:\n%s", name, out)
		}
		if dec := decisionOf(t, e.broker, path); dec["decision"] != "deny" || fmt.Sprint(dec["status"]) != "400" || dec["approval"] != nil {
			t.Errorf("%s: audit %v", name, dec)
		}
	}
	if n := e.receivedUnder("/ask/ambiguous/"); n != 0 {
		t.Fatalf("the upstream was sent %d ambiguous bodies", n)
	}
	if _, list := a.call("GET", "/api/approvals", "", nil); len(list["pending"].([]any)) != 0 {
		t.Fatalf("an ambiguous body was held: %v", list)
	}
	// A body without collisions is held, and its cut preview says so.
	clean := `{"action":"archive","note":"` + pad + `"}`
	c := e.curlStart("-i", "-X", "POST", "-H", "Content-Type: application/json", "--data-binary", clean, e.url("/ask/clean"))
	id := ev.approval("pending")
	p := pendingOf(t, a, id)
	if p["body_truncated"] != true || fmt.Sprint(p["body_size"]) != fmt.Sprint(len(clean)) || !strings.HasSuffix(p["body_preview"].(string), "…") {
		t.Fatalf("the cut preview: truncated %v, size %v", p["body_truncated"], p["body_size"])
	}
	a.call("POST", "/api/approvals/"+id+"/deny", `{}`, nil)
	c.wait()
}

// TestApprovalCardShowsQueryValuesAndCredentials: the person sees every query value (a secret
// among them scrubbed) and the credentials approving attaches; the canary never reaches the
// admin API, the webhook or the audit.
func TestApprovalCardShowsQueryValuesAndCredentials(t *testing.T) {
	hook := make(chan []byte, 4)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		hook <- b
	}))
	defer recv.Close()
	e := newEnv(t, envOpts{policy: exactPolicy, extraConfig: fmt.Sprintf("approvals: {webhook: {url: %q}}\n", recv.URL)})
	a := newAdmin(t, e.broker)
	ev := a.events()
	c := e.curlStart("-i", "-X", "DELETE", e.url("/ask/repo?force=true&cascade=yes&cascade=all&key="+e.canary))
	id := ev.approval("pending")
	code, raw := a.call("GET", "/api/approvals", "", nil)
	b, _ := json.Marshal(raw)
	if code != 200 || strings.Contains(string(b), e.canary) {
		t.Fatalf("the admin API shows the secret: %s", b)
	}
	p := pendingOf(t, a, id)
	q, _ := p["query"].(map[string]any)
	if fmt.Sprint(q["force"]) != "[true]" || fmt.Sprint(q["cascade"]) != "[yes all]" || fmt.Sprint(q["key"]) != "[[REDACTED]]" {
		t.Fatalf("query shown: %v", q)
	}
	if fmt.Sprint(p["credentials"]) != "[canary]" {
		t.Fatalf("credentials shown: %v", p["credentials"])
	}
	cmd := exec.Command(brokerBin, "approvals", "list", "--admin", "http://"+e.broker.adminAddr)
	cmd.Env = harness.Env()
	if out, err := cmd.CombinedOutput(); err != nil || strings.Contains(string(out), e.canary) ||
		!strings.Contains(string(out), "cascade=yes&cascade=all&force=true&key=%5BREDACTED%5D") || !strings.Contains(string(out), "CREDENTIALS") ||
		!strings.Contains(string(out), " canary ") {
		t.Fatalf("broker approvals list: %v\n%s", err, out)
	}
	msg := <-hook
	if strings.Contains(string(msg), e.canary) {
		t.Fatalf("the webhook carries the secret: %s", msg)
	}
	var m struct{ Text string }
	_ = json.Unmarshal(msg, &m)
	for _, want := range []string{"DELETE https://127.0.0.1:", "cascade=yes&amp;cascade=all", "force=true", "attaches the credentials canary"} {
		if !strings.Contains(m.Text, want) {
			t.Errorf("webhook text lacks %q: %s", want, m.Text)
		}
	}
	a.call("POST", "/api/approvals/"+id+"/deny", `{}`, nil)
	c.wait()
}

// TestApprovalWebhookEscapesAgentText: a reason carrying the agent's words cannot put a link,
// a mention or markup in the approver's chat.
func TestApprovalWebhookEscapesAgentText(t *testing.T) {
	hook := make(chan []byte, 4)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		hook <- b
	}))
	defer recv.Close()
	e := newEnv(t, envOpts{policy: exactPolicy, extraConfig: fmt.Sprintf("approvals: {webhook: {url: %q}}\n", recv.URL)})
	a := newAdmin(t, e.broker)
	ev := a.events()
	note := "<https://evil.example/approve|Approve here> <!channel> & <@U0123>"
	c := e.curlStart("-i", "-H", "X-Note: "+note, e.url("/note/x"))
	id := ev.approval("pending")
	var m struct{ Text string }
	if err := json.Unmarshal(<-hook, &m); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(m.Text, "<>") || !strings.Contains(m.Text, "Reason: `the agent says: &lt;https://evil.example/approve|Approve here&gt; &lt;!channel&gt; &amp; &lt;@U0123&gt;`.") {
		t.Fatalf("webhook text: %s", m.Text)
	}
	a.call("POST", "/api/approvals/"+id+"/deny", `{}`, nil)
	c.wait()
}

// TestAdminAPIRefusesForeignOrigin: a page of another origin cannot read the held requests
// through an approver's browser (GET included), nor any other route.
func TestAdminAPIRefusesForeignOrigin(t *testing.T) {
	e, a := askEnv(t, "")
	ev := a.events()
	c := e.curlStart("-i", e.url("/ask/secret-project/delete"))
	id := ev.approval("pending")
	for name, h := range map[string]map[string]string{
		"foreign origin":   {"Origin": "http://evil.example"},
		"null origin":      {"Origin": "null"},
		"foreign referer":  {"Referer": "http://evil.example/page"},
		"cross-site fetch": {"Sec-Fetch-Site": "cross-site"},
	} {
		for _, route := range []string{"GET /api/approvals", "GET /api/grants", "GET /api/status", "GET /api/session"} { // GET /api/events: broker/approvals
			method, path, _ := strings.Cut(route, " ")
			code, out := a.call(method, path, "", h)
			if b, _ := json.Marshal(out); code != 403 || out["error"] != "csrf" || strings.Contains(string(b), "secret-project") {
				t.Errorf("%s, %s: %d %s", name, route, code, b)
			}
		}
	}
	if code, out := a.call("GET", "/api/approvals", "", map[string]string{"Origin": "http://" + e.broker.adminAddr}); code != 200 || len(out["pending"].([]any)) != 1 {
		t.Fatalf("its own origin: %d %v", code, out)
	}
	a.call("POST", "/api/approvals/"+id+"/deny", `{}`, nil)
	c.wait()
}

// TestAdminLoginThrottled: wrong admin tokens are checked ten at a time, then answered 429
// with Retry-After unchecked (the right one too, so a right guess cannot be told apart), by
// login and as a bearer token.
func TestAdminLoginThrottled(t *testing.T) {
	token := randHex(16)
	e := newEnv(t, envOpts{policy: askPolicy, admin: "token_env: ADMIN_TOKEN", env: []string{"ADMIN_TOKEN=" + token}})
	client := &http.Client{Transport: &http.Transport{Proxy: nil}}
	post := func(body string) (int, string) {
		resp, err := client.Post("http://"+e.broker.adminAddr+"/api/login", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}
	checked, start := 0, time.Now()
	for i := 0; i < 2000; i++ { // the review's 2,000 guesses
		switch code, _ := post(fmt.Sprintf(`{"token":"guess-%d"}`, i)); code {
		case 401:
			checked++
		case 429:
		default:
			t.Fatalf("guess %d: %d", i, code)
		}
	}
	// Ten are checked at once, then one a second.
	elapsed := time.Since(start)
	if checked < 10 || checked > 11+int(elapsed/time.Second) {
		t.Fatalf("%d of 2000 guesses in %s were checked", checked, elapsed)
	}
	t.Logf("%d of 2000 wrong guesses in %s were checked; the others were answered 429 unchecked", checked, elapsed.Round(time.Millisecond))
	if code, retry := post(`{"token":"` + token + `"}`); code != 429 || retry == "" {
		t.Fatalf("the right token while throttled: %d, Retry-After %q", code, retry)
	}
	req, _ := http.NewRequest("GET", "http://"+e.broker.adminAddr+"/api/approvals", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 429 {
		t.Fatalf("a bearer token from the throttled address: %d", resp.StatusCode)
	}
	if strings.Contains(e.broker.logs.String(), token) {
		t.Fatal("the admin token is in the broker's log")
	}
}

// TestAdminShortTokenRefusedAtStart: run and check-config refuse an admin token carrying
// under 128 bits, naming the key path and never the value.
func TestAdminShortTokenRefusedAtStart(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command(brokerBin, "ca", "init", "--out", dir).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	policies := filepath.Join(dir, "policies")
	_ = os.Mkdir(policies, 0o755)
	_ = os.WriteFile(filepath.Join(policies, "broker.rego"), []byte("package broker\n\ndefault decision := {\"allow\": false}\n"), 0o644)
	tokenFile := filepath.Join(dir, "admin.token")
	cfg := filepath.Join(dir, "broker.yaml")
	for name, c := range map[string]struct{ key, token string }{
		"env, 2 characters":   {"token_env: ADMIN_TOKEN", "zq"},
		"env, 31 hex digits":  {"token_env: ADMIN_TOKEN", randHex(16)[:31]},
		"file, a placeholder": {fmt.Sprintf("token_file: %q", tokenFile), strings.Repeat("changeme", 4)},
	} {
		t.Run(name, func(t *testing.T) {
			_ = os.WriteFile(tokenFile, []byte(c.token+"\n"), 0o600)
			_ = os.WriteFile(cfg, []byte(fmt.Sprintf("proxy: {listen: \"127.0.0.1:0\"}\nadmin: {listen: \"127.0.0.1:0\", %s}\nca: {cert_file: %q, key_file: %q}\npolicy: {dir: %q}\n",
				c.key, filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"), policies)), 0o600)
			key, _, _ := strings.Cut(c.key, ":")
			for _, args := range [][]string{{"run", "--config", cfg}, {"check-config", "--config", cfg}} {
				cmd := exec.Command(brokerBin, args...)
				cmd.Env = append(harness.Env(), "ADMIN_TOKEN="+c.token)
				out, err := cmd.CombinedOutput()
				if err == nil || !strings.Contains(string(out), "admin."+key) || !strings.Contains(string(out), "128") || strings.Contains(string(out), c.token) {
					t.Fatalf("broker %s: %v\n%s", args[0], err, out)
				}
			}
		})
	}
}

// TestProxyToAdminPortIsADeny: the agent asking the broker, through the proxy, for its own
// admin API (over http and through a tunnel) gets a 403 denied naming why, and the audit says
// deny, although the policy allows the path.
func TestProxyToAdminPortIsADeny(t *testing.T) {
	e, _ := askEnv(t, "")
	_, port, _ := strings.Cut(e.broker.adminAddr, ":")
	for name, url := range map[string]string{
		"http":   "http://" + e.broker.adminAddr + "/api/approvals",
		"tunnel": "https://127.0.0.1:" + port + "/api/approvals",
	} {
		mark := e.broker.auditLog.mark()
		out, _ := e.curl("-i", url)
		if !hasStatus(out, 403) || !strings.Contains(out, `"error":"denied"`) || !strings.Contains(out, "the broker's own listener") {
			t.Errorf("%s: the agent got:\n%s", name, out)
		}
		lines := e.broker.auditLog.waitLines(t, mark, 1, "the decision", func(l string) bool {
			return strings.Contains(l, `"msg":"decision"`) && strings.Contains(l, `"path":"/api/approvals"`)
		})
		var dec auditEvent
		_ = json.Unmarshal([]byte(lines[0]), &dec)
		if dec["decision"] != "deny" || fmt.Sprint(dec["status"]) != "403" || !strings.Contains(fmt.Sprint(dec["reason"]), "own listener") {
			t.Errorf("%s: audit %v", name, dec)
		}
	}
}

// TestFullWidthDotsRefused: a path with characters a server normalising Unicode (NFKC) reads
// as '.' or '/' is refused before the policy, raw or escaped, and never reaches the upstream.
func TestFullWidthDotsRefused(t *testing.T) {
	e := newEnv(t, envOpts{})
	for name, path := range map[string]string{
		"full-width dots":    "/api/echo/%EF%BC%8E%EF%BC%8E/admin",
		"lower-case hex":     "/api/echo/%ef%bc%8e%ef%bc%8e/admin",
		"full-width solidus": "/api/echo%EF%BC%8F..%EF%BC%8Fadmin",
		"two dot leader":     "/api/echo/%E2%80%A5/admin",
		"small full stop":    "/api/echo/%EF%B9%92%EF%B9%92/admin",
		"raw UTF-8":          "/api/echo/\uff0e\uff0e/admin",
		"escaped twice":      "/api/echo/%25EF%25BC%258E%25EF%25BC%258E/admin",
	} {
		out, _ := e.curl("-i", "--path-as-is", e.url(path))
		if !hasStatus(out, 400) || !strings.Contains(out, `"error":"bad_request"`) || !strings.Contains(out, "NFKC") {
			t.Errorf("%s: the agent got:\n%s", name, out)
		}
	}
	for _, r := range e.received() {
		if strings.Contains(r.URL.Path, "admin") {
			t.Fatalf("the upstream was sent %q", r.URL.RawPath)
		}
	}
	e.broker.waitAuditWhere(t, 7, "the refusals", func(ev auditEvent) bool {
		return ev["msg"] == "decision" && ev["decision"] == "deny" && fmt.Sprint(ev["status"]) == "400" && strings.Contains(fmt.Sprint(ev["reason"]), "NFKC")
	})
}

// TestConsoleCardShowsWhatIsApproved: in the console, the card of a held request names the
// credentials approving attaches, every query value (a secret scrubbed), and says when the
// body shown is cut.
func TestConsoleCardShowsWhatIsApproved(t *testing.T) {
	b := newBrokerBackend(t)
	ctx := newBrowser(t)
	login(t, ctx, b.adminURL(), b.adminToken())
	body := `{"action":"archive","note":"` + strings.Repeat("x", 3000) + `"}`
	path := "/held/card?force=true&cascade=yes&key=" + b.e.canary
	res := b.request(t, "POST", path, map[string]string{"Content-Type": "application/json"}, body)
	id := pendingID(t, b, "/held/card")
	c := card(id)
	do(t, ctx, chromedp.WaitVisible(chromedp.CSS(c)))
	if got := eval[string](t, ctx, `document.querySelector('`+c+` .credentials').textContent`); got != "Approving attaches the credentials: canary" {
		t.Errorf("credentials line: %q", got)
	}
	text := eval[string](t, ctx, `document.querySelector('`+c+`').textContent`)
	for _, want := range []string{`query force"true"`, `query cascade"yes"`, `query key"[REDACTED]"`, "cut: only its start is shown"} {
		if !strings.Contains(text, want) {
			t.Errorf("the card lacks %q:\n%.600s", want, text)
		}
	}
	if strings.Contains(text, b.e.canary) {
		t.Error("the card shows the secret")
	}
	do(t, ctx, chromedp.Click(chromedp.CSS(c+" button.deny")))
	if r := recv(t, res); r.status != 403 {
		t.Fatalf("denied: %d", r.status)
	}
}
