package broker

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/certs"
)

// sealedVault fails every signing, as a sealed or unreachable Vault does.
type sealedVault struct{}

func (sealedVault) SignIntermediate(context.Context, certs.IntermediateRequest) (string, []string, error) {
	return "", nil, errors.New("vault is sealed")
}

// TestCAUnavailableRefusesInterception: while the CA cannot sign (ca.vault_pki without an
// intermediate), a CONNECT the policy intercepts is refused 503 ca_unavailable before any
// TLS, the reason from Vault only in the audit event; an opaque tunnel still opens; /readyz
// is not ready and says why.
func TestCAUnavailableRefusesInterception(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ca, err := certs.StartVaultPKI(ctx, certs.VaultPKIOptions{Signer: sealedVault{}, Path: "pki/root/sign-intermediate", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	opaque := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "opaque ok") }))
	defer opaque.Close()
	cfg := testConfig(t)
	cfg.Upstream.AllowPrivate = []string{"127.0.0.1/32", "::1/128"}
	events := make(chan map[string]any, 100)
	al := audit.New(io.Discard)
	t.Cleanup(al.Close)
	al.SetTap(func(line []byte) {
		var ev map[string]any
		if json.Unmarshal(line, &ev) == nil && ev["msg"] == "decision" {
			events <- ev
		}
	})
	m := NewMetrics(nil)
	b, _ := testBroker(t, cfg, Deps{Policy: &hostPolicy{}, Secrets: benchSecrets{}, CA: ca, Audit: al, Metrics: m}, &echoUpstream{}, "api.github.com")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- b.Serve(ctx, ln, time.Second) }()
	defer func() {
		cancel()
		<-served
	}()
	connect := func(hostPort string) (*http.Response, net.Conn, *bufio.Reader) {
		t.Helper()
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		auth := base64.StdEncoding.EncodeToString([]byte("dev-agent:test-token"))
		fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", hostPort, hostPort, auth)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil {
			t.Fatal(err)
		}
		return resp, conn, br
	}

	resp, _, _ := connect("api.github.com:443")
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), codeCAUnavailable) || strings.Contains(string(body), "sealed") {
		t.Fatalf("intercepted CONNECT with no CA: %d %s", resp.StatusCode, body)
	}
	select {
	case ev := <-events:
		if ev["status"] != float64(503) || !strings.Contains(fmt.Sprint(ev["error"]), "vault is sealed") || ev["host"] != "api.github.com" {
			t.Fatalf("event: %v", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no audit event for the refused CONNECT")
	}

	resp, conn, br := connect("localhost:" + opaque.URL[strings.LastIndex(opaque.URL, ":")+1:])
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("opaque CONNECT with no CA: %d", resp.StatusCode)
	}
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
	got, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(got.Body); string(b) != "opaque ok" {
		t.Fatalf("opaque tunnel answered %q", b)
	}

	w := httptest.NewRecorder()
	AdminHandler(m, credentialState{}, policyState("r1")).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	var rz struct {
		Status string
		CA     map[string]any
	}
	_ = json.Unmarshal(w.Body.Bytes(), &rz)
	if w.Code != http.StatusServiceUnavailable || rz.Status != "not ready" || rz.CA["source"] != "vault_pki" ||
		!strings.Contains(fmt.Sprint(rz.CA["error"]), "sealed") {
		t.Fatalf("/readyz: %d %s", w.Code, w.Body)
	}
}

// TestCAUnavailableTransparent: a redirected TLS connection the policy would intercept is
// closed and audited while the CA cannot sign; redirected plain HTTP is still served.
func TestCAUnavailableTransparent(t *testing.T) {
	e := newTransparentEnv(t)
	ca, err := certs.StartVaultPKI(t.Context(), certs.VaultPKIOptions{Signer: sealedVault{}, Path: "pki/root/sign-intermediate", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	e.b.certs = certs.NewCache(ca, 10)
	e.redirect(t, "api.github.com", 443)
	if resp, err := e.client().Get("https://api.github.com/user"); err == nil {
		resp.Body.Close()
		t.Fatalf("TLS intercepted with no CA: %d", resp.StatusCode)
	}
	if ev := e.event(t, phase("connect")); ev["status"] != float64(503) || ev["mode"] != "transparent" ||
		!strings.Contains(fmt.Sprint(ev["error"]), "vault is sealed") {
		t.Fatalf("event: %v", ev)
	}
	e.redirect(t, "plain.test", 80)
	resp, err := e.client().Get("http://plain.test/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("plain HTTP with no CA: %d", resp.StatusCode)
	}
}
