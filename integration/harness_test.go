// Package integration drives the real broker binary, as an agent would, against real TLS
// upstreams on loopback: curl, python3 and Go clients through HTTPS_PROXY with the broker's CA.
package integration

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
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
	"github.com/capbroker/capbroker/internal/testpki"
)

var brokerBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "capbroker-it-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	brokerBin = filepath.Join(dir, "broker")
	build := exec.Command("go", "build", "-o", brokerBin, "../cmd/broker")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building broker:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// waitTimeout bounds every wait on the broker; a test that hits it has failed.
const waitTimeout = 30 * time.Second

// upstreamPKI is a private CA for the test upstreams, trusted by the broker via upstream.ca_file.
type upstreamPKI struct{ *testpki.PKI }

func newUpstreamPKI(t *testing.T) *upstreamPKI {
	return &upstreamPKI{testpki.New(t, "test upstream CA")}
}

// issue makes a leaf from the PKI's CA for name, valid until notAfter.
func (p *upstreamPKI) issue(t *testing.T, name string, notAfter time.Time) tls.Certificate {
	return p.Server(t, notAfter, name)
}

// serve starts a TLS upstream on 127.0.0.1 with a certificate from the PKI. It offers only
// http/1.1 in ALPN, or with h2 only h2.
func (p *upstreamPKI) serve(t *testing.T, h http.Handler, h2 bool, connState func(net.Conn, http.ConnState)) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{p.Leaf}}
	srv.EnableHTTP2 = h2
	srv.Config.ConnState = connState
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// brokerProc is a running broker binary.
type brokerProc struct {
	cmd       *exec.Cmd
	dir       string
	proxyAddr string
	adminAddr string
	caFile    string
	policyDir string
	logs      *logTail // stderr: operational log
	auditLog  *logTail // stdout: audit events
	done      chan error
}

type brokerOpts struct {
	config string            // YAML after the generated proxy/admin/ca/policy/audit sections
	policy string            // broker.rego content
	files  map[string]string // more files for the policy dir, by name
	mode   string            // policy.mode
	proxy  string            // extra proxy keys, e.g. "max_connections_per_agent: 2"
	env    []string
	listen string // proxy.listen; "" is 127.0.0.1:0
	admin  string // extra admin keys, e.g. "token_env: ADMIN_TOKEN"
	netns  string // run the broker in this network namespace (ip netns exec); "" is the test's own
	ca     string // the ca section's keys instead of a file CA made by `ca init` (then caFile is "")
}

// canaryConfig is the config of a broker in front of loopback upstreams (trusted through
// caFile) with one token agent per id (token in the environment variable ID_TOKEN, upper-case,
// '-' as '_') and the canary credential, bound to 127.0.0.1 and injected as a bearer token
// from CANARY_SECRET. extra is appended.
func canaryConfig(caFile string, agents []string, extra string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "upstream:\n  ca_file: %q\n  allow_private: [\"127.0.0.1/32\"]\nagents:\n", caFile)
	for _, id := range agents {
		fmt.Fprintf(&b, "  - {id: %s, token_env: %s}\n", id, tokenEnv(id))
	}
	b.WriteString(`credentials:
  - name: canary
    hosts: ["127.0.0.1"]
    source: {env: CANARY_SECRET}
    inject: {header: Authorization, value: "Bearer {{secret}}"}
`)
	return b.String() + extra
}

// tokenEnv is the environment variable canaryConfig reads agent id's token from.
func tokenEnv(id string) string {
	return strings.ToUpper(strings.ReplaceAll(id, "-", "_")) + "_TOKEN"
}

// startBroker writes a config, a CA and a policy dir, runs `broker run`, and waits until it listens.
func startBroker(t *testing.T, o brokerOpts) *brokerProc {
	t.Helper()
	dir := t.TempDir()
	b := &brokerProc{dir: dir, caFile: filepath.Join(dir, "ca", "ca.crt"),
		policyDir: filepath.Join(dir, "policies"), logs: newLogTail(), auditLog: newLogTail(), done: make(chan error, 1)}
	caSection := fmt.Sprintf("{cert_file: %q, key_file: %q}", b.caFile, filepath.Join(dir, "ca", "ca.key"))
	if o.ca != "" {
		b.caFile, caSection = "", "{"+o.ca+"}"
	} else if out, err := exec.Command(brokerBin, "ca", "init", "--out", filepath.Join(dir, "ca")).CombinedOutput(); err != nil {
		t.Fatalf("ca init: %v\n%s", err, out)
	}
	if err := os.MkdirAll(b.policyDir, 0o755); err != nil {
		t.Fatal(err)
	}
	b.writePolicy(t, "broker.rego", o.policy)
	for name, content := range o.files {
		b.writePolicy(t, name, content)
	}
	if o.proxy != "" {
		o.proxy = ", " + o.proxy
	}
	if o.listen == "" {
		o.listen = "127.0.0.1:0"
	}
	if o.admin != "" {
		o.admin = ", " + o.admin
	}
	cfg := fmt.Sprintf(`proxy: {listen: %q%s}
admin: {listen: "127.0.0.1:0"%s}
ca: %s
policy: {dir: %q, mode: %s}
`, o.listen, o.proxy, o.admin, caSection, b.policyDir, o.mode) + o.config
	cfgFile := filepath.Join(dir, "broker.yaml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	b.cmd = exec.Command(brokerBin, "run", "--config", cfgFile)
	if o.netns != "" {
		// ip netns exec enters the namespace and execs the broker: the process is the broker.
		b.cmd = exec.Command("ip", "netns", "exec", o.netns, brokerBin, "run", "--config", cfgFile)
	}
	b.cmd.Env = append(harness.Env(), o.env...)
	b.cmd.Stdout = b.auditLog
	b.cmd.Stderr = b.logs
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := b.cmd.Wait()
		b.logs.Write([]byte(fmt.Sprintf("broker process exited: %v\n", err))) // wakes any waiter
		b.done <- err
	}()
	t.Cleanup(func() { b.stop(t) })
	line := b.logs.wait(t, `"message":"listening"`)
	var l struct{ Proxy, Admin string }
	if err := json.Unmarshal([]byte(line), &l); err != nil {
		t.Fatal(err)
	}
	b.proxyAddr, b.adminAddr = l.Proxy, l.Admin
	return b
}

func (b *brokerProc) writePolicy(t *testing.T, name, content string) {
	t.Helper()
	tmp := filepath.Join(b.dir, name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(b.policyDir, name)); err != nil {
		t.Fatal(err)
	}
}

// stop sends SIGTERM and waits for the process to exit. A process that has exited already
// is not signalled (os.Process knows), and its exit is read again from done.
func (b *brokerProc) stop(t *testing.T) error {
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-b.done:
		b.done <- err
		return err
	case <-time.After(waitTimeout):
		_ = b.cmd.Process.Kill()
		t.Errorf("broker did not exit on SIGTERM")
		return <-b.done
	}
}

func (b *brokerProc) proxyURL(agent, token string) string {
	if agent == "" {
		return "http://" + b.proxyAddr
	}
	return fmt.Sprintf("http://%s:%s@%s", url.PathEscape(agent), url.PathEscape(token), b.proxyAddr)
}

// caPool holds the broker's CA certificate, for clients that trust it as agents do.
func (b *brokerProc) caPool(t *testing.T) *x509.CertPool {
	t.Helper()
	pool := x509.NewCertPool()
	pem, err := os.ReadFile(b.caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(pem)
	return pool
}

// client is a Go HTTP client that uses the broker as an agent would. With a custom TLS config
// net/http speaks HTTP/1.1 only, so this client covers HTTP/1.1 inside tunnels.
func (b *brokerProc) client(t *testing.T, agent, token string) *http.Client {
	t.Helper()
	pu, _ := url.Parse(b.proxyURL(agent, token))
	return &http.Client{
		Transport:     &http.Transport{Proxy: http.ProxyURL(pu), TLSClientConfig: &tls.Config{RootCAs: b.caPool(t)}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       waitTimeout,
	}
}

// auditEvent is one line of the audit log.
type auditEvent map[string]any

// audit returns the audit events written so far.
func (b *brokerProc) audit(t *testing.T) []auditEvent {
	t.Helper()
	return decodeAudit(t, b.auditLog.snapshot())
}

// decodeAudit parses audit lines.
func decodeAudit(t *testing.T, lines []string) []auditEvent {
	t.Helper()
	evs := make([]auditEvent, 0, len(lines))
	for _, line := range lines {
		var ev auditEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("audit line is not JSON: %q", line)
		}
		evs = append(evs, ev)
	}
	return evs
}

// waitAuditWhere waits for n audit events for which match is true, and returns them.
func (b *brokerProc) waitAuditWhere(t *testing.T, n int, what string, match func(auditEvent) bool) []auditEvent {
	t.Helper()
	lines := b.auditLog.waitLines(t, 0, n, what, func(line string) bool {
		var ev auditEvent
		return json.Unmarshal([]byte(line), &ev) == nil && match(ev)
	})
	return decodeAudit(t, lines)
}

// waitAudit waits for the audit event of a request id.
func (b *brokerProc) waitAudit(t *testing.T, requestID string) auditEvent {
	t.Helper()
	return decodeAudit(t, []string{b.auditLog.wait(t, `"request_id":"`+requestID+`"`)})[0]
}

// logTail collects the broker's stderr and lets tests wait for a line.
type logTail struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	lines []string
	cond  *sync.Cond
	part  []byte
}

func newLogTail() *logTail {
	l := &logTail{}
	l.cond = sync.NewCond(&l.mu)
	return l
}

func (l *logTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	l.part = append(l.part, p...)
	consumed := 0
	for {
		i := bytes.IndexByte(l.part[consumed:], '\n')
		if i < 0 {
			break
		}
		l.lines = append(l.lines, string(l.part[consumed:consumed+i]))
		consumed += i + 1
	}
	l.part = append(l.part[:0], l.part[consumed:]...)
	l.cond.Broadcast()
	return len(p), nil
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// wait returns the first line containing substr, waiting for it up to waitTimeout.
func (l *logTail) wait(t *testing.T, substr string) string {
	t.Helper()
	return l.waitFrom(t, 0, substr)
}

func (l *logTail) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// mark is the number of lines seen so far, for waitFrom.
func (l *logTail) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

// waitFrom returns the first line at or after index from that contains substr.
func (l *logTail) waitFrom(t *testing.T, from int, substr string) string {
	t.Helper()
	return l.waitLines(t, from, 1, strconv.Quote(substr), func(line string) bool { return strings.Contains(line, substr) })[0]
}

// waitLines returns the first n lines at or after index from that match, waiting for them
// up to waitTimeout; what names the lines in a failure. The lines are counted under the lock
// each time one arrives, so lines that came in before the call count too.
func (l *logTail) waitLines(t *testing.T, from, n int, what string, match func(string) bool) []string {
	t.Helper()
	deadline := time.AfterFunc(waitTimeout, func() { l.mu.Lock(); l.cond.Broadcast(); l.mu.Unlock() })
	defer deadline.Stop()
	start := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		var found []string
		for i := from; i < len(l.lines); i++ {
			if match(l.lines[i]) {
				if found = append(found, l.lines[i]); len(found) == n {
					return found
				}
			}
			if strings.HasPrefix(l.lines[i], "broker process exited") {
				t.Fatalf("the broker exited while waiting for %s; log:\n%s", what, l.buf.String())
			}
		}
		if time.Since(start) >= waitTimeout {
			t.Fatalf("timed out waiting for %d log lines matching %s; log:\n%s", n, what, l.buf.String())
		}
		l.cond.Wait()
	}
}

// notReady reports whether /readyz names credential as not ready.
func (b *brokerProc) notReady(t *testing.T, credential string) bool {
	t.Helper()
	resp, err := http.Get("http://" + b.adminAddr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct{ Credentials map[string]string }
	_ = json.NewDecoder(resp.Body).Decode(&body)
	_, ok := body.Credentials[credential]
	return ok
}
