package integration

// Request smuggling through the broker's upstream connections (issue 18, finding 1): an
// upstream that ignores a GET's body and keeps the connection open reads that body as the
// next request. Were the connection reused, every later response on it would answer the
// request before: a response meant for one request, agent or credential set would reach
// another. The upstream here is Python's http.server, which does exactly that.

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capbroker/capbroker/internal/harness"
)

// smugglePolicy intercepts tunnels to 127.0.0.1, allows /nocred/ without a credential and
// grants the canary credential to /echo.
const smugglePolicy = `package broker

default decision := {"allow": false, "reason": "not allowed by the smuggling test policy"}

decision := {"allow": true, "intercept": true} if {
	input.phase == "connect"
	input.request.host == "127.0.0.1"
}

decision := {"allow": true} if {
	input.phase == "request"
	startswith(input.request.path, "/nocred/")
}

decision := {"allow": true, "credentials": ["canary"]} if {
	input.phase == "request"
	input.request.path == "/echo"
}
`

// smuggleUpstream is Python's http.server over TLS, HTTP/1.1 with keep-alive. It answers every
// GET and POST with "path=<path>" and the request's header lines, and never reads a body; it
// prints each request line it parses, so the test sees what the upstream took for requests.
// A path with "slow" in it is answered after half a second: an upstream slow to answer a
// request hidden in a body, whose answer comes after the broker has checked the connection.
const smuggleUpstream = `
import http.server, ssl, sys, time

class Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        print("REQUEST " + self.requestline, flush=True)
        if "slow" in self.path:
            time.sleep(0.5)
        body = ("path=" + self.path + "\n" + str(self.headers)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args):
        pass

ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
ctx.set_alpn_protocols(["http/1.1"])
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
srv.daemon_threads = True
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print("PORT %d" % srv.server_address[1], flush=True)
srv.serve_forever()
`

// smuggleEnv is a Python upstream and a broker with two agents, a and b.
type smuggleEnv struct {
	up     string   // the upstream's host:port
	log    *logTail // the upstream's stdout: one "REQUEST <line>" per request it parsed
	broker *brokerProc
	canary string
	tokens map[string]string
}

func newSmuggleEnv(t *testing.T) *smuggleEnv {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not found")
	}
	pki := newUpstreamPKI(t)
	dir := t.TempDir()
	certFile, keyFile, script := filepath.Join(dir, "leaf.pem"), filepath.Join(dir, "leaf.key"), filepath.Join(dir, "upstream.py")
	key, err := x509.MarshalPKCS8PrivateKey(pki.Leaf.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		certFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pki.Leaf.Certificate[0]}),
		keyFile:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}),
		script:   []byte(smuggleUpstream),
	} {
		if err := os.WriteFile(name, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := &smuggleEnv{log: newLogTail(), canary: "sk-canary-" + randHex(12),
		tokens: map[string]string{"agent-a": randHex(16), "agent-b": randHex(16)}}
	py := exec.Command("python3", "-u", script, certFile, keyFile)
	py.Env = harness.Env()
	py.Stdout, py.Stderr = s.log, s.log
	if err := py.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = py.Wait()
		// waitLines fails at once on a line with this prefix, rather than time out.
		s.log.Write([]byte("broker process exited: the python upstream ended\n"))
		close(exited)
	}()
	t.Cleanup(func() {
		_ = py.Process.Kill()
		<-exited
	})
	s.up = "127.0.0.1:" + strings.TrimPrefix(s.log.wait(t, "PORT "), "PORT ")

	s.broker = startBroker(t, brokerOpts{
		policy: smugglePolicy,
		mode:   "enforce",
		config: canaryConfig(pki.File, []string{"agent-a", "agent-b"}, ""),
		env:    []string{"AGENT_A_TOKEN=" + s.tokens["agent-a"], "AGENT_B_TOKEN=" + s.tokens["agent-b"], "CANARY_SECRET=" + s.canary},
	})
	t.Cleanup(func() {
		_ = s.broker.stop(t)
		for name, text := range map[string]string{"audit log": strings.Join(s.broker.auditLog.snapshot(), "\n"), "broker log": s.broker.logs.String()} {
			if strings.Contains(text, s.canary) {
				t.Errorf("the canary secret appears in the %s", name)
			}
		}
	})
	return s
}

// smuggleTunnel is one agent's intercepted HTTP/1.1 tunnel to the upstream.
type smuggleTunnel struct {
	agent string
	conn  *tls.Conn
	br    *bufio.Reader
}

func (s *smuggleEnv) tunnel(t *testing.T, agent string) *smuggleTunnel {
	t.Helper()
	raw, err := net.Dial("tcp", s.broker.proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	_ = raw.SetDeadline(time.Now().Add(waitTimeout))
	auth := base64.StdEncoding.EncodeToString([]byte(agent + ":" + s.tokens[agent]))
	fmt.Fprintf(raw, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", s.up, s.up, auth)
	resp, err := http.ReadResponse(bufio.NewReader(raw), &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%s: CONNECT: %v %v", agent, resp, err)
	}
	conn := tls.Client(raw, &tls.Config{RootCAs: s.broker.caPool(t), ServerName: "127.0.0.1", NextProtos: []string{"http/1.1"}})
	if err := conn.Handshake(); err != nil {
		t.Fatal(err)
	}
	return &smuggleTunnel{agent: agent, conn: conn, br: bufio.NewReader(conn)}
}

// get sends a GET for path, with body when it is not "", and returns the whole response:
// status, headers and body as one string.
func (tu *smuggleTunnel) get(t *testing.T, path, body string) string {
	t.Helper()
	return tu.do(t, http.MethodGet, path, body)
}

func (tu *smuggleTunnel) do(t *testing.T, method, path, body string) string {
	t.Helper()
	req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n", method, path)
	if body != "" {
		req += fmt.Sprintf("Content-Length: %d\r\n", len(body))
	}
	if _, err := io.WriteString(tu.conn, req+"\r\n"+body); err != nil {
		t.Fatalf("%s: %s %s: %v", tu.agent, method, path, err)
	}
	resp, err := http.ReadResponse(tu.br, nil)
	if err != nil {
		t.Fatalf("%s: %s %s: reading the response: %v", tu.agent, method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: %s %s: reading the body: %v", tu.agent, method, path, err)
	}
	var head strings.Builder
	_ = resp.Header.Write(&head)
	return fmt.Sprintf("%d\n%s\n%s", resp.StatusCode, head.String(), b)
}

// smuggled is a request hidden in the body of a GET: the upstream reads it as the next request.
func smuggled(path string) string {
	return "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
}

// answers checks that got is the upstream's answer to path (its echo names the path), with
// no canary in it.
func (s *smuggleEnv) answers(t *testing.T, who, got, path string) {
	t.Helper()
	if strings.Contains(got, s.canary) {
		t.Errorf("%s: the response carries the credential:\n%s", who, got)
	}
	if !strings.HasPrefix(got, "200\n") || !strings.Contains(got, "\npath="+path+"\n") {
		t.Errorf("%s: want the answer to %s, got:\n%s", who, path, got)
	}
}

// upstreamSaw waits until the upstream has parsed n requests, and returns every request line
// it has parsed (a hidden request it took for one is parsed before the next real one).
func (s *smuggleEnv) upstreamSaw(t *testing.T, n int) []string {
	t.Helper()
	isRequest := func(l string) bool { return strings.HasPrefix(l, "REQUEST ") }
	s.log.waitLines(t, 0, n, "upstream request lines", isRequest)
	var lines []string
	for _, l := range s.log.snapshot() {
		if isRequest(l) {
			lines = append(lines, l)
		}
	}
	return lines
}

// TestSmuggledGETBodyOneAgent: GET /nocred/a carries a second request as its body, then the
// agent asks for /echo (granted the credential) and /nocred/b (none). Each answer must be the
// answer to the request it came back for: on a shared, reused connection the third response
// was the echo of the second request, credential in clear.
func TestSmuggledGETBodyOneAgent(t *testing.T) {
	s := newSmuggleEnv(t)
	tu := s.tunnel(t, "agent-a")
	s.answers(t, "first", tu.get(t, "/nocred/a", smuggled("/nocred/smuggled")), "/nocred/a")
	echo := tu.get(t, "/echo", "")
	s.answers(t, "second", echo, "/echo")
	if !strings.Contains(echo, "Authorization: Bearer [REDACTED]") {
		t.Errorf("the /echo request did not carry the (scrubbed) credential:\n%s", echo)
	}
	s.answers(t, "third", tu.get(t, "/nocred/b", ""), "/nocred/b")

	want := []string{"REQUEST GET /nocred/a HTTP/1.1", "REQUEST GET /echo HTTP/1.1", "REQUEST GET /nocred/b HTTP/1.1"}
	if got := s.upstreamSaw(t, 3); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the upstream parsed:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// The audit log records the three requests the broker decided, the credential on /echo only.
	byPath := map[any]auditEvent{}
	for _, ev := range s.broker.waitAuditWhere(t, 3, "request events", func(ev auditEvent) bool { return ev["phase"] == "request" }) {
		byPath[ev["path"]] = ev
	}
	for _, path := range []string{"/nocred/a", "/echo", "/nocred/b"} {
		ev := byPath[path]
		creds, _ := ev["credentials"].([]any)
		if ev["agent"] != "agent-a" || ev["status"] != float64(200) || (len(creds) == 1) != (path == "/echo") {
			t.Errorf("audit event for %s: %v", path, ev)
		}
	}
}

// TestSmuggledGETBodyTwoAgents: agents a and b take turns on the same upstream host, each
// hiding requests in GET bodies; neither may receive an answer to the other's request (nor
// to a hidden one), with or without a credential.
func TestSmuggledGETBodyTwoAgents(t *testing.T) {
	s := newSmuggleEnv(t)
	a, b := s.tunnel(t, "agent-a"), s.tunnel(t, "agent-b")
	sent := 0
	for i := range 3 {
		for _, tu := range []*smuggleTunnel{a, b} {
			own := fmt.Sprintf("/nocred/%s-%d", tu.agent, i)
			s.answers(t, tu.agent, tu.get(t, own, smuggled(own+"-smuggled")), own)
			s.answers(t, tu.agent, tu.get(t, "/echo", smuggled("/echo?smuggled-"+tu.agent)), "/echo")
			s.answers(t, tu.agent, tu.get(t, own+"-plain", ""), own+"-plain")
			sent += 3
		}
	}
	got := s.upstreamSaw(t, sent)
	if len(got) != sent || strings.Contains(strings.Join(got, "\n"), "smuggled") {
		t.Errorf("the upstream parsed %d requests, want the %d sent and none hidden in a body:\n%s", len(got), sent, strings.Join(got, "\n"))
	}
}

// TestSmuggledPOSTBodyStaysInItsPool: a POST's body hides a request too, to an upstream
// that answers the POST without reading it. A POST's framing is one the broker vouches for (a
// POST has a body), so its connection goes back to the pool; the hidden request's answer
// comes late, after the next request has taken the connection. That next request may only
// be one of the same agent with the same credentials: another agent's request, or this
// agent's request granted a credential, gets its own answer.
func TestSmuggledPOSTBodyStaysInItsPool(t *testing.T) {
	s := newSmuggleEnv(t)
	a, b := s.tunnel(t, "agent-a"), s.tunnel(t, "agent-b")
	s.answers(t, "b, warming its pool", b.get(t, "/nocred/b-0", ""), "/nocred/b-0")

	s.answers(t, "a's POST", a.do(t, http.MethodPost, "/nocred/a-post", smuggled("/nocred/slow-smuggled-a")), "/nocred/a-post")
	s.answers(t, "b after a's POST", b.get(t, "/nocred/b-1", ""), "/nocred/b-1")
	echo := a.get(t, "/echo", "")
	s.answers(t, "a's /echo after its POST", echo, "/echo")
	if !strings.Contains(echo, "Authorization: Bearer [REDACTED]") {
		t.Errorf("the /echo request did not carry the (scrubbed) credential:\n%s", echo)
	}
	// Within a's pool without a credential, the hidden request's answer may come back to the
	// next request: it is a's own, and carries nothing a's request could not have.
	next := a.get(t, "/nocred/a-next", "")
	if !strings.Contains(next, "\npath=/nocred/a-next\n") {
		s.answers(t, "a's next request, in its own pool", next, "/nocred/slow-smuggled-a")
	}
}

// TestUpstreamConnectionReusedWithinPool: what the pool fix must not cost. Requests without a
// body keep one upstream connection per pool, also when the agent speaks HTTP/2 (its GETs
// carry a Body that reads EOF at once): three GETs without a credential share the connection
// dialled during the agent's handshake, and two granted the credential share a second one.
func TestUpstreamConnectionReusedWithinPool(t *testing.T) {
	var opened atomic.Int32
	e := newEnv(t, envOpts{upstreamConnState: func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			opened.Add(1)
		}
	}})
	cc := e.h2Conn(t)
	for _, path := range []string{"/open/1", "/open/2", "/open/3", "/api/echo", "/api/echo"} {
		resp, err := cc.RoundTrip(e.h2Request(t, http.MethodGet, path, nil))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !strings.Contains(string(b), "path="+path) {
			t.Fatalf("GET %s: %d %q %v", path, resp.StatusCode, b, err)
		}
	}
	if n := opened.Load(); n != 2 {
		t.Fatalf("the upstream saw %d connections, want 2: one per pool", n)
	}
}
