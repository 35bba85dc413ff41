package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capbroker/capbroker/credentials/vaulttest"
)

// What an operator sees of the failures they fear most: a Vault that hangs, a config reload
// that is refused, a reload that changes where a key may be sent, a rotated audit file.

// hangingProxy relays TCP connections to a backend until hang is called; from then on it
// accepts connections and never answers them (a hung Vault), until resume.
type hangingProxy struct {
	ln      net.Listener
	backend string
	mu      sync.Mutex
	hung    bool
	conns   map[net.Conn]bool
}

func newHangingProxy(t *testing.T, backend string) *hangingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &hangingProxy{ln: ln, backend: backend, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { ln.Close(); p.closeAll() })
	go p.serve()
	return p
}

func (p *hangingProxy) addr() string { return "http://" + p.ln.Addr().String() }

func (p *hangingProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns[c] = true
		hung := p.hung
		p.mu.Unlock()
		if hung {
			continue // held open, never answered
		}
		go func() {
			b, err := net.Dial("tcp", p.backend)
			if err != nil {
				c.Close()
				return
			}
			p.mu.Lock()
			p.conns[b] = true
			p.mu.Unlock()
			go func() { _, _ = io.Copy(b, c); b.Close() }()
			_, _ = io.Copy(c, b)
			c.Close()
		}()
	}
}

func (p *hangingProxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// hang makes Vault unresponsive: open connections are cut, new ones never answered.
func (p *hangingProxy) hang() {
	p.mu.Lock()
	p.hung = true
	p.mu.Unlock()
	p.closeAll()
}

// resume relays again; the connections left hanging are closed, as a Vault back up would.
func (p *hangingProxy) resume() {
	p.mu.Lock()
	p.hung = false
	p.mu.Unlock()
	p.closeAll()
}

// waitMetric polls /metrics (every 50ms, at most waitTimeout) until family{labels} satisfies cond.
func (b *brokerProc) waitMetric(t *testing.T, what, family string, cond func(float64) bool, labels ...string) float64 {
	t.Helper()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(waitTimeout)
	for {
		text := b.metrics(t)
		if s, ok := metricValue(text, family, labels...); ok {
			if v, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil && cond(v) {
				return v
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics never showed %s\n%s", what, text)
		}
		<-tick.C
	}
}

// TestVaultHungIsVisible: when Vault stops answering, the broker keeps serving the cached
// value and says so at once: capbroker_credential_stale_seconds gives the value's age, one
// warn line per credential names it (never the value), /readyz lists it as stale; when Vault
// answers again, one line says it is fresh and the age goes back to 0.
func TestVaultHungIsVisible(t *testing.T) {
	vault := vaulttest.Start(t)
	value := "vault-stale-" + randHex(8)
	if _, err := vault.Client().KVv2("secret").Put(t.Context(), "broker/api", map[string]any{"token": value}); err != nil {
		t.Fatal(err)
	}
	proxy := newHangingProxy(t, strings.TrimPrefix(vault.Addr, "http://"))
	e := newEnv(t, envOpts{
		extraCredentials: `  - name: vault-kv2
    hosts: ["127.0.0.1"]
    source: {vault: {mount: secret, path: broker/api, field: token}}
    inject: {header: Authorization, value: "Bearer {{secret}}"}
  - name: vault-kv1
    hosts: ["127.0.0.1"]
    source: {vault: {mount: secret, path: broker/api, field: token}}
    inject: {header: X-Api-Key, value: "{{secret}}"}`,
		extraConfig: fmt.Sprintf(`vault:
  address: %s
  refresh_interval: 300ms
  max_stale: 10m
  auth: {method: token, token_env: BROKER_VAULT_TOKEN}
`, proxy.addr()),
		env: []string{"BROKER_VAULT_TOKEN=" + vault.RootToken},
	})
	b := e.broker
	client := b.client(t, agentID, e.token)
	get := func() int {
		t.Helper()
		resp, err := client.Get(e.url("/vault/x"))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	if code := get(); code != http.StatusOK {
		t.Fatalf("before the outage: %d", code)
	}
	if v, _ := metricValue(b.metrics(t), "capbroker_credential_stale_seconds", "credential=vault-kv2"); strings.TrimSpace(v) != "0" {
		t.Fatalf("fresh credential: stale seconds %q", v)
	}

	mark := b.logs.mark()
	proxy.hang()
	age := b.waitMetric(t, "the stale value's age", "capbroker_credential_stale_seconds", func(v float64) bool { return v > 0 }, "credential=vault-kv2")
	if age > 60 {
		t.Fatalf("stale age %v s", age)
	}
	// Requests are still served with the cached value.
	if code := get(); code != http.StatusOK {
		t.Fatalf("during the outage: %d, want 200 from the cache", code)
	}
	if r := e.received(); r[len(r)-1].Header.Get("Authorization") != "Bearer "+value {
		t.Fatal("during the outage the cached value was not injected")
	}
	lines := b.logs.waitLines(t, mark, 2, "a stale line per credential", func(l string) bool {
		return strings.Contains(l, "credential served stale")
	})
	for i, name := range []string{"vault-kv1", "vault-kv2"} {
		if !strings.Contains(strings.Join(lines, "\n"), `"credential":"`+name+`"`) {
			t.Fatalf("no stale line names %s: %v", name, lines)
		}
		if !strings.Contains(lines[i], `"age":`) || !strings.Contains(lines[i], `"level":"warn"`) {
			t.Fatalf("stale line: %s", lines[i])
		}
	}
	var rz struct {
		Status string
		Stale  map[string]string `json:"credentials_stale"`
	}
	resp, err := http.Get("http://" + b.adminAddr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	_ = json.NewDecoder(resp.Body).Decode(&rz)
	resp.Body.Close()
	if _, ok := rz.Stale["vault-kv2"]; !ok {
		t.Fatalf("/readyz during the outage: %+v", rz)
	}
	// Once per change: however many requests, still one line per credential.
	for range 5 {
		get()
	}
	if n := strings.Count(strings.Join(b.logs.snapshot()[mark:], "\n"), "credential served stale"); n != 2 {
		t.Fatalf("%d stale lines, want one per credential", n)
	}

	mark = b.logs.mark()
	proxy.resume()
	b.logs.waitLines(t, mark, 2, "fresh again, per credential", func(l string) bool {
		return strings.Contains(l, "credential fresh again")
	})
	b.waitMetric(t, "the age back to 0", "capbroker_credential_stale_seconds", func(v float64) bool { return v == 0 }, "credential=vault-kv2")
	if strings.Contains(b.logs.String(), value) || strings.Contains(b.metrics(t), value) {
		t.Fatal("the Vault value appears in the logs or metrics")
	}
}

// readyzRaw is /readyz's answer, undecoded.
func (b *brokerProc) readyzRaw(t *testing.T, query string) (int, map[string]json.RawMessage) {
	t.Helper()
	resp, err := http.Get("http://" + b.adminAddr + "/readyz" + query)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

// TestReloadRefusalAndHostsAreVisible: a reload that changes only a credential's hosts names
// the credential and the hosts; a refused reload is counted, timed, and shown in /readyz with
// its problems but not the values of the file, until a good reload.
func TestReloadRefusalAndHostsAreVisible(t *testing.T) {
	e := newEnv(t, envOpts{})
	b := e.broker
	cfgFile := filepath.Join(b.dir, "broker.yaml")
	raw, err := os.ReadFile(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	original := string(raw)
	reload := func(content, wait string) string {
		t.Helper()
		mark := b.logs.mark()
		if err := os.WriteFile(cfgFile, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := b.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		b.logs.waitFrom(t, mark, wait)
		return strings.Join(b.logs.snapshot()[mark:], "\n")
	}

	const canaryHosts = "- name: canary\n    hosts: [\"127.0.0.1\"]"
	if !strings.Contains(original, canaryHosts) {
		t.Fatalf("config lacks %q", canaryHosts)
	}
	wider := strings.Replace(original, canaryHosts, "- name: canary\n    hosts: [\"127.0.0.1\", \"localhost\"]", 1)
	logs := reload(wider, `"message":"config reloaded"`)
	if !strings.Contains(logs, `"credentials_changed":["canary"]`) || !strings.Contains(logs, `"credentials_source_changed":[]`) {
		t.Errorf("a hosts-only change is not named in the reload line:\n%s", logs)
	}
	if !strings.Contains(logs, `"credential":"canary","hosts_added":["localhost"],"hosts_removed":[]`) {
		t.Errorf("no line says where canary may now be sent:\n%s", logs)
	}

	pasted := "sk-pasted-" + randHex(10)
	broken := strings.Replace(strings.Replace(wider, "mode: enforce", "mode: strict", 1),
		`proxy: {listen: "127.0.0.1:0"`, `proxy: {listen: "127.0.0.1:0", max_connections: "`+pasted+`"`, 1)
	before := time.Now()
	reload(broken, `"message":"config reload refused`)
	code, body := b.readyzRaw(t, "")
	var refused struct{ At, Error string }
	if err := json.Unmarshal(body["config_reload_refused"], &refused); err != nil {
		t.Fatalf("/readyz has no config_reload_refused: %v %s", err, body)
	}
	at, err := time.Parse(time.RFC3339Nano, refused.At)
	if err != nil || at.Before(before.Add(-time.Second)) || at.After(time.Now().Add(time.Second)) {
		t.Fatalf("config_reload_refused.at %q: %v", refused.At, err)
	}
	for _, want := range []string{"policy.mode", "proxy.max_connections"} {
		if !strings.Contains(refused.Error, want) {
			t.Errorf("refusal in /readyz lacks %q: %s", want, refused.Error)
		}
	}
	if strings.Contains(refused.Error, pasted) || strings.Contains(string(body["config_reload_refused"]), pasted) {
		t.Errorf("/readyz shows a value of the file: %s", refused.Error)
	}
	if code != http.StatusOK || string(body["status"]) != `"degraded"` {
		t.Errorf("/readyz after a refused reload: %d %s", code, body["status"])
	}
	if code, _ := b.readyzRaw(t, "?strict"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz?strict after a refused reload: %d", code)
	}
	text := b.metrics(t)
	if v, _ := metricValue(text, "capbroker_config_reloads_total", "result=refused"); strings.TrimSpace(v) != "1" {
		t.Errorf("refused reloads: %q", v)
	}
	if v, _ := metricValue(text, "capbroker_config_reloads_total", "result=ok"); strings.TrimSpace(v) == "0" || v == "" {
		t.Errorf("ok reloads: %q", v)
	}
	ts, _ := metricValue(text, "capbroker_config_reload_last_refused_timestamp_seconds")
	if f, err := strconv.ParseFloat(strings.TrimSpace(ts), 64); err != nil || int64(f) < before.Unix()-1 {
		t.Errorf("last refused timestamp %q", ts)
	}
	if v, _ := metricValue(text, "capbroker_config_last_reload_successful"); strings.TrimSpace(v) != "0" {
		t.Errorf("last reload successful: %q, want 0", v)
	}
	if strings.Contains(text, pasted) {
		t.Error("the metrics show a value of the file")
	}

	// A good reload clears the field; the timestamp stays.
	reload(original, `"message":"config reloaded"`)
	if _, body := b.readyzRaw(t, ""); body["config_reload_refused"] != nil {
		t.Errorf("/readyz after a good reload: %s", body["config_reload_refused"])
	}
	if v, _ := metricValue(b.metrics(t), "capbroker_config_last_reload_successful"); strings.TrimSpace(v) != "1" {
		t.Errorf("last reload successful after a good one: %q", v)
	}
	if ts2, _ := metricValue(b.metrics(t), "capbroker_config_reload_last_refused_timestamp_seconds"); ts2 != ts {
		t.Errorf("the last refused timestamp changed: %q -> %q", ts, ts2)
	}
}

// TestAuditFileReopenedOnSIGHUP rotates audit.file as logrotate does (rename, SIGHUP): the
// events before the rotation are in the renamed file, those after it in a new file at the path,
// each whole.
func TestAuditFileReopenedOnSIGHUP(t *testing.T) {
	pki := newUpstreamPKI(t)
	up := pki.serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }), false, nil)
	auditFile := filepath.Join(t.TempDir(), "audit.log")
	token, canary := randHex(16), "sk-canary-"+randHex(12)
	b := startBroker(t, brokerOpts{
		policy: testPolicy, mode: "enforce",
		config: canaryConfig(pki.File, []string{agentID}, fmt.Sprintf("audit: {file: %q}\n", auditFile)),
		env:    []string{tokenEnv(agentID) + "=" + token, "CANARY_SECRET=" + canary},
	})
	client := b.client(t, agentID, token)
	request := func(path string) {
		t.Helper()
		resp, err := client.Get(up.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// waitIn polls file until it has an event for path.
	waitIn := func(file, path string) {
		t.Helper()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		deadline := time.Now().Add(waitTimeout)
		for {
			raw, _ := os.ReadFile(file)
			if strings.Contains(string(raw), `"path":"`+path+`"`) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never held the event for %s:\n%s", file, path, raw)
			}
			<-tick.C
		}
	}
	request("/api/before")
	waitIn(auditFile, "/api/before")

	rotated := auditFile + ".1"
	if err := os.Rename(auditFile, rotated); err != nil {
		t.Fatal(err)
	}
	mark := b.logs.mark()
	if err := b.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	b.logs.waitFrom(t, mark, `"message":"audit.file reopened"`)
	request("/api/after")
	waitIn(auditFile, "/api/after")
	old, _ := os.ReadFile(rotated)
	if strings.Contains(string(old), "/api/after") {
		t.Fatal("an event after the rotation went to the renamed file")
	}
	if info, err := os.Stat(auditFile); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("new audit file: %v %v", info, err)
	}
	for _, f := range []string{auditFile, rotated} {
		raw, _ := os.ReadFile(f)
		for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
			if !json.Valid([]byte(line)) {
				t.Fatalf("%s: not a whole event: %q", f, line)
			}
		}
	}
}
