package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/credentials/oauth2/oauth2test"
	"github.com/capbroker/capbroker/credentials/vaulttest"
	"github.com/capbroker/capbroker/internal/harness"
)

// oauth2Policy lets the agent use the stand-in's API: /api/data with the token narrowed to
// the "read" scope, anything else under /api/ with the configured scopes.
const oauth2Policy = `package broker

default decision := {"allow": false, "reason": "not allowed by the test policy"}

decision := {"allow": true, "intercept": true} if input.phase == "connect"

decision := {"allow": true, "credentials": [{"name": "api", "scope": {"scopes": ["read"]}}]} if {
	input.phase == "request"
	input.request.path == "/api/data"
}

decision := {"allow": true, "credentials": ["api"]} if {
	input.phase == "request"
	startswith(input.request.path, "/api/")
	input.request.path != "/api/data"
}
`

// oauth2Env is a broker in front of the OAuth2 stand-in, whose API it reaches with tokens it
// mints from the credential named api.
type oauth2Env struct {
	t      *testing.T
	srv    *oauth2test.Server
	broker *brokerProc
	token  string // the agent's proxy token
	secret string // the client secret (a canary)
}

// config returns the credential's derived block (indented for the credential) and more
// config; it may replace e.secret, the value of the credential's source.
func newOAuth2Env(t *testing.T, config func(e *oauth2Env) (credential, extra string), env ...string) *oauth2Env {
	t.Helper()
	e := &oauth2Env{t: t, srv: oauth2test.Start(t), token: randHex(16), secret: "oauth-client-secret-" + randHex(12)}
	e.srv.AddClient(oauth2test.Client{ID: "capbroker", Auth: "client_secret_basic", Secret: e.secret,
		Grants: []string{"client_credentials", "refresh_token"}, Scopes: []string{"read", "write"}})
	credential, extraConfig := config(e)
	e.broker = startBroker(t, brokerOpts{
		policy: oauth2Policy,
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
%s
%s`, e.srv.CAFile, agentID, credential, extraConfig),
		env: append([]string{"CODER1_TOKEN=" + e.token, "OAUTH_CLIENT_SECRET=" + e.secret}, env...),
	})
	return e
}

// curl runs curl as the agent through the broker.
func (e *oauth2Env) curl(url string) (status int, body string) {
	e.t.Helper()
	cmd := exec.Command("curl", "-sS", "--max-time", "20", "--suppress-connect-headers", "-w", "\n%{http_code}", url)
	proxy := e.broker.proxyURL(agentID, e.token)
	cmd.Env = append(harness.Env(), "HTTPS_PROXY="+proxy, "CURL_CA_BUNDLE="+e.broker.caFile, "NO_PROXY=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		e.t.Fatalf("curl: %v\n%s", err, out)
	}
	s := string(out)
	i := strings.LastIndex(s, "\n")
	fmt.Sscan(s[i+1:], &status)
	e.noTokens("curl output", s[:i])
	return status, s[:i]
}

// noTokens fails the test if text holds the client secret or any token the stand-in issued.
func (e *oauth2Env) noTokens(what, text string, more ...string) {
	e.t.Helper()
	for _, s := range append(append(e.srv.Issued(), e.secret), more...) {
		if s != "" && strings.Contains(text, s) {
			e.t.Errorf("%s holds a secret or a minted token", what)
			return
		}
	}
}

// checkLogs stops the broker and checks its audit and operational logs for secrets.
func (e *oauth2Env) checkLogs(more ...string) {
	e.t.Helper()
	_ = e.broker.stop(e.t)
	e.noTokens("audit log", strings.Join(e.broker.auditLog.snapshot(), "\n"), more...)
	e.noTokens("broker log", e.broker.logs.String(), more...)
	for _, prefix := range []string{oauth2test.AccessTokenPrefix, oauth2test.RefreshTokenPrefix} {
		if strings.Contains(e.broker.logs.String()+strings.Join(e.broker.auditLog.snapshot(), ""), prefix) {
			e.t.Errorf("a log holds a token (%s...)", prefix)
		}
	}
}

// apiAnswer is what the stand-in's API answers.
type apiAnswer struct {
	OK     bool
	Scopes []string
	Token  string
}

func decodeAnswer(t *testing.T, body string) apiAnswer {
	t.Helper()
	var a apiAnswer
	if err := json.Unmarshal([]byte(body), &a); err != nil {
		t.Fatalf("API answer %q: %v", body, err)
	}
	return a
}

// TestOAuth2ClientCredentialsThroughBroker: curl reaches the protected API with a token the
// broker minted (narrowed per decision) and the agent never sees; a token the API refuses
// (revoked) makes the broker mint a new one and send the request once more.
func TestOAuth2ClientCredentialsThroughBroker(t *testing.T) {
	e := newOAuth2Env(t, func(e *oauth2Env) (string, string) {
		return fmt.Sprintf(`    oauth2:
      token_url: %s
      client_id: capbroker
      scopes: [read, write]`, e.srv.TokenURL), ""
	})
	api := strings.TrimSuffix(e.srv.APIURL, "/")

	status, body := e.curl(api + "/data")
	if a := decodeAnswer(t, body); status != 200 || !a.OK || strings.Join(a.Scopes, " ") != "read" {
		t.Fatalf("narrowed request: %d %s", status, body)
	}
	status, body = e.curl(api + "/echo")
	if a := decodeAnswer(t, body); status != 200 || strings.Join(a.Scopes, " ") != "read write" || a.Token != "[REDACTED]" {
		t.Fatalf("default scopes: %d %s (the echoed token must be scrubbed)", status, body)
	}
	if c := e.srv.Calls(); c != 2 {
		t.Errorf("%d token requests for two scopes, want 2", c)
	}
	ready := e.readyz()
	if minted, _ := ready["credentials_minted"].(map[string]any)["api"].(map[string]any); minted == nil || minted["valid_until"] == nil {
		t.Errorf("/readyz does not show the minted token's expiry: %v", ready)
	}
	// Cached: the same request again mints nothing.
	if status, _ = e.curl(api + "/data"); status != 200 || e.srv.Calls() != 2 {
		t.Errorf("cached token: %d, %d token requests", status, e.srv.Calls())
	}

	// The API stops accepting every token: the broker's first try gets 401, it drops the
	// token, mints another and sends the request again.
	e.srv.RevokeAll()
	apiBefore := e.srv.APICalls()
	status, body = e.curl(api + "/data")
	if status != 200 || !decodeAnswer(t, body).OK {
		t.Fatalf("after revocation: %d %s, want the retry to succeed (token requests %d, API requests %d)", status, body, e.srv.Calls(), e.srv.APICalls()-apiBefore)
	}
	if c, a := e.srv.Calls(), e.srv.APICalls()-apiBefore; c != 3 || a != 2 {
		t.Errorf("after revocation: %d token requests (want 3), %d API requests (want 2: the 401 and the retry)", c, a)
	}
	e.checkLogs()
}

// readyz returns the admin /readyz body, checked for secrets.
func (e *oauth2Env) readyz() map[string]any {
	e.t.Helper()
	resp, err := http.Get("http://" + e.broker.adminAddr + "/readyz")
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	e.noTokens("/readyz", string(b))
	var body map[string]any
	if err := json.Unmarshal(b, &body); err != nil {
		e.t.Fatalf("/readyz: %v", err)
	}
	return body
}

// TestOAuth2EndpointRefusesClient: a client the endpoint refuses gets the agent a 503
// credential_unavailable, and /readyz says why, by class, without the secret.
func TestOAuth2EndpointRefusesClient(t *testing.T) {
	e := newOAuth2Env(t, func(e *oauth2Env) (string, string) {
		return fmt.Sprintf(`    oauth2:
      token_url: %s
      client_id: capbroker`, e.srv.TokenURL), ""
	})
	e.srv.AddClient(oauth2test.Client{ID: "capbroker", Auth: "client_secret_basic", Secret: "another-secret",
		Grants: []string{"client_credentials"}, Scopes: []string{"read"}})
	status, body := e.curl(strings.TrimSuffix(e.srv.APIURL, "/") + "/echo")
	if status != 503 || !strings.Contains(body, `"credential_unavailable"`) {
		t.Fatalf("%d %s, want 503 credential_unavailable", status, body)
	}
	if e.srv.APICalls() != 0 {
		t.Error("the request was sent without a token")
	}
	ready := e.readyz()
	if errs, _ := ready["credentials"].(map[string]any); errs["api"] != "token endpoint answered 401 invalid_client" {
		t.Errorf("/readyz: %v", ready)
	}
	e.checkLogs()
}

// TestOAuth2RefreshTokenRotatedInVault: the refresh token grant with the refresh token in a
// real Vault; each rotation is written back there, and only the current one works.
func TestOAuth2RefreshTokenRotatedInVault(t *testing.T) {
	vault := vaulttest.Start(t)
	vc := vault.Client()
	var rt0 string
	e := newOAuth2Env(t, func(e *oauth2Env) (string, string) {
		rt0 = e.srv.IssueRefreshToken("capbroker")
		if _, err := vc.KVv2("secret").Put(t.Context(), "broker/oauth", map[string]any{"refresh_token": rt0}); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf(`    oauth2:
      token_url: %s
      grant: refresh_token
      client_id: capbroker
      client_auth: client_secret_basic
      scopes: [read, write]
      refresh_token: {vault: {mount: secret, path: broker/oauth, field: refresh_token}}`, e.srv.TokenURL),
			fmt.Sprintf("vault:\n  address: %s\n  auth: {method: token, token_env: BROKER_VAULT_TOKEN}\n", vault.Addr)
	}, "BROKER_VAULT_TOKEN="+vault.RootToken)
	stored := func() string {
		t.Helper()
		s, err := vc.KVv2("secret").Get(t.Context(), "broker/oauth")
		if err != nil {
			t.Fatal(err)
		}
		v, _ := s.Data["refresh_token"].(string)
		return v
	}
	api := strings.TrimSuffix(e.srv.APIURL, "/")
	seen := []string{rt0}

	status, body := e.curl(api + "/echo")
	if status != 200 || decodeAnswer(t, body).Token != "[REDACTED]" {
		t.Fatalf("first request: %d %s", status, body)
	}
	rt1 := stored()
	if rt1 == rt0 || !e.srv.RefreshTokenValid(rt1) || e.srv.RefreshTokenValid(rt0) {
		t.Fatalf("vault does not hold the rotated refresh token (changed: %v, valid: %v)", rt1 != rt0, e.srv.RefreshTokenValid(rt1))
	}
	seen = append(seen, rt1)

	e.srv.RevokeAll()
	if status, body = e.curl(api + "/echo"); status != 200 {
		t.Fatalf("after revocation: %d %s", status, body)
	}
	rt2 := stored()
	if rt2 == rt1 || !e.srv.RefreshTokenValid(rt2) {
		t.Fatal("the second rotation was not written back")
	}
	seen = append(seen, rt2)
	e.checkLogs(seen...)
}

// TestGoogleServiceAccountThroughBroker: a service account key in the credential's source
// becomes tokens from the key's token_uri (which verifies the signed assertion); the API
// accepts them, narrowed per decision; the key and the tokens stay out of the agent's view
// and the logs.
func TestGoogleServiceAccountThroughBroker(t *testing.T) {
	var key struct {
		PrivateKey string `json:"private_key"`
	}
	e := newOAuth2Env(t, func(e *oauth2Env) (string, string) {
		raw := e.srv.AddServiceAccount(t, "agent@proj.iam.gserviceaccount.com", "read", "write")
		if err := json.Unmarshal(raw, &key); err != nil {
			t.Fatal(err)
		}
		e.secret = string(raw)
		return `    google_service_account:
      scopes: [read, write]
      subject: someone@example.com`, ""
	})
	api := strings.TrimSuffix(e.srv.APIURL, "/")
	status, body := e.curl(api + "/data")
	if a := decodeAnswer(t, body); status != 200 || strings.Join(a.Scopes, " ") != "read" {
		t.Fatalf("narrowed request: %d %s", status, body)
	}
	status, body = e.curl(api + "/echo")
	if a := decodeAnswer(t, body); status != 200 || strings.Join(a.Scopes, " ") != "read write" || a.Token != "[REDACTED]" {
		t.Fatalf("default scopes: %d %s", status, body)
	}
	// The PEM body of the key, line by line, is never in a log.
	var lines []string
	for _, l := range strings.Split(key.PrivateKey, "\n") {
		if len(l) > 20 {
			lines = append(lines, l)
		}
	}
	e.checkLogs(lines...)
}
