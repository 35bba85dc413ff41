package integration

// Paths: the upstream is sent exactly the path the policy decided on. The agent attacks a
// policy that allows reading /v1/models with a key, as the review did (/v1/models/../files
// served /v1/files with the key), against an upstream that reads paths as leniently as real
// servers do; the broker is driven with the naive policy of the finding and with the shipped
// llm.rego.

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// naivePathPolicy grants the canary credential to anything whose path starts with
// /v1/models, the way llm.rego matched read paths when the review found the hole.
const naivePathPolicy = `package broker

default decision := {"allow": false, "reason": "only /v1/models may be read"}

decision := {"allow": true, "intercept": true} if {
	input.phase == "connect"
	input.request.host == "127.0.0.1"
}

decision := {"allow": true, "credentials": ["canary"]} if {
	input.phase == "request"
	input.request.method in {"GET", "HEAD"}
	startswith(input.request.path, "/v1/models")
}
`

// shippedLLMPolicy hands request decisions for 127.0.0.1 to the shipped llm.rego, which the
// test adds with paths.rego and its settings once the broker runs (data.llm is undefined
// until then, and every request is denied).
const shippedLLMPolicy = `package broker

default decision := {"allow": false, "reason": "not governed by llm.rego"}

decision := {"allow": true, "intercept": true} if {
	input.phase == "connect"
	input.request.host == "127.0.0.1"
}

decision := data.llm.decision if {
	input.phase == "request"
	data.settings.llm[input.request.host]
}
`

// llmSettings is data.settings.llm for the shipped llm.rego: the test upstream as a provider.
const llmSettings = `llm:
  127.0.0.1:
    credential: canary
    endpoints: [/v1/chat/completions]
    models: [gpt-4.1*]
    read_paths: [/v1/models]
`

// lenientPath is the path a lenient server routes on: every escape decoded (twice, as some
// do), '\' read as '/' (IIS), ";" parameters dropped (Tomcat, Jetty, Spring), then slashes
// merged and dot-segments resolved (nginx).
func lenientPath(p string) string {
	for range 2 {
		if d, err := url.PathUnescape(p); err == nil {
			p = d
		}
	}
	p = strings.ReplaceAll(p, `\`, "/")
	segs := strings.Split(p, "/")
	for i, s := range segs {
		segs[i], _, _ = strings.Cut(s, ";")
	}
	return path.Clean(strings.Join(segs, "/"))
}

// newPathsEnv starts an upstream that records the request-target it receives (RequestURI) and
// serves lenientPath of it, and a broker with the policy.
func newPathsEnv(t *testing.T, policy string) *env {
	t.Helper()
	e := &env{t: t, pki: newUpstreamPKI(t), canary: "sk-canary-" + randHex(12), token: randHex(16)}
	e.up = e.pki.serve(t, e.record(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		target, _, _ := strings.Cut(r.RequestURI, "?")
		served := lenientPath(target)
		w.Header().Set("X-Request-Target", r.RequestURI)
		w.Header().Set("X-Served-Path", served)
		if served == "/v1/files" && r.Header.Get("Authorization") != "" {
			io.WriteString(w, "the account's files, served with the key\n")
			return
		}
		fmt.Fprintf(w, "served %s\n", served)
	})), false, nil)
	e.broker = startBroker(t, brokerOpts{
		policy: policy,
		mode:   "enforce",
		config: canaryConfig(e.pki.File, []string{agentID}, "audit: {include_input: true}\n"),
		env:    []string{tokenEnv(agentID) + "=" + e.token, "CANARY_SECRET=" + e.canary},
	})
	t.Cleanup(e.assertNoCanaryLeaked)
	return e
}

// addShippedLLM puts the shipped llm.rego and paths.rego, and llmSettings, into the broker's
// policy directory in one rename (as data.settings), and waits for the reload.
func addShippedLLM(t *testing.T, b *brokerProc) {
	t.Helper()
	tmp := filepath.Join(b.dir, "settings.tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"llm.rego", "paths.rego"} {
		src, err := os.ReadFile(filepath.Join("..", "policies", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tmp, name), src, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, "data.yaml"), []byte(llmSettings), 0o644); err != nil {
		t.Fatal(err)
	}
	mark := b.logs.mark()
	if err := os.Rename(tmp, filepath.Join(b.policyDir, "settings")); err != nil {
		t.Fatal(err)
	}
	b.logs.waitFrom(t, mark, `"message":"policy reloaded"`)
}

// sendRaw sends one request, as written, in a new intercepted tunnel and returns the response
// with its body read.
func (e *env) sendRaw(t *testing.T, head string) (*http.Response, string) {
	t.Helper()
	conn := e.rawTunnel(t, "127.0.0.1")
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(waitTimeout))
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the response to %q: %v", head, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}

// pathCase is one request and what each policy makes of it: the status, and for an allowed
// request the request-target the upstream must receive.
type pathCase struct {
	head           string // the request line's method and target, or the whole request head when it has "\r\n"
	naive, shipped int
	target         string
}

var pathCases = map[string]pathCase{
	"list models":                           {"GET /v1/models", 200, 200, "/v1/models"},
	"read a model":                          {"GET /v1/models/gpt-4.1", 200, 200, "/v1/models/gpt-4.1"},
	"the finding: dot-dot":                  {"GET /v1/models/../files", 403, 403, ""},
	"the finding: encoded dot-dot":          {"GET /v1/models/%2e%2e/files", 403, 403, ""},
	"encoded dot-dot, mixed case":           {"GET /v1/models/%2E%2e/files", 403, 403, ""},
	"half-encoded dot-dot":                  {"GET /v1/models/.%2e/files", 403, 403, ""},
	"dot-dot behind an encoded slash":       {"GET /v1/models/..%2Ffiles", 400, 400, ""},
	"dot-dot between encoded slashes":       {"GET /v1/models%2f..%2ffiles", 400, 400, ""},
	"double-encoded dot-dot":                {"GET /v1/models/%252e%252e/files", 400, 400, ""},
	"dot-dot with a path parameter":         {"GET /v1/models/..;/files", 400, 400, ""},
	"path parameter":                        {"GET /v1/models;jsessionid=x", 400, 400, ""},
	"backslashes":                           {`GET /v1/models\..\files`, 400, 400, ""},
	"encoded backslashes":                   {"GET /v1/models/..%5Cfiles", 400, 400, ""},
	"dot-dot above the root":                {"GET /../v1/models", 400, 400, ""},
	"NUL":                                   {"GET /v1/models/%00", 400, 400, ""},
	"dot-dot resolved inside the read path": {"GET /v1/models/x/../gpt-4.1", 200, 200, "/v1/models/gpt-4.1"},
	"dot-dot through an empty segment":      {"GET /v1/models//../gpt-4.1", 200, 200, "/v1/models/gpt-4.1"},
	"unreserved escapes decoded":            {"GET /v1/%6dodels/%67pt-4.1", 200, 200, "/v1/models/gpt-4.1"},
	"double slash kept":                     {"GET /v1/models//gpt-4.1", 200, 403, "/v1/models//gpt-4.1"},
	"double slash before the read path":     {"GET /v1//models", 403, 403, ""},
	"encoded slash kept":                    {"GET /v1/models/a%2fb", 200, 403, "/v1/models/a%2Fb"},
	"a prefix of the read path":             {"GET /v1/modelsx", 200, 403, "/v1/modelsx"},
	"query kept as sent":                    {"GET /v1/models?a=%2e%2e&b=x+y", 200, 200, "/v1/models?a=%2e%2e&b=x+y"},
	"query with ';' pairs":                  {"GET /v1/models?a=1;b=2", 400, 400, ""},
	"query with a bad escape":               {"GET /v1/models?a=%zz", 400, 400, ""},
	"_method in the query":                  {"GET /v1/models?_method=DELETE", 400, 400, ""},
	"method override header":                {"GET /v1/models HTTP/1.1\r\nHost: H\r\nX-HTTP-Method-Override: DELETE\r\n\r\n", 400, 400, ""},
	"method override naming its own method": {"GET /v1/models HTTP/1.1\r\nHost: H\r\nX-HTTP-Method-Override: GET\r\n\r\n", 200, 200, "/v1/models"},
	"X-Original-URL":                        {"GET /v1/models HTTP/1.1\r\nHost: H\r\nX-Original-URL: /v1/files\r\n\r\n", 400, 400, ""},
	"opaque request-target":                 {"GET x:foo", 400, 400, ""},
	"opaque http request-target":            {"GET https:v1/models", 400, 400, ""},
	"asterisk request-target":               {"GET *", 400, 400, ""}, // OPTIONS * net/http answers itself
	"absolute form":                         {"GET https://H/v1/models/../models/gpt-4.1", 200, 200, "/v1/models/gpt-4.1"},
	"absolute form without a path":          {"GET https://H", 403, 403, ""},
	"absolute form with dot-dot":            {"GET https://H/v1/models/%2e%2e/files", 403, 403, ""},
}

func TestPathsReachUpstreamAsDecided(t *testing.T) {
	for _, shipped := range []bool{false, true} {
		name := "naive policy"
		if shipped {
			name = "shipped llm.rego"
		}
		t.Run(name, func(t *testing.T) {
			e := newPathsEnv(t, naivePathPolicy)
			if shipped {
				e = newPathsEnv(t, shippedLLMPolicy)
				addShippedLLM(t, e.broker)
			}
			host := e.up.Listener.Addr().String()
			for name, c := range pathCases {
				t.Run(name, func(t *testing.T) {
					want := c.naive
					if shipped {
						want = c.shipped
					}
					e.checkPath(t, host, c, want)
				})
			}
			e.checkUpstreamSawOnlyDecidedPaths(t)
		})
	}
}

// checkPath sends c and checks the agent's answer, the audit event and what the upstream got.
func (e *env) checkPath(t *testing.T, host string, c pathCase, want int) {
	head := strings.ReplaceAll(c.head, "://H", "://"+host)
	if !strings.Contains(head, "\r\n") {
		head += " HTTP/1.1\r\nHost: H\r\n\r\n"
	}
	head = strings.Replace(head, "Host: H\r\n", "Host: "+host+"\r\n", 1)
	before := len(e.received())
	resp, body := e.sendRaw(t, head)
	if resp.StatusCode != want {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, want, body)
	}
	if strings.Contains(body, "served with the key") || strings.Contains(body, e.canary) {
		t.Fatalf("the upstream served /v1/files with the key: %s", body)
	}
	ev := e.broker.waitAudit(t, resp.Header.Get("X-Broker-Request-Id"))
	in, _ := ev["input"].(map[string]any)
	req, _ := in["request"].(map[string]any)
	got := e.received()[before:]
	switch want {
	case 200:
		// The upstream received exactly the path the audit event records, which is the
		// path the policy saw; the policy also saw the agent's.
		if len(got) != 1 || got[0].Header.Get("Authorization") != "Bearer "+e.canary {
			t.Fatalf("upstream received %d requests, want 1 with the credential", len(got))
		}
		target := got[0].RequestURI
		if target != c.target || resp.Header.Get("X-Request-Target") != target {
			t.Fatalf("upstream received %q, want %q", target, c.target)
		}
		p, _, _ := strings.Cut(target, "?")
		if ev["path"] != p || req["path"] != p {
			t.Fatalf("upstream received %q; audit path %v, input.request.path %v", target, ev["path"], req["path"])
		}
		sent := strings.Fields(head)[1]
		if u, err := url.ParseRequestURI(sent); err == nil && u.Host == "" {
			if raw, _, _ := strings.Cut(sent, "?"); req["raw_path"] != raw {
				t.Fatalf("input.request.raw_path %v, want %q", req["raw_path"], raw)
			}
		}
		if ev["decision"] != "allow" {
			t.Fatalf("audit: %v", ev)
		}
	case 400:
		// Refused before the policy: no input recorded, the reason in the answer (in OpenAI's
		// error shape where the path is OpenAI's: errors.go shapeFor).
		coded := strings.Contains(body, `"error":"bad_request"`) || strings.Contains(body, `"code":"bad_request"`)
		if len(got) != 0 || in != nil || !coded || strings.Contains(body, "could not be processed") {
			t.Fatalf("upstream received %d requests; input %v; answer %s", len(got), in, body)
		}
	default:
		if len(got) != 0 || ev["decision"] != "deny" {
			t.Fatalf("upstream received %d requests; audit %v", len(got), ev)
		}
	}
}

// checkUpstreamSawOnlyDecidedPaths: every request the upstream received, read as leniently as
// it reads them, is under the read path; none was /v1/files.
func (e *env) checkUpstreamSawOnlyDecidedPaths(t *testing.T) {
	for _, r := range e.received() {
		target, _, _ := strings.Cut(r.RequestURI, "?")
		if served := lenientPath(target); !strings.HasPrefix(served, "/v1/models") {
			t.Errorf("the upstream received %q and served %q with the credential", r.RequestURI, served)
		}
	}
}

// TestPathAsIsWithCurl: curl, told not to resolve dot-segments itself, is the agent.
func TestPathAsIsWithCurl(t *testing.T) {
	e := newPathsEnv(t, naivePathPolicy)
	for p, want := range map[string]string{
		"/v1/models/../files":     "403",
		"/v1/models/%2e%2e/files": "403",
		"/v1/models/..%2ffiles":   "400",
		"/v1/models/./gpt-4.1":    "200 /v1/models/gpt-4.1",
	} {
		out, err := e.curl("--path-as-is", "-o", "/dev/null", "-w", "%{http_code} %header{x-request-target}", e.url(p))
		if err != nil || strings.TrimSpace(out) != want {
			t.Errorf("%s: %q %v, want %q", p, out, err, want)
		}
	}
	e.checkUpstreamSawOnlyDecidedPaths(t)
	if n := len(e.received()); n != 1 {
		t.Errorf("upstream received %d requests, want 1", n)
	}
}

// TestPathsOverHTTP2: a stream's :path is normalised and checked as a request line is.
func TestPathsOverHTTP2(t *testing.T) {
	e := newPathsEnv(t, naivePathPolicy)
	cc := e.h2Conn(t)
	for p, want := range map[string]struct {
		status int
		target string
	}{
		"/v1/models/%2e%2e/files": {403, ""},
		"/v1/models/..;/files":    {400, ""},
		"/v1/models/..%2Ffiles":   {400, ""},
		"/v1/models/./gpt-4.1":    {200, "/v1/models/gpt-4.1"},
	} {
		resp, err := cc.RoundTrip(e.h2Request(t, http.MethodGet, p, nil))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want.status || resp.ProtoMajor != 2 || resp.Header.Get("X-Request-Target") != want.target {
			t.Errorf("%s: %d %s, target %q; want %d, %q", p, resp.StatusCode, body, resp.Header.Get("X-Request-Target"), want.status, want.target)
		}
	}
	e.checkUpstreamSawOnlyDecidedPaths(t)
}
