package integration

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capbroker/capbroker/internal/harness"
)

const agentID = "coder-1"

// testPolicy allows tunnels to 127.0.0.1 (intercepted) and localhost (opaque), grants the
// canary credential under /api/, allows /open/ without one, and denies /admin with a reason.
const testPolicy = `package broker

default decision := {"allow": false, "reason": "not allowed by the test policy"}

# Credentials named at connect time are ignored (nothing is injected then), not a deny.
decision := {"allow": true, "intercept": true, "credentials": ["canary"]} if {
	input.phase == "connect"
	input.request.host == "127.0.0.1"
}

decision := {"allow": true, "intercept": false} if {
	input.phase == "connect"
	input.request.host == "localhost"
}

decision := {"allow": true, "credentials": ["canary"]} if {
	input.phase == "request"
	startswith(input.request.path, "/api/")
}

decision := {"allow": true} if {
	input.phase == "request"
	startswith(input.request.path, "/open/")
}

decision := {"allow": to_number("not a number") > 0} if {
	input.phase == "request"
	startswith(input.request.path, "/broken/")
}

decision := {"allow": true, "credentials": ["vault-kv2", "vault-kv1"]} if {
	input.phase == "request"
	startswith(input.request.path, "/vault/")
}

decision := {"allow": true, "credentials": ["missing"]} if {
	input.phase == "request"
	startswith(input.request.path, "/missing/")
}

decision := {"allow": true, "credentials": ["git"]} if {
	input.phase == "request"
	startswith(input.request.path, "/git/")
}

decision := {"allow": false, "reason": "the /admin area is off limits"} if {
	input.phase == "request"
	startswith(input.request.path, "/admin")
}
`

// env is one test's world: an upstream that records what it received, and a broker.
type env struct {
	t      *testing.T
	pki    *upstreamPKI
	up     *httptest.Server
	broker *brokerProc
	canary string
	token  string

	mu   sync.Mutex
	seen []*http.Request // requests the upstream received
}

type envOpts struct {
	mode         string
	handler      http.Handler // extra routes on the upstream, tried before the default echo
	policy       string
	policyFiles  map[string]string // more files in the policy directory (data), by name
	includeInput bool
	inputLevel   string // audit.include_input when set, over includeInput (bodies_test.go)
	proxy        string // extra proxy config keys
	admin        string // extra admin config keys
	// extraCredentials are appended to the credentials list; extraConfig to the file; env to
	// the broker's environment.
	extraCredentials, extraConfig string
	env                           []string
	gitRoot                       string // serve the bare repositories under this folder at /git/, behind basic auth
	upstreamH2                    bool   // the upstream offers h2 (only) in ALPN instead of http/1.1
	// upstreamConnState, when set, sees the upstream's connection state changes.
	upstreamConnState func(net.Conn, http.ConnState)
}

func newEnv(t *testing.T, o envOpts) *env {
	t.Helper()
	e := &env{t: t, pki: newUpstreamPKI(t), canary: "sk-canary-" + randHex(12), token: randHex(16)}
	mux := http.NewServeMux()
	if o.handler != nil {
		mux.Handle("/api/custom/", o.handler)
		mux.Handle("/vault/", o.handler)
	}
	if o.gitRoot != "" {
		mux.Handle("/git/", e.requireGitAuth(http.StripPrefix("/git", &cgi.Handler{
			Path: gitHTTPBackend(t),
			Env:  []string{"GIT_PROJECT_ROOT=" + o.gitRoot, "GIT_HTTP_EXPORT_ALL=1"},
		})))
	}
	mux.HandleFunc("/", e.echo)
	e.up = e.pki.serve(t, e.record(mux), o.upstreamH2, o.upstreamConnState)
	if o.policy == "" {
		o.policy = testPolicy
	}
	if o.mode == "" {
		o.mode = "enforce"
	}
	e.broker = startBroker(t, brokerOpts{
		policy: o.policy,
		files:  o.policyFiles,
		config: fmt.Sprintf(`upstream:
  ca_file: %q
  allow_private: ["127.0.0.1/32"]
agents:
  - id: %s
    token_env: CODER1_TOKEN
    labels: {team: platform}
credentials:
  - name: canary
    hosts: ["127.0.0.1"]
    source: {env: CANARY_SECRET}
    inject: {header: Authorization, value: "Bearer {{secret}}"}
  - name: git
    hosts: ["127.0.0.1"]
    source: {env: CANARY_SECRET}
    inject: {basic_auth: {username: x-access-token}}
  - name: missing
    hosts: ["127.0.0.1"]
    source: {env: CAPBROKER_TEST_UNSET_SECRET}
    inject: {header: X-Api-Key, value: "{{secret}}"}
%s
audit: {include_input: %v}
%s`, e.pki.File, agentID, o.extraCredentials, o.auditLevel(), o.extraConfig),
		mode:  o.mode,
		proxy: o.proxy,
		admin: o.admin,
		env:   append([]string{"CODER1_TOKEN=" + e.token, "CANARY_SECRET=" + e.canary}, o.env...),
	})
	t.Cleanup(e.assertNoCanaryLeaked)
	return e
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (e *env) record(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.seen = append(e.seen, r.Clone(context.Background()))
		e.mu.Unlock()
		h.ServeHTTP(w, r)
	})
}

func (e *env) received() []*http.Request {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*http.Request(nil), e.seen...)
}

// echo reflects the Authorization header it received in a header and, split across two
// flushed chunks, in the body: the broker must scrub both. With ?whole it answers in one
// piece, with a Content-Length.
func (e *env) echo(w http.ResponseWriter, r *http.Request) {
	auth := r.Header.Get("Authorization")
	w.Header().Set("X-Echo-Authorization", auth)
	w.Header().Set("Content-Type", "text/plain")
	if r.URL.Query().Has("whole") {
		body := fmt.Sprintf("path=%s auth=%s end\n", r.URL.Path, auth)
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = io.WriteString(w, body)
		return
	}
	half := len(auth) / 2
	fmt.Fprintf(w, "path=%s auth=%s", r.URL.Path, auth[:half])
	w.(http.Flusher).Flush()
	fmt.Fprintf(w, "%s end\n", auth[half:])
}

func (e *env) url(path string) string { return e.up.URL + path }

// assertNoCanaryLeaked checks that the secret never reached the audit log or the broker's log.
func (e *env) assertNoCanaryLeaked() {
	_ = e.broker.stop(e.t)
	for name, text := range map[string]string{"audit log": strings.Join(e.broker.auditLog.snapshot(), "\n"), "broker log": e.broker.logs.String()} {
		if strings.Contains(text, e.canary) {
			e.t.Errorf("the canary secret appears in the %s", name)
		}
	}
}

// curl runs curl as the agent: through the broker, trusting the broker's CA.
func (e *env) curl(args ...string) (string, error) {
	e.t.Helper()
	cmd := exec.Command("curl", append([]string{"-sS", "--max-time", "20", "--suppress-connect-headers"}, args...)...)
	proxy := e.broker.proxyURL(agentID, e.token)
	// curl reads only the lower-case http_proxy (httpoxy), and both cases of https_proxy.
	cmd.Env = append(harness.Env(), "HTTPS_PROXY="+proxy, "http_proxy="+proxy, "CURL_CA_BUNDLE="+e.broker.caFile, "NO_PROXY=")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestAllowedRequestGetsCredentialAgentNeverSeesIt(t *testing.T) {
	e := newEnv(t, envOpts{})
	out, err := e.curl("-i", e.url("/api/echo"))
	if err != nil {
		t.Fatalf("curl: %v\n%s", err, out)
	}
	got := e.received()
	if len(got) != 1 || got[0].Header.Get("Authorization") != "Bearer "+e.canary {
		t.Fatalf("upstream did not receive the injected credential: %v", got)
	}
	if got[0].Header.Get("Proxy-Authorization") != "" {
		t.Error("Proxy-Authorization reached the upstream")
	}
	if strings.Contains(out, e.canary) {
		t.Fatalf("the agent saw the secret:\n%s", out)
	}
	if headerValue(out, "X-Echo-Authorization") != "Bearer [REDACTED]" || !strings.Contains(out, "auth=Bearer [REDACTED] end") {
		t.Fatalf("response not scrubbed as expected:\n%s", out)
	}
	// A small body that arrives whole leaves whole: scrubbed with its end, it is sent with
	// an exact Content-Length, in one write, not chunked after a flush.
	whole, err := e.curl("-i", e.url("/api/echo?whole"))
	if err != nil {
		t.Fatalf("curl: %v\n%s", err, whole)
	}
	_, body, _ := strings.Cut(whole, "\r\n\r\n")
	if body != "path=/api/echo auth=Bearer [REDACTED] end\n" || headerValue(whole, "Content-Length") != strconv.Itoa(len(body)) {
		t.Errorf("Content-Length %q for the scrubbed body %q", headerValue(whole, "Content-Length"), body)
	}
	id := headerValue(out, "X-Broker-Request-Id")
	ev := e.broker.waitAudit(t, id)
	if ev["decision"] != "allow" || ev["agent"] != agentID || ev["phase"] != "request" || ev["status"] != float64(200) {
		t.Errorf("audit event: %v", ev)
	}
	if creds, _ := ev["credentials"].([]any); len(creds) != 1 || creds[0] != "canary" {
		t.Errorf("audit credentials: %v", ev["credentials"])
	}
}

// hasStatus reports whether curl -i output starts with a status line for code, whichever
// HTTP version curl negotiated ("HTTP/1.1 403 Forbidden", "HTTP/2 403").
func hasStatus(out string, code int) bool {
	line, _, _ := strings.Cut(out, "\n")
	f := strings.Fields(line)
	return len(f) >= 2 && strings.HasPrefix(f[0], "HTTP/") && f[1] == strconv.Itoa(code)
}

func headerValue(resp, name string) string {
	for _, line := range strings.Split(resp, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(k, name) {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func TestAgentSuppliedCredentialHeaderIsReplaced(t *testing.T) {
	e := newEnv(t, envOpts{})
	out, err := e.curl("-H", "Authorization: Bearer agent-made-this-up", e.url("/api/echo"))
	if err != nil {
		t.Fatalf("curl: %v\n%s", err, out)
	}
	got := e.received()
	if len(got) != 1 || len(got[0].Header.Values("Authorization")) != 1 || got[0].Header.Get("Authorization") != "Bearer "+e.canary {
		t.Fatalf("upstream Authorization: %q", got[0].Header.Values("Authorization"))
	}
}

func TestDeniedRequestGets403JSON(t *testing.T) {
	e := newEnv(t, envOpts{})
	out, err := e.curl("-i", e.url("/admin/users"))
	if err != nil {
		t.Fatalf("curl: %v\n%s", err, out)
	}
	head, body, _ := strings.Cut(out, "\r\n\r\n")
	if !hasStatus(head, 403) || headerValue(head, "Content-Type") != "application/json" {
		t.Fatalf("want 403 JSON, got:\n%s", out)
	}
	var b map[string]string
	if err := json.Unmarshal([]byte(body), &b); err != nil {
		t.Fatalf("body is not JSON: %q", body)
	}
	if b["error"] != "denied" || b["reason"] != "the /admin area is off limits" || b["agent"] != agentID ||
		b["host"] != "127.0.0.1" || b["hint"] == "" || b["request_id"] != headerValue(head, "X-Broker-Request-Id") {
		t.Fatalf("403 body: %v", b)
	}
	if n := len(e.received()); n != 0 {
		t.Fatalf("upstream received %d requests for a denied one", n)
	}
	ev := e.broker.waitAudit(t, b["request_id"])
	if ev["decision"] != "deny" || ev["reason"] != "the /admin area is off limits" || ev["status"] != float64(403) {
		t.Errorf("audit: %v", ev)
	}
}

func TestDeniedConnectGets403BeforeTLS(t *testing.T) {
	e := newEnv(t, envOpts{})
	out, _ := e.curl("-o", "/dev/null", "-w", "%{http_connect}", "https://127.0.0.3:9/")
	if !strings.HasSuffix(out, "403") {
		t.Fatalf("CONNECT to a denied host: want 403, got %q", out)
	}
	ev := e.broker.auditLog.wait(t, `"phase":"connect","method":"CONNECT","scheme":"","host":"127.0.0.3"`)
	if !strings.Contains(ev, `"decision":"deny"`) {
		t.Errorf("audit: %s", ev)
	}
}

func TestNoIdentityGets407(t *testing.T) {
	e := newEnv(t, envOpts{})
	for name, proxy := range map[string]string{
		"no credentials": e.broker.proxyURL("", ""),
		"wrong token":    e.broker.proxyURL(agentID, "not-the-token"),
		"unknown agent":  e.broker.proxyURL("nobody", e.token),
	} {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command("curl", "-sS", "-o", "/dev/null", "-w", "%{http_connect}", "--max-time", "20", e.url("/open/x"))
			cmd.Env = append(harness.Env(), "HTTPS_PROXY="+proxy, "CURL_CA_BUNDLE="+e.broker.caFile)
			out, _ := cmd.Output()
			if !strings.HasSuffix(string(out), "407") {
				t.Fatalf("CONNECT: want 407, got %q", out)
			}
			// Plain HTTP through the proxy: the 407 carries the challenge.
			req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:9/open/x", nil)
			conn, err := net.Dial("tcp", e.broker.proxyAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if name != "no credentials" {
				u, p, _ := strings.Cut(strings.TrimPrefix(strings.Split(proxy, "@")[0], "http://"), ":")
				req.Header.Set("Proxy-Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(u+":"+p)))
			}
			if err := req.WriteProxy(conn); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 407 || resp.Header.Get("Proxy-Authenticate") != `Basic realm="broker"` {
				t.Fatalf("plain HTTP: %d %v", resp.StatusCode, resp.Header)
			}
		})
	}
	if n := len(e.received()); n != 0 {
		t.Fatalf("upstream received %d requests from unidentified agents", n)
	}
}

func TestOpaqueTunnel(t *testing.T) {
	e := newEnv(t, envOpts{})
	// intercept: false for localhost: the agent talks TLS to the upstream itself.
	u := strings.Replace(e.url("/open/tunnel"), "127.0.0.1", "localhost", 1)
	out, err := e.curl("--cacert", e.pki.File, u)
	if err != nil {
		t.Fatalf("curl: %v\n%s", err, out)
	}
	if !strings.Contains(out, "path=/open/tunnel auth= end") {
		t.Fatalf("tunnel response: %q", out)
	}
	line := e.broker.auditLog.wait(t, `"host":"localhost"`)
	var ev auditEvent
	_ = json.Unmarshal([]byte(line), &ev)
	if ev["phase"] != "connect" || ev["decision"] != "allow" || ev["bytes_in"].(float64) == 0 || ev["bytes_out"].(float64) == 0 {
		t.Fatalf("tunnel audit: %v", ev)
	}
}

func TestPython3Client(t *testing.T) {
	e := newEnv(t, envOpts{})
	script := `import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1]).read().decode())`
	cmd := exec.Command("python3", "-c", script, e.url("/api/echo"))
	proxy := e.broker.proxyURL(agentID, e.token)
	cmd.Env = append(harness.Env(), "HTTPS_PROXY="+proxy, "https_proxy="+proxy, "SSL_CERT_FILE="+e.broker.caFile)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "auth=Bearer [REDACTED] end") {
		t.Fatalf("python3 got %q", out)
	}
}

func TestPlainHTTPForwarding(t *testing.T) {
	e := newEnv(t, envOpts{})
	plain := httptest.NewServer(e.record(http.HandlerFunc(e.echo)))
	defer plain.Close()
	out, err := e.curl(plain.URL + "/open/plain")
	if err != nil || !strings.Contains(out, "path=/open/plain") {
		t.Fatalf("plain http: %v %q", err, out)
	}
	// A credential is never sent over plain HTTP, whatever the policy grants.
	out, _ = e.curl("-i", plain.URL+"/api/echo")
	if !hasStatus(out, 403) || !strings.Contains(out, "only sent over HTTPS") {
		t.Fatalf("credential over plain http: %q", out)
	}
	for _, r := range e.received() {
		if r.Header.Get("Authorization") != "" {
			t.Fatalf("a credential went over plain HTTP to %s", r.URL.Path)
		}
	}
}

func TestUpstreamTLSFailureIs502WithoutCredential(t *testing.T) {
	e := newEnv(t, envOpts{})
	var hits int
	var mu sync.Mutex
	untrusted := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { mu.Lock(); hits++; mu.Unlock() }))
	defer untrusted.Close()
	out, _ := e.curl("-i", untrusted.URL+"/api/echo")
	head, body, _ := strings.Cut(out, "\r\n\r\n")
	if !hasStatus(head, 502) || !strings.Contains(body, `"error":"upstream_error"`) {
		t.Fatalf("want 502 upstream_error, got:\n%s", out)
	}
	if strings.Contains(body, "x509") || strings.Contains(body, "certificate") && strings.Contains(body, "unknown authority") {
		t.Errorf("internal error text reached the agent: %s", body)
	}
	mu.Lock()
	defer mu.Unlock()
	if hits != 0 {
		t.Fatal("the untrusted upstream received a request")
	}
}

func TestSSEEventsArriveOneByOne(t *testing.T) {
	next := make(chan struct{})
	sse := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-next: // the agent has read event one
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: two\n\n")
	})
	e := newEnv(t, envOpts{handler: sse})
	resp, err := e.broker.client(t, agentID, e.token).Get(e.url("/api/custom/sse"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	for i, want := range []string{"data: one", "data: two"} {
		line, err := rd.ReadString('\n')
		if err != nil || strings.TrimSpace(line) != want {
			t.Fatalf("event %d: %q %v", i, line, err)
		}
		if _, err := rd.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			close(next) // only now may upstream send event two: event one was not held back
		}
	}
}

// TestWebSocketEcho upgrades to a WebSocket under /api/, where the canary credential is
// injected: the server's frames reach the agent with the canary scrubbed, the agent's frames
// reach the server as they were sent, and the upgrade went without compression offered.
func TestWebSocketEcho(t *testing.T) {
	offered := make(chan []string, 1) // the upgrade's Sec-WebSocket-Extensions, as the server got them
	ws := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			http.Error(w, "want websocket upgrade", 400)
			return
		}
		offered <- r.Header.Values("Sec-WebSocket-Extensions")
		key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
			wsAccept(r.Header.Get("Sec-WebSocket-Key")))
		// A careless server echoes the key it was given, split across two fragments.
		rw.Write(wsFrame(false, 0x1, []byte("your key: "+key[:5]), false))
		rw.Write(wsFrame(true, 0x0, []byte(key[5:]+"\n"), false))
		rw.Flush()
		for { // then echoes the agent's messages (single frames, masked by the agent)
			op, payload, err := readWSFrame(rw.Reader)
			if err != nil || op == 0x8 {
				return
			}
			rw.Write(wsFrame(true, op, payload, false))
			rw.Flush()
		}
	})
	e := newEnv(t, envOpts{handler: ws})
	conn := e.dialTunnel(t, e.up.Listener.Addr().String())
	defer conn.Close()
	fmt.Fprintf(conn, "GET /api/custom/ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n", e.up.Listener.Addr())
	rd := bufio.NewReader(conn)
	resp, err := http.ReadResponse(rd, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	var echoed []byte
	for fin := false; !fin; {
		op, payload, err := readWSFrame(rd)
		if err != nil {
			t.Fatal(err)
		}
		fin = op&0x80 != 0
		echoed = append(echoed, payload...)
	}
	if got := string(echoed); got != "your key: [REDACTED]\n" || strings.Contains(got, e.canary) {
		t.Fatalf("the server's message reached the agent as %q", got)
	}
	if extensions := <-offered; len(extensions) != 0 {
		t.Fatalf("the upgrade offered the server %v: compressed frames could not be scrubbed", extensions)
	}
	for _, msg := range []string{"hello", "second message"} {
		if _, err := conn.Write(wsFrame(true, 0x1, []byte(msg), true)); err != nil {
			t.Fatal(err)
		}
		op, got, err := readWSFrame(rd)
		if err != nil || op != 0x81 || string(got) != msg {
			t.Fatalf("echo: %#x %q %v", op, got, err)
		}
	}
}

// wsFrame is a WebSocket frame; an agent's is masked (with a fixed key: this is a test).
// wsAccept is the Sec-WebSocket-Accept a server answers a key with (RFC 6455 §4.2.2).
func wsAccept(key string) string {
	h := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	return base64.StdEncoding.EncodeToString(h[:])
}

func wsFrame(fin bool, op byte, payload []byte, masked bool) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	if len(payload) > 125 {
		panic("test frames are short")
	}
	if !masked {
		return append([]byte{b0, byte(len(payload))}, payload...)
	}
	key := []byte{1, 2, 3, 4}
	out := append([]byte{b0, 0x80 | byte(len(payload))}, key...)
	for i, c := range payload {
		out = append(out, c^key[i%4])
	}
	return out
}

// readWSFrame reads a short frame, unmasking it if need be; op includes the FIN bit.
func readWSFrame(r *bufio.Reader) (op byte, payload []byte, err error) {
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	var key [4]byte
	if h[1]&0x80 != 0 {
		if _, err := io.ReadFull(r, key[:]); err != nil {
			return 0, nil, err
		}
	}
	n := h[1] & 0x7f
	if n > 125 {
		return 0, nil, fmt.Errorf("frame of %d bytes in a test of short ones", n)
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, err
	}
	if h[1]&0x80 != 0 {
		for i := range payload {
			payload[i] ^= key[i%4]
		}
	}
	return h[0] &^ 0x70, payload, nil
}

// dialTunnel opens an intercepted tunnel by hand: CONNECT, then TLS trusting the broker's CA,
// offering the ALPN protocols alpn (none if empty).
func (e *env) dialTunnel(t *testing.T, hostport string, alpn ...string) *tls.Conn {
	t.Helper()
	raw, err := net.Dial("tcp", e.broker.proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	auth := base64.StdEncoding.EncodeToString([]byte(agentID + ":" + e.token))
	fmt.Fprintf(raw, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", hostport, hostport, auth)
	br := bufio.NewReader(raw)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	pool := x509.NewCertPool()
	pem, _ := os.ReadFile(e.broker.caFile)
	pool.AppendCertsFromPEM(pem)
	host, _, _ := net.SplitHostPort(hostport)
	conn := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: host, NextProtos: alpn})
	if err := conn.Handshake(); err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestTunnelDialsUpstreamDuringHandshake: an intercepted tunnel to a host the broker has no
// connection to opens one while the agent does its TLS handshake, before any request; the
// first request then goes over it, not over a second one.
func TestTunnelDialsUpstreamDuringHandshake(t *testing.T) {
	opened := make(chan net.Addr, 10)
	e := newEnv(t, envOpts{upstreamConnState: func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			opened <- c.RemoteAddr()
		}
	}})
	conn := e.dialTunnel(t, e.up.Listener.Addr().String())
	defer conn.Close()
	select {
	case <-opened:
	case <-time.After(10 * time.Second):
		t.Fatal("no upstream connection was opened before the first request")
	}
	fmt.Fprintf(conn, "GET /open/x HTTP/1.1\r\nHost: %s\r\n\r\n", e.up.Listener.Addr())
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("request in the tunnel: %v %v", resp, err)
	}
	resp.Body.Close()
	if len(opened) != 0 {
		t.Fatalf("the first request opened another upstream connection (%v)", <-opened)
	}
}

func TestTunnelHostMismatchIsDenied(t *testing.T) {
	e := newEnv(t, envOpts{})
	conn := e.dialTunnel(t, e.up.Listener.Addr().String())
	defer conn.Close()
	fmt.Fprintf(conn, "GET /open/x HTTP/1.1\r\nHost: other.example\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || resp.StatusCode != 403 {
		t.Fatalf("want 403 for a Host that is not the CONNECT host: %v %v", resp, err)
	}
	if n := len(e.received()); n != 0 {
		t.Fatalf("upstream received %d requests", n)
	}
}

func TestPolicyHotReload(t *testing.T) {
	e := newEnv(t, envOpts{})
	status := func() string {
		out, _ := e.curl("-o", "/dev/null", "-w", "%{http_code}", e.url("/admin/x"))
		return out
	}
	if got := status(); got != "403" {
		t.Fatalf("before reload: %s", got)
	}
	mark := e.broker.logs.mark()
	e.broker.writePolicy(t, "broker.rego", strings.Replace(testPolicy, `{"allow": false, "reason": "the /admin area is off limits"}`, `{"allow": true}`, 1))
	e.broker.logs.waitFrom(t, mark, `"message":"policy reloaded"`)
	if got := status(); got != "200" {
		t.Fatalf("after reload: %s", got)
	}
	mark = e.broker.logs.mark()
	e.broker.writePolicy(t, "broker.rego", "package broker\n\ndecision := {\n")
	e.broker.logs.waitFrom(t, mark, `"message":"policy reload failed; keeping the last good policy"`)
	if got := status(); got != "200" {
		t.Fatalf("a broken policy file replaced the good one: %s", got)
	}
	metrics, err := http.Get("http://" + e.broker.adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer metrics.Body.Close()
	m, _ := io.ReadAll(metrics.Body)
	for _, want := range []string{`capbroker_policy_reloads_total{result="ok"} 1`, `capbroker_policy_reloads_total{result="error"} 1`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestMonitorModeNeverBlocks(t *testing.T) {
	e := newEnv(t, envOpts{mode: "monitor"})
	out, err := e.curl("-i", e.url("/admin/x"))
	if err != nil || !hasStatus(out, 200) {
		t.Fatalf("monitor mode blocked: %v\n%s", err, out)
	}
	ev := e.broker.waitAudit(t, headerValue(out, "X-Broker-Request-Id"))
	if ev["decision"] != "allow" || ev["would_deny"] != true || ev["policy_mode"] != "monitor" || ev["mode"] != "explicit" {
		t.Fatalf("audit: %v", ev)
	}
	if r := e.received(); len(r) != 1 || r[0].Header.Get("Authorization") != "" {
		t.Fatal("monitor mode sent a credential with a request the policy denied")
	}
}

func TestSIGTERMDrainsInFlightRequests(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		fmt.Fprint(w, "finished")
	})
	e := newEnv(t, envOpts{handler: slow})
	type result struct {
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := e.broker.client(t, agentID, e.token).Get(e.url("/api/custom/slow"))
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		done <- result{string(b), err}
	}()
	<-started
	if err := e.broker.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	e.broker.logs.wait(t, `"message":"draining requests in flight"`)
	close(release)
	r := <-done
	if r.err != nil || r.body != "finished" {
		t.Fatalf("in-flight request during drain: %q %v", r.body, r.err)
	}
	if err := <-e.broker.done; err != nil {
		t.Fatalf("broker exit: %v", err)
	}
	e.broker.done <- nil
}

func gitHTTPBackend(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Fatalf("git --exec-path: %v", err)
	}
	return strings.TrimSpace(string(out)) + "/git-http-backend"
}

// requireGitAuth lets only the injected credential through, as a git host would.
func (e *env) requireGitAuth(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "x-access-token" || p != e.canary {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func TestGitCloneWithInjectedBasicAuth(t *testing.T) {
	root := t.TempDir()
	run := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(harness.Env(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t", "GIT_CONFIG_NOSYSTEM=1", "HOME="+root)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	src := filepath.Join(root, "src")
	run(root, "init", "-q", "-b", "main", src)
	if err := os.WriteFile(filepath.Join(src, "README"), []byte("hello from upstream\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run(src, "add", "README")
	run(src, "commit", "-q", "-m", "first")
	run(root, "clone", "-q", "--bare", src, filepath.Join(root, "repos", "repo.git"))

	e := newEnv(t, envOpts{gitRoot: filepath.Join(root, "repos")})
	dst := filepath.Join(t.TempDir(), "clone")
	cmd := exec.Command("git", "clone", "-q", e.url("/git/repo.git"), dst)
	proxy := e.broker.proxyURL(agentID, e.token)
	cmd.Env = append(harness.Env(), "HTTPS_PROXY="+proxy, "https_proxy="+proxy, "GIT_SSL_CAINFO="+e.broker.caFile,
		"GIT_TERMINAL_PROMPT=0", "GIT_CONFIG_NOSYSTEM=1", "HOME="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git clone through the broker: %v\n%s", err, out)
	}
	got, err := os.ReadFile(filepath.Join(dst, "README"))
	if err != nil || string(got) != "hello from upstream\n" {
		t.Fatalf("cloned README: %q %v", got, err)
	}
	cfg, _ := os.ReadFile(filepath.Join(dst, ".git", "config"))
	if strings.Contains(string(cfg), e.canary) {
		t.Fatal("the secret ended up in the agent's clone")
	}
}

func TestUnavailableCredentialIs503AndNotReady(t *testing.T) {
	e := newEnv(t, envOpts{})
	out, _ := e.curl("-i", e.url("/missing/x"))
	if !hasStatus(out, 503) || !strings.Contains(out, `"error":"credential_unavailable"`) {
		t.Fatalf("want 503 credential_unavailable:\n%s", out)
	}
	if n := len(e.received()); n != 0 {
		t.Fatal("a request was forwarded without the credential its decision granted")
	}
	if out, _ := e.curl("-i", e.url("/api/x")); !hasStatus(out, 200) {
		t.Fatalf("a request granted another credential, while one is unavailable:\n%s", out)
	}
	resp, err := http.Get("http://" + e.broker.adminAddr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Status      string
		Credentials map[string]string
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	// Ready, degraded: every request that does not need the credential is still served.
	if resp.StatusCode != 200 || body.Status != "degraded" || !strings.Contains(body.Credentials["missing"], "CAPBROKER_TEST_UNSET_SECRET") || len(body.Credentials) != 1 {
		t.Fatalf("/readyz: %d %v", resp.StatusCode, body)
	}
	if h, err := http.Get("http://" + e.broker.adminAddr + "/healthz"); err != nil || h.StatusCode != 200 {
		t.Fatalf("/healthz: %v %v", h, err)
	}
}

func TestAuditWrittenWhenClientDisconnects(t *testing.T) {
	stream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "first chunk\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // until the broker gives up on this response
	})
	e := newEnv(t, envOpts{handler: stream})
	resp, err := e.broker.client(t, agentID, e.token).Get(e.url("/api/custom/stream"))
	if err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || line != "first chunk\n" {
		t.Fatalf("first chunk: %q %v", line, err)
	}
	id := resp.Header.Get("X-Broker-Request-Id")
	resp.Body.Close() // the agent goes away mid-response
	ev := e.broker.waitAudit(t, id)
	if ev["decision"] != "allow" || ev["status"] != float64(200) || ev["bytes_out"].(float64) < float64(len("first chunk\n")) {
		t.Fatalf("audit: %v", ev)
	}
}

func TestAuditInputAndMetrics(t *testing.T) {
	e := newEnv(t, envOpts{inputLevel: "full"})
	out, err := e.curl("-i", "-H", "Content-Type: application/json", "-H", "Authorization: Bearer agent-guess", "-H", "X-Trace: t1",
		"--data", `{"model":"m-1","n":2}`, e.url("/api/echo?state=open"))
	if err != nil || !hasStatus(out, 200) {
		t.Fatalf("%v\n%s", err, out)
	}
	ev := e.broker.waitAudit(t, headerValue(out, "X-Broker-Request-Id"))
	in, _ := ev["input"].(map[string]any)
	req, _ := in["request"].(map[string]any)
	headers, _ := req["headers"].(map[string]any)
	body, _ := req["body"].(map[string]any)
	if in["phase"] != "request" || req["method"] != "POST" || req["path"] != "/api/echo" || body["model"] != "m-1" || req["body_size"] != float64(21) {
		t.Fatalf("input: %v", in)
	}
	if headers["x-trace"] != "t1" || headers["authorization"] != nil || headers["proxy-authorization"] != nil {
		t.Fatalf("input headers: %v", headers)
	}
	if creds, _ := in["credentials"].([]any); len(creds) != 3 {
		t.Fatalf("input credentials (bound to the host): %v", in["credentials"])
	}
	if got := e.received(); len(got) != 1 {
		t.Fatal("upstream did not get the request")
	} else if b, _ := io.ReadAll(got[0].Body); false {
		_ = b
	}
	// Metrics count decisions by phase and outcome.
	e.curl(e.url("/admin/x"))
	m, err := http.Get("http://" + e.broker.adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Body.Close()
	text, _ := io.ReadAll(m.Body)
	for _, want := range []string{
		`capbroker_requests_total{decision="allow",phase="request"} 1`,
		`capbroker_requests_total{decision="deny",phase="request"} 1`,
		`capbroker_requests_total{decision="allow",phase="connect"} 2`,
		`capbroker_request_duration_seconds_count{phase="request"} 2`,
		`capbroker_cert_cache_entries 1`,
		`capbroker_audit_events_lost_total 0`,
	} {
		if !strings.Contains(string(text), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestRedirectIsPassedBackScrubbed(t *testing.T) {
	var e *env
	redirect := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A careless upstream puts the key it received into the Location it sends back.
		http.Redirect(w, r, "https://other.example/next?token="+strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "), http.StatusFound)
	})
	e = newEnv(t, envOpts{handler: redirect})
	out, err := e.curl("-i", e.url("/api/custom/redirect"))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !hasStatus(out, 302) || headerValue(out, "Location") != "https://other.example/next?token=[REDACTED]" {
		t.Fatalf("redirect: want the 302 with a scrubbed Location:\n%s", out)
	}
	if n := len(e.received()); n != 1 {
		t.Fatalf("upstream saw %d requests; the broker must not follow redirects", n)
	}
}

func TestPrivateDestinationRefusedAtDial(t *testing.T) {
	e := newEnv(t, envOpts{})
	// A listener on 127.0.0.2, which is loopback but not in upstream.allow_private.
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("cannot listen on 127.0.0.2: %v", err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- struct{}{}
			c.Close()
		}
	}()
	out, _ := e.curl("-i", "http://"+ln.Addr().String()+"/open/x")
	if !hasStatus(out, 502) || !strings.Contains(out, `"error":"upstream_error"`) || strings.Contains(out, "not allowed") {
		t.Fatalf("want an opaque 502:\n%s", out)
	}
	ev := e.broker.waitAudit(t, headerValue(out, "X-Broker-Request-Id"))
	if !strings.Contains(ev["error"].(string), "destination address not allowed (loopback)") {
		t.Fatalf("audit error: %v", ev["error"])
	}
	ln.Close() // ends Accept; a connection that had reached it would already be in the channel
	select {
	case <-accepted:
		t.Fatal("the broker connected to a refused address")
	default:
	}
}

// TestQuietTunnelKeepsServing: curl makes three requests on one intercepted HTTP/1.1 tunnel,
// a quarter of a second apart: longer than a quiet tunnel stays with net/http before the
// broker parks it (broker.parkAfter, 100 ms). Each request after a pause is read by a parked
// tunnel, and is still decided, injected and scrubbed; the agent's connection is reused.
func TestQuietTunnelKeepsServing(t *testing.T) {
	e := newEnv(t, envOpts{})
	u := e.url("/api/echo")
	out, err := e.curl("--http1.1", "--rate", "4/s", "-w", "\nconnects=%{num_connects} status=%{http_code}\n", u, u, u)
	if err != nil {
		t.Fatalf("curl: %v\n%s", err, out)
	}
	if n := strings.Count(out, "auth=Bearer [REDACTED] end"); n != 3 {
		t.Errorf("%d scrubbed answers, want 3:\n%s", n, out)
	}
	if c := strings.Count(out, "connects=1 status=200"); c != 1 || strings.Count(out, "connects=0 status=200") != 2 {
		t.Errorf("want one connection for three 200s:\n%s", out)
	}
	got := e.received()
	if len(got) != 3 {
		t.Fatalf("upstream received %d requests, want 3", len(got))
	}
	for _, r := range got {
		if r.Header.Get("Authorization") != "Bearer "+e.canary {
			t.Fatal("a request after a pause left without its credential")
		}
	}
	e.assertNoCanaryLeaked()
}
