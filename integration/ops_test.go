package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capbroker/capbroker/credentials/vaulttest"
	"github.com/capbroker/capbroker/internal/harness"
)

// readyz is one answer of the admin /readyz.
type readyz struct {
	code              int
	Status            string
	PolicyRevision    string            `json:"policy_revision"`
	PolicyReloadError string            `json:"policy_reload_error"`
	Credentials       map[string]string // unavailable ones, with the reason
	CredentialsReady  []string          `json:"credentials_ready"`
}

func (b *brokerProc) readyz(t *testing.T, query string) readyz {
	t.Helper()
	resp, err := http.Get("http://" + b.adminAddr + "/readyz" + query)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := readyz{code: resp.StatusCode}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	return r
}

// waitReadyz polls /readyz (every 50ms, at most waitTimeout) until cond holds on its answer.
func (b *brokerProc) waitReadyz(t *testing.T, what string, cond func(readyz) bool) readyz {
	t.Helper()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(waitTimeout)
	for {
		r := b.readyz(t, "")
		if cond(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never showed %s; last %+v\nlog:\n%s", what, r, b.logs.String())
		}
		<-tick.C
	}
}

// metrics returns the admin /metrics text.
func (b *brokerProc) metrics(t *testing.T) string {
	t.Helper()
	resp, err := http.Get("http://" + b.adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// metricValue finds the sample of family whose labels include every one given ("k=v").
func metricValue(text, family string, labels ...string) (string, bool) {
	for _, line := range strings.Split(text, "\n") {
		name, rest, ok := strings.Cut(line, " ")
		if !ok || (name != family && !strings.HasPrefix(name, family+"{")) {
			continue
		}
		all := true
		for _, l := range labels {
			k, v, _ := strings.Cut(l, "=")
			if !strings.Contains(name, k+`="`+v+`"`) {
				all = false
			}
		}
		if all {
			return rest, true
		}
	}
	return "", false
}

// healthcheck runs `broker healthcheck` with args.
func healthcheck(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(brokerBin, append([]string{"healthcheck"}, args...)...)
	cmd.Env = harness.Env()
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

const opsPolicy = `package broker

decision := {"allow": true} if input.phase == "connect"

decision := {"allow": true, "credentials": ["from-vault"]} if {
	input.phase == "request"
	startswith(input.request.path, "/vault/")
}

decision := {"allow": true} if {
	input.phase == "request"
	not startswith(input.request.path, "/vault/")
}
`

// TestReadyWithoutTrafficOnceVaultIsUp: a broker started while Vault is down is ready
// (degraded: the Vault credential listed as unavailable) and serves requests that need no
// Vault credential; once Vault is up, /readyz turns fully ready on its own, with no request
// proxied at all (the credentials are retried in the background).
func TestReadyWithoutTrafficOnceVaultIsUp(t *testing.T) {
	vault := vaulttest.Start(t)
	vault.Stop()

	pki := newUpstreamPKI(t)
	var proxied atomic.Int64
	var lastAuth atomic.Value
	lastAuth.Store("")
	up := pki.serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxied.Add(1)
		lastAuth.Store(r.Header.Get("Authorization"))
		fmt.Fprint(w, "ok")
	}), false, nil)
	b := startBroker(t, brokerOpts{policy: opsPolicy, mode: "enforce",
		config: canaryConfig(pki.File, []string{agentID}, fmt.Sprintf(`  - name: from-vault
    hosts: ["127.0.0.1"]
    source: {vault: {mount: secret, path: broker/ops, field: token}}
    inject: {header: Authorization, value: "Bearer {{secret}}"}
vault:
  address: %s
  refresh_interval: 1s
  max_stale: 1m
  auth: {method: token, token_env: BROKER_VAULT_TOKEN}
`, vault.Addr)),
		env: []string{"BROKER_VAULT_TOKEN=" + vault.RootToken, tokenEnv(agentID) + "=tok-1", "CANARY_SECRET=canary-" + randHex(8)},
	})

	r := b.readyz(t, "")
	if r.code != 200 || r.Status != "degraded" || r.Credentials["from-vault"] == "" || len(r.Credentials) != 1 ||
		strings.Join(r.CredentialsReady, ",") != "canary" {
		t.Fatalf("/readyz with Vault down: %+v", r)
	}
	if r := b.readyz(t, "?strict"); r.code != 503 || r.Status != "not ready" {
		t.Fatalf("/readyz?strict with Vault down: %+v", r)
	}
	m := b.metrics(t)
	if v, ok := metricValue(m, "capbroker_credential_ready", "credential=from-vault"); !ok || v != "0" {
		t.Fatalf("capbroker_credential_ready{from-vault} = %q %v", v, ok)
	}
	if v, ok := metricValue(m, "capbroker_credential_ready", "credential=canary"); !ok || v != "1" {
		t.Fatalf("capbroker_credential_ready{canary} = %q %v", v, ok)
	}
	// The healthcheck follows /readyz: 0 while degraded, 1 under ?strict.
	if out, code := healthcheck(t, "--admin", b.adminAddr); code != 0 || !strings.Contains(out, "200 OK") {
		t.Fatalf("healthcheck while degraded: %d %s", code, out)
	}
	if out, code := healthcheck(t, "--url", "http://"+b.adminAddr+"/readyz?strict"); code != 1 || !strings.Contains(out, "503") {
		t.Fatalf("healthcheck --url ...?strict while degraded: %d %s", code, out)
	}

	vault.Restart()
	secret := "from-vault-" + randHex(8)
	if _, err := vault.Client().KVv2("secret").Put(t.Context(), "broker/ops", map[string]any{"token": secret}); err != nil {
		t.Fatal(err)
	}
	up1 := time.Now()
	r = b.waitReadyz(t, "every credential ready", func(r readyz) bool { return r.code == 200 && r.Status == "ready" && len(r.Credentials) == 0 })
	t.Logf("ready %s after Vault came up, with no traffic", time.Since(up1).Round(time.Millisecond))
	if strings.Join(r.CredentialsReady, ",") != "canary,from-vault" {
		t.Fatalf("credentials_ready: %v", r.CredentialsReady)
	}
	if n := proxied.Load(); n != 0 || len(b.auditLog.snapshot()) != 0 {
		t.Fatalf("requests went through the broker before it was ready: %d upstream, audit %v", n, b.auditLog.snapshot())
	}
	if v, _ := metricValue(b.metrics(t), "capbroker_credential_ready", "credential=from-vault"); v != "1" {
		t.Fatalf("capbroker_credential_ready{from-vault} = %q after recovery", v)
	}
	if out, code := healthcheck(t, "--url", "http://"+b.adminAddr+"/readyz?strict"); code != 0 {
		t.Fatalf("healthcheck ?strict once ready: %d %s", code, out)
	}
	resp, err := b.client(t, agentID, "tok-1").Get(up.URL + "/vault/x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || lastAuth.Load() != "Bearer "+secret {
		t.Fatalf("request after recovery: %d, upstream saw the right value: %v", resp.StatusCode, lastAuth.Load() == "Bearer "+secret)
	}
}

// TestOpsMetrics: the families a team alerts on, with labels bounded by the config.
func TestOpsMetrics(t *testing.T) {
	e := newEnv(t, envOpts{})
	for path, want := range map[string]int{"/api/x": 200, "/admin/x": 403, "/missing/x": 503} {
		if out, _ := e.curl("-i", e.url(path)); !hasStatus(out, want) {
			t.Fatalf("%s: want %d\n%s", path, want, out)
		}
	}
	// An upstream that refuses connections: a port nobody listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	if out, _ := e.curl("-i", "https://"+closed+"/open/x"); !hasStatus(out, 502) {
		t.Fatalf("closed port: want 502\n%s", out)
	}
	m := e.broker.metrics(t)
	for _, c := range []struct {
		family string
		labels []string
		want   string // "" for any value
	}{
		{"capbroker_agent_requests_total", []string{"agent=coder-1", "host=127.0.0.1", "outcome=allow", "credential=canary"}, ""},
		{"capbroker_agent_requests_total", []string{"agent=coder-1", "host=127.0.0.1", "outcome=deny", `credential=`}, "1"},
		{"capbroker_agent_requests_total", []string{"agent=coder-1", "host=127.0.0.1", "outcome=credential_unavailable", "credential=missing"}, "1"},
		{"capbroker_agent_requests_total", []string{"agent=coder-1", "outcome=upstream_error"}, "1"},
		{"capbroker_upstream_errors_total", []string{"class=refused"}, "1"},
		{"capbroker_credential_ready", []string{"credential=canary"}, "1"},
		{"capbroker_credential_ready", []string{"credential=missing"}, "0"},
		{"capbroker_requests_in_flight", nil, "0"},
		{"capbroker_tunnels_open", []string{"kind=opaque"}, "0"},
		{"capbroker_tunnels_open", []string{"kind=intercepted"}, ""},
		{"capbroker_policy_reload_failures_total", nil, "0"},
		{"capbroker_build_info", []string{"version=dev"}, "1"},
		{"capbroker_requests_total", []string{"phase=request", "decision=allow"}, ""},
	} {
		v, ok := metricValue(m, c.family, c.labels...)
		if !ok || (c.want != "" && v != c.want) {
			t.Errorf("%s%v = %q (found %v), want %q", c.family, c.labels, v, ok, c.want)
		}
	}
	// Only configured hosts are labels: the closed port's host is 127.0.0.1 (configured), so
	// use the label set itself: no label value holds a port, a path or a token.
	if regexp.MustCompile(`host="[^"]*:\d+"|/api/|` + e.token).MatchString(m) {
		t.Fatalf("an unbounded value in the metrics:\n%s", m)
	}
}

// TestPolicyReloadFailureIsReported: a policy on disk that does not compile leaves the last
// good one deciding, /readyz degraded (503 under ?strict) with the reason, the failure
// counted, and "policy reloaded" logged once when it is fixed.
func TestPolicyReloadFailureIsReported(t *testing.T) {
	e := newEnv(t, envOpts{})
	b := e.broker
	from := b.logs.mark()
	b.writePolicy(t, "broker.rego", "package broker\n\ndecision := {")
	b.logs.waitFrom(t, from, "policy reload failed")
	r := b.waitReadyz(t, "the reload failure", func(r readyz) bool { return r.PolicyReloadError != "" })
	if r.code != 200 || r.Status != "degraded" || !strings.Contains(r.PolicyReloadError, "broker.rego") {
		t.Fatalf("/readyz after a failed reload: %+v", r)
	}
	if r := b.readyz(t, "?strict"); r.code != 503 {
		t.Fatalf("/readyz?strict after a failed reload: %+v", r)
	}
	if v, _ := metricValue(b.metrics(t), "capbroker_policy_reload_failures_total"); v == "0" || v == "" {
		t.Fatalf("capbroker_policy_reload_failures_total = %q", v)
	}
	if out, _ := e.curl("-i", e.url("/api/x")); !hasStatus(out, 200) {
		t.Fatalf("the last good policy stopped deciding:\n%s", out)
	}
	from = b.logs.mark()
	b.writePolicy(t, "broker.rego", testPolicy)
	b.waitReadyz(t, "the failure cleared", func(r readyz) bool { return r.PolicyReloadError == "" })
	// One save, one reload: wait for a request decided by the new policy, then count.
	if out, _ := e.curl("-i", e.url("/api/x")); !hasStatus(out, 200) {
		t.Fatalf("after the fix:\n%s", out)
	}
	if n := strings.Count(strings.Join(b.logs.snapshot()[from:], "\n"), `"message":"policy reloaded"`); n != 1 {
		t.Fatalf(`"policy reloaded" logged %d times for one write:\n%s`, n, b.logs.String())
	}
}

// TestVersionFlag: --version is the version command; the format names the product.
func TestVersionFlag(t *testing.T) {
	a, code := run(t, t.TempDir(), "--version")
	b, _ := run(t, t.TempDir(), "version")
	if code != 0 || a != b || !regexp.MustCompile(`^capbroker \S+ \(commit \S+, go \d+\.\d+`).MatchString(a) {
		t.Fatalf("--version: %d %q (version: %q)", code, a, b)
	}
}

// TestPolicyReplayNeedsDecisionEvents: a file with no decision events (the operational log,
// an empty file) fails the gate with a message saying so, instead of "0 re-decided" and 0.
func TestPolicyReplayNeedsDecisionEvents(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"policies/broker.rego": testPolicy,
		"broker.log":           `{"level":"info","proxy":"127.0.0.1:8080","time":"2026-01-01T00:00:00Z","message":"listening"}` + "\n",
		"empty.jsonl":          "",
	})
	for _, f := range []string{"broker.log", "empty.jsonl"} {
		out, code := run(t, dir, "policy", "replay", "--policies", "policies", "--log", f)
		if code != 1 || !strings.Contains(out, "holds no decision events") || !strings.Contains(out, "0 re-decided") {
			t.Fatalf("%s: exit %d:\n%s", f, code, out)
		}
	}
}

// TestPolicyEvalConfigAndOneLine: with --config a granted credential bound to the host is
// granted (without, the input names no credential and the grant is refused as unbound); the
// one-line form builds the input the broker would.
func TestPolicyEvalConfigAndOneLine(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"policies/broker.rego": testPolicy + `
decision := {"allow": true, "credentials": ["canary"]} if {
	input.request.path == "/labelled"
	input.agent.labels.team == "platform"
}
`,
		"broker.yaml": `ca: {cert_file: ca.crt, key_file: ca.key}
policy: {dir: policies}
agents:
  - {id: coder-1, token_env: CODER1_TOKEN, labels: {team: platform}}
credentials:
  - name: canary
    hosts: ["127.0.0.1"]
    source: {env: CANARY_SECRET}
    inject: {header: Authorization, value: "Bearer {{secret}}"}
`,
		"in.json": `{"phase":"request","agent":{"id":"coder-1","labels":{}},"source":{"ip":"127.0.0.1"},
"request":{"method":"GET","scheme":"https","host":"127.0.0.1","port":443,"path":"/api/x","query":{},"headers":{},"body":null,"body_size":0}}`,
	})
	decision := func(args ...string) (string, int) {
		t.Helper()
		return run(t, dir, append([]string{"policy", "eval", "--policies", "policies"}, args...)...)
	}
	granted := `"allow": true,
  "reason": "",
  "credentials": [
    "canary"
  ]`
	if out, code := decision("--input", "in.json"); code != 0 || !strings.Contains(out, "may not be sent to this host") {
		t.Fatalf("without --config: exit %d:\n%s", code, out)
	}
	for name, args := range map[string][]string{
		"--input with --config": {"--config", "broker.yaml", "--input", "in.json"},
		"one line":              {"--config", "broker.yaml", "--agent", "coder-1", "GET", "https://127.0.0.1/api/x"},
		"flags after":           {"GET", "https://127.0.0.1/api/../api/x?q=1", "--agent", "coder-1", "--config", "broker.yaml"},
		"labels from config":    {"--config", "broker.yaml", "--agent", "coder-1", "GET", "https://127.0.0.1/labelled"},
	} {
		if out, code := decision(args...); code != 0 || !strings.Contains(out, granted) {
			t.Errorf("%s: exit %d:\n%s", name, code, out)
		}
	}
	if out, code := decision("--agent", "coder-1", "GET", "https://127.0.0.1/admin/x"); code != 0 || !strings.Contains(out, `"reason": "the /admin area is off limits"`) {
		t.Fatalf("one-line deny: exit %d:\n%s", code, out)
	}
	if out, code := decision("--agent", "coder-1", "CONNECT", "127.0.0.1:443"); code != 0 || !strings.Contains(out, `"allow": true`) {
		t.Fatalf("one-line CONNECT: exit %d:\n%s", code, out)
	}
	if out, code := decision("GET", "https://127.0.0.1/x"); code != 2 || !strings.Contains(out, "--agent is required") {
		t.Fatalf("without --agent: exit %d:\n%s", code, out)
	}
	if out, code := decision("--agent", "coder-1", "GET", "/relative"); code != 1 || !strings.Contains(out, "absolute") {
		t.Fatalf("relative URL: exit %d:\n%s", code, out)
	}
}
