package integration

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capbroker/capbroker/credentials/github/githubtest"
	"github.com/capbroker/capbroker/credentials/oauth2/oauth2test"
)

// The attacks of this file: an agent has a hostile upstream keep a secret the broker sent it,
// then makes the broker forget it (re-mints forced by 401s, a reload that renames or removes
// the credential) and reads the copy back. The broker's registry of known secrets must still
// scrub it, in every encoding the upstream serves it in, or refuse to send anything new.

// hostileStore is an upstream that keeps what it is sent and serves it back:
//
//	/store, /store/*  keep X-Data if the request has it, else the Authorization header's credential
//	/fail   answers 401, as to a token it no longer accepts
//	/read   answers every value kept, raw and encoded (knownForms)
type hostileStore struct {
	mu   sync.Mutex
	kept []string
	srv  *httptest.Server
}

func newHostileStore(t *testing.T, pki *upstreamPKI) *hostileStore {
	s := &hostileStore{}
	s.srv = pki.serve(t, http.HandlerFunc(s.serve), false, nil)
	return s
}

func (s *hostileStore) serve(w http.ResponseWriter, r *http.Request) {
	v := r.Header.Get("X-Data")
	if v == "" {
		auth := r.Header.Get("Authorization")
		if i := strings.IndexByte(auth, ' '); i >= 0 {
			auth = auth[i+1:] // "Bearer tok": the credential alone, the harder case
		}
		v = auth
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch p := r.URL.Path; {
	case p == "/store" || strings.HasPrefix(p, "/store/"):
		if v != "" {
			s.kept = append(s.kept, v)
		}
		fmt.Fprintln(w, "kept")
	case p == "/fail":
		w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
		http.Error(w, `{"error":"invalid_token"}`, http.StatusUnauthorized)
	case p == "/read":
		w.Header().Set("Content-Type", "text/plain")
		for _, k := range s.kept {
			for name, f := range knownForms(k) {
				fmt.Fprintf(w, "%s=%s\n", name, f)
			}
		}
	default:
		http.NotFound(w, r)
	}
}

// keptValues returns what the store was sent to keep.
func (s *hostileStore) keptValues() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.kept...)
}

// knownForms are the encodings the hostile store serves a value in.
func knownForms(v string) map[string]string {
	j, _ := json.Marshal(v)
	return map[string]string{
		"raw":    v,
		"base64": base64.StdEncoding.EncodeToString([]byte(v)),
		"b64url": base64.RawURLEncoding.EncodeToString([]byte(v)),
		"hex":    hex.EncodeToString([]byte(v)),
		"query":  url.QueryEscape(v),
		"path":   url.PathEscape(v),
		"json":   string(j),
	}
}

// agentGet sends a GET as the agent through the broker; it returns the status, the body and
// the request's id in the audit log.
func agentGet(t *testing.T, c *http.Client, u string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	return agentDo(t, c, req)
}

func agentDo(t *testing.T, c *http.Client, req *http.Request) (int, string, string) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Header.Get("X-Broker-Request-Id")
}

// assertScrubbed fails the test unless body, what the agent read back, holds none of the
// values in any form the store serves, and shows that it was scrubbed.
func assertScrubbed(t *testing.T, what, body string, values ...string) {
	t.Helper()
	if len(values) == 0 {
		t.Fatalf("%s: nothing to look for", what)
	}
	for i, v := range values {
		for name, f := range knownForms(v) {
			if strings.Contains(body, f) {
				t.Errorf("%s: value %d reached the agent in clear (%s form)", what, i, name)
			}
		}
	}
	if !strings.Contains(body, "[REDACTED]") {
		t.Errorf("%s: nothing was scrubbed:\n%s", what, body)
	}
}

// auditOf waits for the audit event of a request and checks its decision, status and
// credentials.
func auditOf(t *testing.T, b *brokerProc, id string, status int, creds ...string) auditEvent {
	t.Helper()
	if id == "" {
		t.Fatal("the answer has no X-Broker-Request-Id")
	}
	ev := b.waitAudit(t, id)
	got, _ := json.Marshal(ev["credentials"])
	want, _ := json.Marshal(append([]string{}, creds...))
	if ev["decision"] != "allow" || ev["status"] != float64(status) || string(got) != string(want) {
		t.Errorf("audit event: decision %v, status %v, credentials %s; want allow, %d, %s", ev["decision"], ev["status"], got, status, want)
	}
	return ev
}

// noSecretIn fails the test if text holds any of secrets.
func noSecretIn(t *testing.T, what, text string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if s != "" && strings.Contains(text, s) {
			t.Errorf("%s holds a secret", what)
			return
		}
	}
}

// TestKnownSecretsOAuth2Remint: the agent has the store keep the access token it was sent,
// then forces nine re-mints by calling a path that answers 401 (each after the minter's grace
// of ten seconds, as a patient agent would): more than the eight tokens per scope the minter
// used to remember. The first token is still valid for an hour, and reading it back shows it
// scrubbed, as are all the others.
func TestKnownSecretsOAuth2Remint(t *testing.T) {
	t.Parallel()
	const remints = 9
	const grace = 10 * time.Second // credentials/oauth2 rejectGrace
	pki := newUpstreamPKI(t)
	store := newHostileStore(t, pki)
	e := newOAuth2EnvCA(t, pki)
	c := e.broker.client(t, agentID, e.token)

	status, _, _ := agentGet(t, c, store.srv.URL+"/store")
	if status != 200 || len(store.keptValues()) != 1 || store.keptValues()[0] != e.srv.Issued()[0] {
		t.Fatalf("store: %d; the upstream must have been sent the minted token", status)
	}
	minted := time.Now()
	for i := 1; i <= remints; i++ {
		// The minter keeps a token minted less than its grace ago when it is refused again:
		// the attack waits it out, as the broker's clock counts it.
		if i > 1 {
			time.Sleep(time.Until(minted.Add(grace + 250*time.Millisecond)))
		}
		status, body, id := agentGet(t, c, store.srv.URL+"/fail")
		minted = time.Now()
		if status != 401 {
			t.Fatalf("re-mint %d: %d %s", i, status, body)
		}
		auditOf(t, e.broker, id, 401, "api")
		if got := e.srv.Calls(); got != i+1 {
			t.Fatalf("after %d refusals, %d tokens minted; want %d", i, got, i+1)
		}
	}
	status, body, id := agentGet(t, c, store.srv.URL+"/read")
	if status != 200 {
		t.Fatalf("read back: %d %s", status, body)
	}
	auditOf(t, e.broker, id, 200)
	issued := e.srv.Issued()
	if len(issued) != remints+1 {
		t.Fatalf("%d tokens issued, want %d", len(issued), remints+1)
	}
	if code, _ := e.callAPI(issued[0]); code != 200 {
		t.Fatalf("the first token is no longer valid (%d): the attack needs it valid", code)
	}
	assertScrubbed(t, "read back after re-mints", body, store.keptValues()...)
	e.checkLogs()
}

// callAPI uses tok on the stand-in's API directly (as whoever took it away would) and returns
// the status.
func (e *oauth2Env) callAPI(tok string) (int, error) {
	req, _ := http.NewRequest(http.MethodGet, e.srv.APIURL+"data", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := e.srv.HTTPClient().Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// newOAuth2EnvCA is newOAuth2Env with a policy granting the credential for every request to
// 127.0.0.1 and upstream.ca_file trusting pki's upstreams as well as the token endpoint.
func newOAuth2EnvCA(t *testing.T, pki *upstreamPKI) *oauth2Env {
	t.Helper()
	e := &oauth2Env{t: t, srv: oauth2test.Start(t), token: randHex(16), secret: "oauth-client-secret-" + randHex(12)}
	e.srv.AddClient(oauth2test.Client{ID: "capbroker", Auth: "client_secret_basic", Secret: e.secret,
		Grants: []string{"client_credentials"}, Scopes: []string{"read", "write"}})
	e.broker = startBroker(t, brokerOpts{
		policy: grantAllPolicy(`["api"]`),
		mode:   "enforce",
		config: fmt.Sprintf(`upstream:
  ca_file: %q
  allow_private: ["127.0.0.1/32"]
agents:
  - {id: %s, token_env: CODER1_TOKEN}
credentials:
  - name: api
    hosts: ["127.0.0.1"]
    source: {env: OAUTH_CLIENT_SECRET}
    oauth2:
      token_url: %s
      client_id: capbroker
      scopes: [read, write]
`, bothCAs(t, pki.File, e.srv.CAFile), agentID, e.srv.TokenURL),
		env: []string{"CODER1_TOKEN=" + e.token, "OAUTH_CLIENT_SECRET=" + e.secret},
	})
	return e
}

// grantAllPolicy intercepts every tunnel and grants creds (a Rego array) to every request,
// but /read, which is sent without any.
func grantAllPolicy(creds string) string {
	return `package broker

default decision := {"allow": false, "reason": "not allowed by the test policy"}

decision := {"allow": true, "intercept": true} if input.phase == "connect"

decision := {"allow": true, "credentials": ` + creds + `} if {
	input.phase == "request"
	input.request.path != "/read"
}

decision := {"allow": true} if {
	input.phase == "request"
	input.request.path == "/read"
}
`
}

// bothCAs writes a file holding the certificates of both CA files.
func bothCAs(t *testing.T, a, b string) string {
	t.Helper()
	pa, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "cas.pem")
	if err := os.WriteFile(f, append(append(pa, '\n'), pb...), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestKnownSecretsGitHubRemint: the same attack on a GitHub App credential, whose minter drops
// a refused token at once: the agent has the first installation token kept, then forces a
// mint per 401. Every token sent stays scrubbed; when the broker could remember no more
// without forgetting one still valid, it refuses the request (503 credential_unavailable,
// audited) and asks GitHub for no new token.
func TestKnownSecretsGitHubRemint(t *testing.T) {
	t.Parallel()
	const bound = 64 // inject.DefaultMaxKnown
	pki := newUpstreamPKI(t)
	store := newHostileStore(t, pki)
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	gh := githubtest.Start(t, githubtest.Options{AppID: "4242", InstallationID: 77, PublicKey: &key.PublicKey,
		Repos: []string{"r1"}, Certificate: &pki.Leaf})
	agentToken := randHex(16)
	b := startBroker(t, brokerOpts{
		policy: grantAllPolicy(`["gh_app"]`),
		mode:   "enforce",
		config: fmt.Sprintf(`upstream:
  ca_file: %q
  allow_private: ["127.0.0.1/32"]
agents:
  - {id: %s, token_env: CODER1_TOKEN}
credentials:
  - name: gh_app
    hosts: ["127.0.0.1"]
    source: {env: GH_APP_KEY}
    github_app: {app_id: "4242", installation_id: 77, api_url: %q}
`, pki.File, agentID, gh.URL),
		env: []string{"CODER1_TOKEN=" + agentToken, "GH_APP_KEY=" + string(keyPEM)},
	})
	c := b.client(t, agentID, agentToken)

	if status, body, _ := agentGet(t, c, store.srv.URL+"/store"); status != 200 || len(store.keptValues()) != 1 {
		t.Fatalf("store: %d %s", status, body)
	}
	first := store.keptValues()[0]
	if gh.Issued()[0] != first {
		t.Fatal("the upstream was not sent the minted token")
	}
	refusedID := ""
	for i := 0; i < bound+4 && refusedID == ""; i++ {
		status, body, id := agentGet(t, c, store.srv.URL+"/fail")
		switch status {
		case 401:
		case 503:
			if !strings.Contains(body, `"credential_unavailable"`) {
				t.Fatalf("refusal body: %s", body)
			}
			refusedID = id
		default:
			t.Fatalf("re-mint %d: %d %s", i, status, body)
		}
	}
	if refusedID == "" {
		t.Fatalf("%d tokens minted and the broker still mints: its memory of them has no bound", gh.Mints())
	}
	ev := b.waitAudit(t, refusedID)
	if msg, _ := ev["error"].(string); ev["status"] != float64(503) || !strings.Contains(msg, "credential") {
		t.Errorf("refusal audit: status %v error %q", ev["status"], msg)
	}
	mints := gh.Mints()
	if mints > bound {
		t.Errorf("%d tokens minted, past the registry's bound of %d", mints, bound)
	}
	if status, _, _ := agentGet(t, c, store.srv.URL+"/fail"); status != 503 || gh.Mints() != mints {
		t.Errorf("again: %d, %d more mints; want 503 and none", status, gh.Mints()-mints)
	}

	status, body, id := agentGet(t, c, store.srv.URL+"/read")
	if status != 200 {
		t.Fatalf("read back: %d %s", status, body)
	}
	auditOf(t, b, id, 200)
	assertScrubbed(t, "read back after re-mints", body, gh.Issued()...)
	_ = b.stop(t)
	noSecretIn(t, "audit log", strings.Join(b.auditLog.snapshot(), "\n"), gh.Issued()...)
	noSecretIn(t, "broker log", b.logs.String(), gh.Issued()...)
}

// TestKnownSecretsReload: the agent has the store keep a placeholder's value and a header
// credential's value, then the config is reloaded with both credentials renamed (new names,
// new values: ph -> ph_v2) or removed. The copies read back scrubbed, in every encoding, by
// the broker that sent them, though no credential of its config has those values any more.
func TestKnownSecretsReload(t *testing.T) {
	t.Parallel()
	for _, change := range []string{"rename", "remove"} {
		t.Run(change, func(t *testing.T) { testKnownSecretsReload(t, change) })
	}
}

func testKnownSecretsReload(t *testing.T, change string) {
	pki := newUpstreamPKI(t)
	store := newHostileStore(t, pki)
	// Values with characters encoders escape, so that every encoding differs from the value.
	phSecret, keySecret := "ph/"+randHex(12)+"+v1=", "key/"+randHex(12)+"+v1="
	phNew, keyNew := "ph/"+randHex(12)+"+v2=", "key/"+randHex(12)+"+v2="
	agentToken := randHex(16)
	credentialsV1 := `credentials:
  - name: ph
    hosts: ["127.0.0.1"]
    source: {env: PH_SECRET}
    inject: {placeholder: CAPBROKER_PH}
  - name: key
    hosts: ["127.0.0.1"]
    source: {env: KEY_SECRET}
    inject: {header: Authorization, value: "Bearer {{secret}}"}
`
	b := startBroker(t, brokerOpts{
		policy: `package broker

default decision := {"allow": false, "reason": "not allowed by the test policy"}

decision := {"allow": true, "intercept": true} if input.phase == "connect"

# /store/NAME is sent with credential NAME; anything else with none.
decision := {"allow": true, "credentials": [substring(input.request.path, 7, -1)]} if {
	input.phase == "request"
	startswith(input.request.path, "/store/")
}

decision := {"allow": true} if {
	input.phase == "request"
	not startswith(input.request.path, "/store/")
}
`,
		mode: "enforce",
		config: fmt.Sprintf(`upstream:
  ca_file: %q
  allow_private: ["127.0.0.1/32"]
agents:
  - {id: %s, token_env: CODER1_TOKEN}
`, pki.File, agentID) + credentialsV1,
		env: []string{"CODER1_TOKEN=" + agentToken, "PH_SECRET=" + phSecret, "KEY_SECRET=" + keySecret,
			"PH_V2_SECRET=" + phNew, "KEY_V2_SECRET=" + keyNew},
	})
	c := b.client(t, agentID, agentToken)
	storeWith := func(name, data string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, store.srv.URL+"/store/"+name, nil)
		if data != "" {
			req.Header.Set("X-Data", data)
		}
		status, body, id := agentDo(t, c, req)
		if status != 200 {
			t.Fatalf("store with %s: %d %s", name, status, body)
		}
		auditOf(t, b, id, 200, name)
	}
	storeWith("ph", "CAPBROKER_PH")
	storeWith("key", "")
	if kept := store.keptValues(); len(kept) != 2 || kept[0] != phSecret || kept[1] != keySecret {
		t.Fatal("the upstream was not sent the two values to keep")
	}
	read := func(what string) {
		t.Helper()
		status, body, id := agentGet(t, c, store.srv.URL+"/read")
		if status != 200 {
			t.Fatalf("%s: %d %s", what, status, body)
		}
		auditOf(t, b, id, 200)
		assertScrubbed(t, what, body, phSecret, keySecret)
	}
	read("read back before the reload")

	cfgFile := filepath.Join(b.dir, "broker.yaml")
	raw, err := os.ReadFile(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	next := strings.Replace(string(raw), credentialsV1, "", 1)
	if change == "rename" {
		next += strings.NewReplacer("name: ph", "name: ph_v2", "PH_SECRET", "PH_V2_SECRET",
			"name: key", "name: key_v2", "KEY_SECRET", "KEY_V2_SECRET").Replace(credentialsV1)
	}
	mark := b.logs.mark()
	if err := os.WriteFile(cfgFile+".tmp", []byte(next), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(cfgFile+".tmp", cfgFile); err != nil {
		t.Fatal(err)
	}
	if err := b.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	line := b.logs.waitFrom(t, mark, `"message":"config reloaded"`)
	if !strings.Contains(line, `"credentials_removed":["key","ph"]`) && !strings.Contains(line, `"credentials_removed":["ph","key"]`) {
		t.Errorf("reload log line: %s", line)
	}
	read("read back after the reload (" + change + ")")
	if change == "rename" {
		// The new values are sent, and scrubbed, as any.
		storeWith("ph_v2", "CAPBROKER_PH")
		if kept := store.keptValues(); kept[len(kept)-1] != phNew {
			t.Fatal("the renamed placeholder was not substituted")
		}
		status, body, _ := agentGet(t, c, store.srv.URL+"/read")
		if status != 200 {
			t.Fatalf("read: %d", status)
		}
		assertScrubbed(t, "read back of old and new values", body, phSecret, keySecret, phNew)
	}
	_ = b.stop(t)
	noSecretIn(t, "audit log", strings.Join(b.auditLog.snapshot(), "\n"), phSecret, keySecret, phNew, keyNew)
	noSecretIn(t, "broker log", b.logs.String(), phSecret, keySecret, phNew, keyNew)
}
