package integration

// More of issue 35 against a real squid: squid with ssl-bump as a proxy that inspects TLS, an
// https:// proxy, an HTTP/2 upstream reached through squid, and unchanged agents (curl, Python,
// Node) while the broker chains through squid. As in upstream_proxy_test.go, squid leaves from
// squidOutgoing and every origin records its peers, so a path that went direct is seen.

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capbroker/capbroker/internal/testpki"
)

const squidCertgen = "/usr/lib/squid/security_file_certgen"

// writeCertPEM writes c (leaf and key) as PEM files in dir.
func writeCertPEM(t *testing.T, dir, name string, c tls.Certificate) (certFile, keyFile string) {
	t.Helper()
	key, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	var chain []byte
	for _, der := range c.Certificate {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	return writeFile(t, dir, name+".pem", string(chain)),
		writeFile(t, dir, name+".key", string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key})))
}

// squidEntryTLS is an https:// proxy entry with its own CA file.
func squidEntryTLS(name, addr, caFile, passwordEnv string) string {
	return fmt.Sprintf("      - {name: %s, url: \"https://%s\", ca_file: %q, username: broker, password: {env: %s}}", name, addr, caFile, passwordEnv)
}

var helloHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(w, "hello %s %s proto=%s", r.Host, r.URL.Path, r.Proto)
})

// TestUpstreamProxySquidBump puts squid with ssl-bump (a proxy that inspects TLS with its own
// CA) between the broker and an HTTPS origin: the broker refuses the re-signed origin unless
// the operator named squid's CA in upstream.proxy.tls_inspection_ca, and then says so in the
// audit event.
func TestUpstreamProxySquidBump(t *testing.T) {
	if out, _ := exec.Command(squidBin, "-v").Output(); !strings.Contains(string(out), "--with-openssl") {
		t.Skip("squid has no OpenSSL (no ssl-bump): scripts/install-test-tools.sh installs squid-openssl")
	}
	if _, err := os.Stat(squidCertgen); err != nil {
		t.Skipf("%s missing", squidCertgen)
	}
	dir := squidDir(t)
	caCert, caKey := filepath.Join(dir, "squid-ca.pem"), filepath.Join(dir, "squid-ca.key")
	if out, err := exec.Command("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
		"-keyout", caKey, "-out", caCert, "-subj", "/CN=squid inspection CA",
		"-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign").CombinedOutput(); err != nil {
		t.Fatalf("openssl: %v %s", err, out)
	}
	_ = os.Chmod(caKey, 0o644)
	ssldb := filepath.Join(dir, "ssl_db")
	if out, err := exec.Command(squidCertgen, "-c", "-s", ssldb, "-M", "4MB").CombinedOutput(); err != nil {
		t.Fatalf("certgen: %v %s", err, out)
	}
	_ = exec.Command("chown", "-R", "proxy:proxy", ssldb).Run()

	pki := newUpstreamPKI(t)
	originCA := writeFile(t, dir, "origin-ca.pem", string(pki.PEM))
	password := "squid-pw-" + randHex(8)
	// peek, stare, then bump: squid mimics the origin's certificate (its IP SAN included). A
	// client-first "ssl_bump bump all" signs a certificate for the CONNECT target as CN only,
	// which no client accepts for an IP (docs/upstream-proxy.md says what to ask for).
	squid := startSquidWith(t, dir, "broker", password, func(addr string) string {
		return fmt.Sprintf("http_port %s ssl-bump tls-cert=%s tls-key=%s generate-host-certificates=on dynamic_cert_mem_cache_size=4MB", addr, caCert, caKey)
	}, fmt.Sprintf(`sslcrtd_program %s -s %s -M 4MB
sslcrtd_children 2 startup=1 idle=1
acl step1 at_step SslBump1
acl step2 at_step SslBump2
ssl_bump peek step1
ssl_bump stare step2
ssl_bump bump all
tls_outgoing_options cafile=%s`, squidCertgen, ssldb, originCA))
	tlsAddr, tlsPeers := originServer(t, pki, helloHandler)

	broker := func(t *testing.T, inspection string) (*brokerProc, *http.Client) {
		token := randHex(16)
		proxies := squidEntry("corp", squid.addr, "SQUID_PW")
		if inspection != "" {
			proxies += fmt.Sprintf("\n    tls_inspection_ca: %q", inspection)
		}
		b := startBroker(t, brokerOpts{
			policy: upstreamProxyPolicy,
			files:  map[string]string{"data.json": `{"opaque_port": 1}`},
			mode:   "enforce",
			config: upstreamProxyConfig(pki.File, proxies),
			env:    []string{tokenEnv(agentID) + "=" + token, "SQUID_PW=" + password},
		})
		return b, b.client(t, agentID, token)
	}

	t.Run("not trusted unless the operator says so", func(t *testing.T) {
		b, c := broker(t, "")
		resp, body := getBody(t, c, "https://"+tlsAddr+"/bumped")
		var e struct{ Error string }
		_ = json.Unmarshal([]byte(body), &e)
		if resp.StatusCode != http.StatusBadGateway || e.Error != "upstream_error" || strings.Contains(body, "hello") {
			t.Fatalf("got %d %s", resp.StatusCode, body)
		}
		ev := b.waitAudit(t, resp.Header.Get("X-Broker-Request-Id"))
		if ev["tls_inspected"] != nil || fmt.Sprint(ev["status"]) != "502" || !strings.Contains(fmt.Sprint(ev["error"]), "certificate") {
			t.Fatalf("audit: %v", ev)
		}
	})
	t.Run("trusted through tls_inspection_ca, and audited", func(t *testing.T) {
		b, c := broker(t, caCert)
		resp, body := getBody(t, c, "https://"+tlsAddr+"/bumped")
		if resp.StatusCode != 200 || !strings.Contains(body, "hello") {
			t.Fatalf("got %d %s\naudit: %v", resp.StatusCode, body, b.waitAudit(t, resp.Header.Get("X-Broker-Request-Id")))
		}
		ev := b.waitAudit(t, resp.Header.Get("X-Broker-Request-Id"))
		if ev["tls_inspected"] != true || ev["via"] != "corp" {
			t.Fatalf("audit: %v", ev)
		}
		tlsPeers.onlyThroughSquid(t)
	})
}

// TestUpstreamProxySquidHTTPS chains through an https:// squid (its own certificate, trusted
// through the proxy's ca_file): plain HTTP, intercepted HTTPS, an HTTP/2 origin and an opaque
// tunnel.
func TestUpstreamProxySquidHTTPS(t *testing.T) {
	dir := squidDir(t)
	proxyPKI := testpki.New(t, "corp proxy CA")
	cert, key := writeCertPEM(t, dir, "proxy", proxyPKI.Server(t, time.Now().Add(time.Hour), squidOutgoing))
	password := "squid-pw-" + randHex(8)
	squid := startSquidWith(t, dir, "broker", password, func(addr string) string {
		return fmt.Sprintf("https_port %s tls-cert=%s tls-key=%s", addr, cert, key)
	}, "")
	pki := newUpstreamPKI(t)
	plainAddr, plainPeers := originServer(t, nil, helloHandler)
	tlsAddr, tlsPeers := originServer(t, pki, helloHandler)
	h2Addr, h2Peers := originServerH2(t, pki, helloHandler)
	opaqueAddr, opaquePeers := originServer(t, pki, helloHandler)
	_, opaquePort, _ := net.SplitHostPort(opaqueAddr)

	token := randHex(16)
	b := startBroker(t, brokerOpts{
		policy: upstreamProxyPolicy,
		files:  map[string]string{"data.json": `{"opaque_port": ` + opaquePort + `}`},
		mode:   "enforce",
		config: upstreamProxyConfig(pki.File, squidEntryTLS("corp", squid.addr, proxyPKI.File, "SQUID_PW")),
		env:    []string{tokenEnv(agentID) + "=" + token, "SQUID_PW=" + password},
	})
	client := b.client(t, agentID, token)
	for _, tc := range []struct {
		name, url string
		peers     *peers
	}{
		{"plain HTTP", "http://" + plainAddr + "/plain", plainPeers},
		{"intercepted HTTPS", "https://" + tlsAddr + "/tls", tlsPeers},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := getBody(t, client, tc.url)
			if resp.StatusCode != 200 || !strings.Contains(body, "hello") {
				t.Fatalf("got %d %q", resp.StatusCode, body)
			}
			if ev := b.waitAudit(t, resp.Header.Get("X-Broker-Request-Id")); ev["via"] != "corp" {
				t.Fatalf("audit: %v", ev)
			}
			tc.peers.onlyThroughSquid(t)
		})
	}
	t.Run("HTTP/2 origin", func(t *testing.T) {
		pu, _ := url.Parse(b.proxyURL(agentID, token))
		c := &http.Client{Timeout: waitTimeout, Transport: &http.Transport{Proxy: http.ProxyURL(pu),
			TLSClientConfig: &tls.Config{RootCAs: b.caPool(t)}, ForceAttemptHTTP2: true}}
		resp, body := getBody(t, c, "https://"+h2Addr+"/h2")
		if resp.StatusCode != 200 || !strings.Contains(body, "proto=HTTP/2.0") {
			t.Fatalf("got %d %q", resp.StatusCode, body)
		}
		if ev := b.waitAudit(t, resp.Header.Get("X-Broker-Request-Id")); ev["via"] != "corp" {
			t.Fatalf("audit: %v", ev)
		}
		h2Peers.onlyThroughSquid(t)
	})
	t.Run("opaque tunnel", func(t *testing.T) {
		pu, _ := url.Parse(b.proxyURL(agentID, token))
		c := &http.Client{Timeout: waitTimeout, Transport: &http.Transport{Proxy: http.ProxyURL(pu),
			TLSClientConfig: &tls.Config{RootCAs: pki.Pool}}} // the origin's own certificate: not intercepted
		resp, body := getBody(t, c, "https://"+opaqueAddr+"/opaque")
		if resp.StatusCode != 200 || !strings.Contains(body, "hello") {
			t.Fatalf("got %d %q", resp.StatusCode, body)
		}
		c.CloseIdleConnections() // the tunnel's event is written when it ends
		b.waitAuditWhere(t, 1, "the tunnel's event via corp", func(ev auditEvent) bool {
			return ev["phase"] == "connect" && ev["via"] == "corp" && fmt.Sprint(ev["port"]) == opaquePort
		})
		opaquePeers.onlyThroughSquid(t)
	})
	t.Run("proxy certificate not trusted", func(t *testing.T) {
		token2 := randHex(16)
		b2 := startBroker(t, brokerOpts{
			policy: upstreamProxyPolicy,
			files:  map[string]string{"data.json": `{"opaque_port": 1}`},
			mode:   "enforce",
			// The origins' CA, not the proxy's: the broker must not talk to this proxy.
			config: upstreamProxyConfig(pki.File, squidEntryTLS("corp", squid.addr, pki.File, "SQUID_PW")),
			env:    []string{tokenEnv(agentID) + "=" + token2, "SQUID_PW=" + password},
		})
		plainPeers.mu.Lock()
		before := len(plainPeers.seen)
		plainPeers.mu.Unlock()
		resp, body := getBody(t, b2.client(t, agentID, token2), "http://"+plainAddr+"/untrusted")
		if resp.StatusCode != http.StatusBadGateway || strings.Contains(body, "hello") || strings.Contains(body, password) {
			t.Fatalf("got %d %s", resp.StatusCode, body)
		}
		plainPeers.mu.Lock()
		after := len(plainPeers.seen)
		plainPeers.mu.Unlock()
		if after != before {
			t.Fatal("with the proxy's certificate untrusted, the request reached the origin")
		}
	})
}

// originServerH2 is originServer offering only h2 in ALPN.
func originServerH2(t *testing.T, pki *upstreamPKI, h http.Handler) (string, *peers) {
	t.Helper()
	l, err := net.Listen("tcp", originIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	p := &peers{}
	srv := &http.Server{Handler: h}
	srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{pki.Server(t, time.Now().Add(time.Hour), originIP)}, NextProtos: []string{"h2"}}
	go srv.ServeTLS(recordingListener{l, p}, "", "")
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String(), p
}

// TestUpstreamProxySquidClients runs real agents, unchanged, through the broker while the
// broker chains through squid: each gets its answer and the origins see squid only.
func TestUpstreamProxySquidClients(t *testing.T) {
	modules := nodeModules(t)
	password := "squid-pw-" + randHex(8)
	squid := startSquid(t, "broker", password)
	pki := newUpstreamPKI(t)
	plainAddr, plainPeers := originServer(t, nil, helloHandler)
	tlsAddr, tlsPeers := originServer(t, pki, helloHandler)
	token := randHex(16)
	b := startBroker(t, brokerOpts{
		policy: upstreamProxyPolicy,
		files:  map[string]string{"data.json": `{"opaque_port": 1}`},
		mode:   "enforce",
		config: upstreamProxyConfig(pki.File, squidEntry("corp", squid.addr, "SQUID_PW")),
		env:    []string{tokenEnv(agentID) + "=" + token, "SQUID_PW=" + password},
	})
	e := &env{t: t, broker: b, token: token}
	agent := e.agentEnv()
	node := nodeScript(t, modules, `import { setGlobalDispatcher, EnvHttpProxyAgent } from 'undici';
setGlobalDispatcher(new EnvHttpProxyAgent());
const r = await fetch(process.argv[2]);
console.log(r.status, await r.text());
`)
	const py = `import sys, urllib.request
r = urllib.request.urlopen(sys.argv[1], timeout=30)
print(r.status, r.read().decode())`
	const pyRequests = `import sys, requests
r = requests.get(sys.argv[1], timeout=30)
print(r.status_code, r.text)`
	hasRequests := exec.Command("python3", "-c", "import requests").Run() == nil
	for _, u := range []string{"http://" + plainAddr + "/agent", "https://" + tlsAddr + "/agent"} {
		for _, cl := range []struct {
			name string
			args []string
		}{
			{"curl", []string{"curl", "-sS", "--max-time", "30", u}},
			{"python", []string{"python3", "-c", py, u}},
			{"python-requests", []string{"python3", "-c", pyRequests, u}},
			{"node", []string{"node", node, u}},
		} {
			t.Run(cl.name+" "+strings.SplitN(u, ":", 2)[0], func(t *testing.T) {
				if cl.name == "python-requests" && !hasRequests {
					t.Skip("python3 has no requests module")
				}
				out := e.run(t.TempDir(), agent, cl.args[0], cl.args[1:]...)
				if !strings.Contains(out, "hello "+u[strings.Index(u, "//")+2:strings.LastIndex(u, "/")]+" /agent") {
					t.Fatalf("%s printed %q", cl.name, out)
				}
			})
		}
	}
	plainPeers.onlyThroughSquid(t)
	tlsPeers.onlyThroughSquid(t)
	if n := len(b.waitAuditWhere(t, 6, "six requests via corp", func(ev auditEvent) bool {
		return ev["via"] == "corp" && ev["phase"] != "connect"
	})); n < 6 { // six at least: eight with requests
		t.Fatalf("%d events via corp", n)
	}
}
