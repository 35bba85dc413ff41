package integration

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	vaultapi "github.com/hashicorp/vault/api"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/credentials/vaulttest"
	"github.com/capbroker/capbroker/internal/harness"
)

// vaultPKITTL is the life of the broker's intermediates in TestVaultPKI: renewed at half
// life (12s), each signs until a tenth of its life is left (21.6s).
const vaultPKITTL = 24 * time.Second

const vaultPKIPolicy = `package broker

default decision := {"allow": false, "reason": "not allowed by the test policy"}

decision := {"allow": true, "intercept": true} if input.phase == "connect"

decision := {"allow": true} if input.phase == "request"
`

// vaultPKIReady is what /readyz says of the CA.
type vaultPKIReady struct {
	code   int
	Status string
	CA     struct {
		Source       string
		Serial       string
		Renewals     int
		RenewSeconds float64 `json:"renew_seconds"`
		RenewError   string  `json:"renew_error"`
		Error        string
	}
}

// TestVaultPKI: a broker with ca.vault_pki and no CA key on disk, against a real Vault PKI
// engine, with a token that may only sign intermediates. Agents (curl, python, Go) trusting
// only the Vault root, as `broker agent-env --write-ca` writes it, get through intercepted
// HTTPS; the intermediate is renewed at half life, and a leaf cached from the old one is still
// served with the old chain and verifies, while a new host gets the new intermediate; with
// Vault gone past the intermediate's life, interception is refused (503 ca_unavailable),
// /readyz is not ready, and no key was ever written to the broker's state dir.
func TestVaultPKI(t *testing.T) {
	vault := vaulttest.Start(t)
	vc := vault.Client()
	if err := vc.Sys().Mount("pki", &vaultapi.MountInput{Type: "pki", Config: vaultapi.MountConfigInput{MaxLeaseTTL: "87600h"}}); err != nil {
		t.Fatal(err)
	}
	rootSecret, err := vc.Logical().Write("pki/root/generate/internal", map[string]any{
		"common_name": "capbroker-vaultpki test root", "ttl": "87600h", "key_type": "ec",
	})
	if err != nil {
		t.Fatal(err)
	}
	rootPEM := rootSecret.Data["certificate"].(string)
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM([]byte(rootPEM)) {
		t.Fatal("vault's root does not parse")
	}
	if err := vc.Sys().PutPolicy("capbroker-vaultpki", `path "pki/root/sign-intermediate" { capabilities = ["update"] }`); err != nil {
		t.Fatal(err)
	}
	tok, err := vc.Auth().Token().Create(&vaultapi.TokenCreateRequest{Policies: []string{"capbroker-vaultpki"}, TTL: "1h", NoDefaultPolicy: false})
	if err != nil {
		t.Fatal(err)
	}
	vaultToken := tok.Auth.ClientToken

	pki := newUpstreamPKI(t)
	upstream := pki.serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from upstream %s", r.URL.Path)
	}), false, nil)
	b := startBroker(t, brokerOpts{
		policy: vaultPKIPolicy,
		ca:     fmt.Sprintf("vault_pki: {mount: pki, ttl: %s, common_name: capbroker-vaultpki}", vaultPKITTL),
		config: fmt.Sprintf(`upstream:
  ca_file: %q
  allow_private: ["127.0.0.1/32"]
agents:
  - {id: a, token_env: A_TOKEN}
vault:
  address: %s
  auth: {method: token, token_env: BROKER_VAULT_TOKEN}
`, pki.File, vault.Addr),
		env: []string{"A_TOKEN=a-token", "BROKER_VAULT_TOKEN=" + vaultToken},
	})
	first := waitVaultPKI(t, b, 10*time.Second, "the first intermediate", func(r vaultPKIReady) bool { return r.CA.Renewals >= 1 })
	if first.code != http.StatusOK || first.CA.Source != "vault_pki" || first.CA.Error != "" {
		t.Fatalf("/readyz after start: %+v", first)
	}

	// agent-env writes the root it reads from Vault (without a token), and points the
	// agent's CA variables at it.
	rootFile := filepath.Join(t.TempDir(), "vault-root.pem")
	cmd := exec.Command(brokerBin, "agent-env", "--config", filepath.Join(b.dir, "broker.yaml"), "--agent", "a", "--write-ca", rootFile)
	cmd.Env = append(harness.Env(), "A_TOKEN=a-token")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("agent-env --write-ca: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "export SSL_CERT_FILE="+rootFile) || !strings.Contains(string(out), "export CURL_CA_BUNDLE="+rootFile) {
		t.Fatalf("agent-env does not point the CA variables at %s:\n%s", rootFile, out)
	}
	if got, _ := os.ReadFile(rootFile); strings.TrimSpace(string(got)) != strings.TrimSpace(rootPEM) {
		t.Fatalf("agent-env wrote %q, want vault's root", got)
	}
	printed, err := exec.Command(brokerBin, "agent-env", "--config", filepath.Join(b.dir, "broker.yaml"), "--print-ca").Output()
	if err != nil || strings.TrimSpace(string(printed)) != strings.TrimSpace(rootPEM) {
		t.Fatalf("agent-env --print-ca = %q, %v; want vault's root", printed, err)
	}

	proxy := b.proxyURL("a", "a-token")
	t.Run("curl and python trust only the vault root", func(t *testing.T) {
		c := exec.Command("curl", "-sS", "--max-time", "20", "--suppress-connect-headers", upstream.URL+"/curl")
		c.Env = append(harness.Env(), "HTTPS_PROXY="+proxy, "CURL_CA_BUNDLE="+rootFile, "NO_PROXY=")
		if out, err := c.CombinedOutput(); err != nil || string(out) != "hello from upstream /curl" {
			t.Fatalf("curl: %v %q", err, out)
		}
		py := exec.Command("python3", "-c", `import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1]).read().decode(), end="")`, upstream.URL+"/python")
		py.Env = append(harness.Env(), "HTTPS_PROXY="+proxy, "https_proxy="+proxy, "SSL_CERT_FILE="+rootFile, "NO_PROXY=", "no_proxy=")
		if out, err := py.CombinedOutput(); err != nil || string(out) != "hello from upstream /python" {
			t.Fatalf("python3: %v %q", err, out)
		}
	})

	host := strings.TrimPrefix(upstream.URL, "https://")
	before := vaultPKIHandshake(t, b, host, roots)
	if len(before) != 2 {
		t.Fatalf("chain of %d certificates, want the leaf and the intermediate (the root is the agent's)", len(before))
	}
	inter1 := before[1]
	if hex.EncodeToString(inter1.SerialNumber.Bytes()) != first.CA.Serial {
		t.Fatalf("leaf signed by %x, /readyz names %s", inter1.SerialNumber.Bytes(), first.CA.Serial)
	}
	if !inter1.IsCA || !inter1.MaxPathLenZero || inter1.MaxPathLen != 0 {
		t.Fatalf("intermediate may sign CAs: IsCA %v MaxPathLen %d zero %v", inter1.IsCA, inter1.MaxPathLen, inter1.MaxPathLenZero)
	}
	if life := inter1.NotAfter.Sub(time.Now()); life > vaultPKITTL {
		t.Fatalf("intermediate lives %s, more than ttl %s", life, vaultPKITTL)
	}

	renewed := waitVaultPKI(t, b, 2*vaultPKITTL, "a renewal", func(r vaultPKIReady) bool { return r.CA.Renewals >= 2 })
	t.Logf("renewal took %.3fs (key, CSR, Vault, checks)", renewed.CA.RenewSeconds)
	if renewed.CA.Serial == first.CA.Serial {
		t.Fatal("renewed, but /readyz names the same intermediate")
	}
	t.Run("cached leaf of the old intermediate still verifies", func(t *testing.T) {
		after := vaultPKIHandshake(t, b, host, roots)
		if !after[0].Equal(before[0]) || !after[1].Equal(inter1) {
			t.Fatalf("leaf for %s not served from the cache with its own chain (issuer serial %x, old %x)",
				host, after[1].SerialNumber.Bytes(), inter1.SerialNumber.Bytes())
		}
	})
	t.Run("a new host gets the new intermediate", func(t *testing.T) {
		_, port, _ := net.SplitHostPort(host)
		chain := vaultPKIHandshake(t, b, "localhost:"+port, roots)
		if got := hex.EncodeToString(chain[1].SerialNumber.Bytes()); got != renewed.CA.Serial {
			t.Fatalf("new leaf signed by %s, want the renewed intermediate %s", got, renewed.CA.Serial)
		}
	})

	t.Run("an agent cannot reach the broker's vault to sign its own CA", func(t *testing.T) {
		c := exec.Command("curl", "-sS", "-i", "--max-time", "20", "-X", "POST", "-H", "X-Vault-Token: "+vaultToken,
			"--data", `{"csr":"x","common_name":"evil"}`, vault.Addr+"/v1/pki/root/sign-intermediate")
		c.Env = append(harness.Env(), "http_proxy="+proxy, "NO_PROXY=")
		out, _ := c.CombinedOutput()
		if !hasStatus(string(out), http.StatusForbidden) || !strings.Contains(string(out), "own listener or a service the broker uses") {
			t.Fatalf("agent to the broker's vault: %q", out)
		}
	})

	// Vault goes away: the current intermediate signs until a tenth of its life is left, then
	// nothing is intercepted.
	vault.Stop()
	failing := waitVaultPKI(t, b, 2*vaultPKITTL, "a failed renewal", func(r vaultPKIReady) bool { return r.CA.RenewError != "" })
	if failing.code != http.StatusOK || failing.Status != "degraded" || failing.CA.Error != "" {
		t.Fatalf("/readyz with a renewal failed and the intermediate still signing: %+v", failing)
	}
	down := waitVaultPKI(t, b, 2*vaultPKITTL, "the CA unavailable", func(r vaultPKIReady) bool { return r.code == http.StatusServiceUnavailable })
	if down.CA.Error == "" || down.CA.RenewError == "" || down.Status != "not ready" {
		t.Fatalf("/readyz with the intermediate lapsed: %+v", down)
	}
	t.Run("interception refused", func(t *testing.T) {
		code, body, _ := vaultPKIConnect(t, b, host)
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "ca_unavailable") {
			t.Fatalf("CONNECT with the CA lapsed: %d %s", code, body)
		}
		c := exec.Command("curl", "-sS", "--max-time", "20", upstream.URL+"/lapsed")
		c.Env = append(harness.Env(), "HTTPS_PROXY="+proxy, "CURL_CA_BUNDLE="+rootFile, "NO_PROXY=")
		out, err := c.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "503") {
			t.Fatalf("curl with the CA lapsed: %v %q", err, out)
		}
		evs := b.waitAuditWhere(t, 2, "CONNECTs refused for the CA", func(ev auditEvent) bool {
			return ev["status"] == float64(503) && strings.Contains(fmt.Sprint(ev["error"]), "cannot sign")
		})
		for _, ev := range evs {
			if strings.Contains(fmt.Sprint(ev), vaultToken) {
				t.Fatal("audit event holds the vault token")
			}
		}
	})
	t.Run("no key on disk", func(t *testing.T) {
		err := filepath.WalkDir(b.dir, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if strings.Contains(string(data), "PRIVATE KEY") {
				t.Errorf("%s holds a private key", path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(b.logs.String(), vaultToken) || strings.Contains(b.auditLog.String(), vaultToken) {
			t.Fatal("the vault token is in the broker's log or audit")
		}
	})
}

// waitVaultPKI polls /readyz until cond holds, for at most limit.
func waitVaultPKI(t *testing.T, b *brokerProc, limit time.Duration, what string, cond func(vaultPKIReady) bool) vaultPKIReady {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		resp, err := http.Get("http://" + b.adminAddr + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		r := vaultPKIReady{code: resp.StatusCode}
		err = json.NewDecoder(resp.Body).Decode(&r)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if cond(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never showed %s; last %+v\nlog:\n%s", what, r, b.logs.String())
		}
		time.Sleep(50 * time.Millisecond) // a poll interval, not a synchronisation
	}
}

// vaultPKIConnect sends a CONNECT to hostPort as agent a and returns the status, the body
// when it is not 200, and the connection (the tunnel when it is).
func vaultPKIConnect(t *testing.T, b *brokerProc, hostPort string) (int, string, net.Conn) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", b.proxyAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(waitTimeout))
	auth := base64.StdEncoding.EncodeToString([]byte("a:a-token"))
	fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", hostPort, hostPort, auth)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), conn
	}
	if br.Buffered() != 0 {
		t.Fatal("the broker sent bytes after its 200 before the agent's ClientHello")
	}
	return resp.StatusCode, "", conn
}

// vaultPKIHandshake opens an intercepted tunnel to hostPort, verifies the broker's
// certificate against roots only, and returns the chain the broker sent.
func vaultPKIHandshake(t *testing.T, b *brokerProc, hostPort string, roots *x509.CertPool) []*x509.Certificate {
	t.Helper()
	code, body, conn := vaultPKIConnect(t, b, hostPort)
	if code != http.StatusOK {
		t.Fatalf("CONNECT %s: %d %s", hostPort, code, body)
	}
	host, _, _ := net.SplitHostPort(hostPort)
	tc := tls.Client(conn, &tls.Config{ServerName: host, RootCAs: roots})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("TLS through the broker to %s, trusting only vault's root: %v", hostPort, err)
	}
	defer tc.Close()
	return tc.ConnectionState().PeerCertificates
}

// TestVaultPKIIntermediateMount: the broker's intermediate signed by a named issuer of an
// intermediate mount (pki_int, itself signed by the root in pki): leaves are sent with the
// whole chain below the root, and verify for an agent trusting the root alone, which
// agent-env reads from that issuer.
func TestVaultPKIIntermediateMount(t *testing.T) {
	vault := vaulttest.Start(t)
	vc := vault.Client()
	for _, m := range []string{"pki", "pki_int"} {
		if err := vc.Sys().Mount(m, &vaultapi.MountInput{Type: "pki", Config: vaultapi.MountConfigInput{MaxLeaseTTL: "87600h"}}); err != nil {
			t.Fatal(err)
		}
	}
	write := func(path string, data map[string]any) map[string]any {
		t.Helper()
		s, err := vc.Logical().Write(path, data)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return s.Data
	}
	rootPEM := write("pki/root/generate/internal", map[string]any{"common_name": "capbroker-vaultpki root", "ttl": "87600h", "key_type": "ec"})["certificate"].(string)
	csr := write("pki_int/intermediate/generate/internal", map[string]any{"common_name": "capbroker-vaultpki agents", "key_type": "ec"})["csr"].(string)
	bundle := write("pki/root/sign-intermediate", map[string]any{"csr": csr, "format": "pem_bundle", "ttl": "8760h"})["certificate"].(string)
	imported := write("pki_int/intermediate/set-signed", map[string]any{"certificate": bundle})["imported_issuers"].([]any)
	if len(imported) == 0 {
		t.Fatal("set-signed imported no issuer")
	}
	for _, id := range imported {
		if s, _ := vc.Logical().Read("pki_int/issuer/" + id.(string)); s != nil && s.Data["issuer_name"] == "" && !strings.Contains(fmt.Sprint(s.Data["certificate"]), strings.TrimSpace(rootPEM)) {
			write("pki_int/issuer/"+id.(string), map[string]any{"issuer_name": "brokers"})
		}
	}
	if err := vc.Sys().PutPolicy("capbroker-vaultpki", `path "pki_int/issuer/brokers/sign-intermediate" { capabilities = ["update"] }`); err != nil {
		t.Fatal(err)
	}
	tok, err := vc.Auth().Token().Create(&vaultapi.TokenCreateRequest{Policies: []string{"capbroker-vaultpki"}, TTL: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(rootPEM))

	pki := newUpstreamPKI(t)
	upstream := pki.serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") }), false, nil)
	b := startBroker(t, brokerOpts{
		policy: vaultPKIPolicy,
		ca:     "vault_pki: {mount: pki_int, issuer: brokers, ttl: 1h}",
		config: fmt.Sprintf("upstream:\n  ca_file: %q\n  allow_private: [\"127.0.0.1/32\"]\nagents:\n  - {id: a, token_env: A_TOKEN}\n"+
			"vault:\n  address: %s\n  auth: {method: token, token_env: BROKER_VAULT_TOKEN}\n", pki.File, vault.Addr),
		env: []string{"A_TOKEN=a-token", "BROKER_VAULT_TOKEN=" + tok.Auth.ClientToken},
	})
	waitVaultPKI(t, b, 10*time.Second, "the first intermediate", func(r vaultPKIReady) bool { return r.CA.Renewals >= 1 })

	printed, err := exec.Command(brokerBin, "agent-env", "--config", filepath.Join(b.dir, "broker.yaml"), "--print-ca").CombinedOutput()
	if err != nil || strings.TrimSpace(string(printed)) != strings.TrimSpace(rootPEM) {
		t.Fatalf("agent-env --print-ca = %q, %v; want the root above pki_int", printed, err)
	}
	chain := vaultPKIHandshake(t, b, strings.TrimPrefix(upstream.URL, "https://"), roots)
	if len(chain) != 3 || chain[2].Subject.CommonName != "capbroker-vaultpki agents" {
		t.Fatalf("chain of %d certificates, want leaf, the broker's intermediate and pki_int's", len(chain))
	}
	if chain[1].Subject.CommonName != config.DefaultCACommonName || !chain[1].MaxPathLenZero {
		t.Fatalf("broker's intermediate: CN %q, path length 0 %v", chain[1].Subject.CommonName, chain[1].MaxPathLenZero)
	}
}
