//go:build linux

package integration

// The broker behind a corporate proxy where the proxy is the only way out (issue 35): three
// network namespaces of the test's own, joined in a line, and nothing else.
//
//	broker namespace             squid namespace               upstream namespace
//	 broker (proxy, admin        squid on 10.235.0.2:3128      origins, Vault's relay and the
//	 on its loopback)   veth     (Basic auth, an ACL)  veth    OAuth2 token endpoint, all on
//	 10.235.0.1       <------>   10.235.0.2  10.235.1.1 <----> 10.235.1.2
//	 no other route              forwarding off                 no route to the broker
//
// The broker's namespace has a route to squid's address only; squid's does not forward, so
// nothing the broker sends reaches 10.235.1.2 unless squid itself makes the connection. Every
// path that works here went through squid; the origins' peers (always squid's 10.235.1.1)
// are checked too. Agents are the test's Go clients, whose connections are made inside the
// broker's namespace.

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/capbroker/capbroker/credentials/vaulttest"
)

const (
	egressBrokerIP = "10.235.0.1"
	egressSquidIP  = "10.235.0.2" // squid, as the broker reaches it
	egressSquidOut = "10.235.1.1" // squid, as the upstreams see it
	egressOriginIP = "10.235.1.2"
	egressSquid    = egressSquidIP + ":3128"
	egressDead     = egressSquidIP + ":3129" // nothing listens there: a proxy that is down
	egressBlocked  = "8444"                  // an origin port squid's ACL refuses (403)
)

// egressNet is the three namespaces. brokerNS may be one the caller made (transparent mode's
// sandbox topology): the line is attached to it.
type egressNet struct {
	brokerNS, squidNS, upNS string
}

// newEgressNet makes the squid and upstream namespaces, and the broker's unless brokerNS is
// given, with the links between them, and removes what it made when the test ends.
func newEgressNet(t *testing.T, brokerNS string) *egressNet {
	t.Helper()
	requireNetns(t)
	id := randHex(3)
	n := &egressNet{brokerNS: brokerNS, squidNS: "proxy35-" + id + "-s", upNS: "proxy35-" + id + "-u"}
	made := []string{n.squidNS, n.upNS}
	if brokerNS == "" {
		n.brokerNS = "proxy35-" + id + "-b"
		made = append(made, n.brokerNS)
	}
	t.Cleanup(func() {
		for _, ns := range made {
			_ = exec.Command("ip", "netns", "del", ns).Run()
		}
	})
	for _, ns := range made {
		ipCmd(t, "netns", "add", ns)
		ipCmd(t, "-n", ns, "link", "set", "lo", "up")
	}
	link := func(a, b, aIP, bIP, aDev, bDev string) {
		ipCmd(t, "link", "add", aDev, "type", "veth", "peer", "name", bDev)
		ipCmd(t, "link", "set", aDev, "netns", a)
		ipCmd(t, "link", "set", bDev, "netns", b)
		ipCmd(t, "-n", a, "addr", "add", aIP+"/30", "dev", aDev)
		ipCmd(t, "-n", b, "addr", "add", bIP+"/30", "dev", bDev)
		ipCmd(t, "-n", a, "link", "set", aDev, "up")
		ipCmd(t, "-n", b, "link", "set", bDev, "up")
	}
	link(n.brokerNS, n.squidNS, egressBrokerIP, egressSquidIP, "px35"+id+"b", "px35"+id+"s")
	link(n.squidNS, n.upNS, egressSquidOut, egressOriginIP, "px35"+id+"o", "px35"+id+"u")
	// A new namespace does not forward by default; say so rather than rely on it.
	if out, err := exec.Command("ip", "netns", "exec", n.squidNS, "sysctl", "-qw", "net.ipv4.ip_forward=0").CombinedOutput(); err != nil {
		t.Fatalf("sysctl: %v %s", err, out)
	}
	return n
}

// nsDial dials from inside namespace ns: the socket is made on an OS thread switched into
// it (and keeps it), as an agent in that namespace would.
func nsDial(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			f, err := os.Open(filepath.Join("/run/netns", ns))
			if err == nil {
				err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
				f.Close()
			}
			if err != nil {
				ch <- result{nil, err}
				return
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			ch <- result{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
}

// listenIn opens a TCP listener on addr inside namespace ns.
func listenIn(t *testing.T, ns, addr string) net.Listener {
	t.Helper()
	var l net.Listener
	inNetns(t, ns, func() (err error) {
		l, err = net.Listen("tcp", addr)
		return err
	})
	t.Cleanup(func() { l.Close() })
	return l
}

// origin serves h in the upstream namespace (TLS from pki unless nil; h2 offers only h2) and
// records its peers.
func (n *egressNet) origin(t *testing.T, port string, pki *upstreamPKI, h2 bool, h http.Handler) (string, *peers) {
	t.Helper()
	l := listenIn(t, n.upNS, net.JoinHostPort(egressOriginIP, port))
	p := &peers{}
	srv := &http.Server{Handler: h}
	var rl net.Listener = recordingListener{l, p}
	if pki != nil {
		cfg := &tls.Config{Certificates: []tls.Certificate{pki.Server(t, time.Now().Add(time.Hour), egressOriginIP, "api.cb.test")}}
		if h2 {
			cfg.NextProtos = []string{"h2"}
			srv.TLSConfig = cfg
			go srv.ServeTLS(rl, "", "")
		} else {
			go srv.Serve(tls.NewListener(rl, cfg))
		}
	} else {
		go srv.Serve(rl)
	}
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String(), p
}

// relay listens in the upstream namespace and forwards each connection to target, in the
// test's own namespace: a service (Vault) reachable, from the broker, through squid only.
func (n *egressNet) relay(t *testing.T, target string) (string, *peers) {
	t.Helper()
	l := listenIn(t, n.upNS, egressOriginIP+":0")
	return l.Addr().String(), relayFrom(l, target)
}

// fromSquidOnly fails unless p saw a connection, all from squid's upstream side.
func (p *peers) fromSquidOnly(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.seen) == 0 {
		t.Fatal("the upstream saw no connection")
	}
	for _, h := range p.seen {
		if h != egressSquidOut {
			t.Fatalf("the upstream saw a connection from %s, not from squid (%s)", h, egressSquidOut)
		}
	}
}

func (p *peers) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.seen)
}

// startSquidIn runs squid in the squid namespace on egressSquid, with Basic auth (user,
// password), letting through only destinations on egressOriginIP, but not its port
// egressBlocked.
func (n *egressNet) startSquid(t *testing.T, user, password string) *squidProc {
	t.Helper()
	for _, bin := range []string{squidBin, squidAuthBin} {
		if _, err := os.Stat(bin); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("squid is missing (%s): scripts/install-test-tools.sh installs it", bin)
			}
			t.Skipf("squid not installed (%s): scripts/install-test-tools.sh installs it", bin)
		}
	}
	dir, err := os.MkdirTemp("", "proxy35-squid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o777)
	hash, err := exec.Command("openssl", "passwd", "-apr1", password).Output()
	if err != nil {
		t.Fatal(err)
	}
	htpasswd := writeFile(t, dir, "htpasswd", user+":"+strings.TrimSpace(string(hash))+"\n")
	conf := writeFile(t, dir, "squid.conf", fmt.Sprintf(`http_port %s
pid_filename none
cache_log %s/cache.log
access_log %s/access.log
cache deny all
coredump_dir %s
shutdown_lifetime 0 seconds
dns_nameservers 127.0.0.1
auth_param basic program %s %s
auth_param basic realm corp
acl authed proxy_auth REQUIRED
acl origins dst %s
acl blocked port %s
http_access deny !authed
http_access deny blocked
http_access allow origins
http_access deny all
`, egressSquid, dir, dir, dir, squidAuthBin, htpasswd, egressOriginIP, egressBlocked))
	cmd := exec.Command("ip", "netns", "exec", n.squidNS, squidBin, "-N", "-f", conf)
	cmd.Dir = dir
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &squidProc{addr: egressSquid, cmd: cmd}
	t.Cleanup(s.stop)
	dial := nsDial(n.brokerNS)
	deadline := time.Now().Add(waitTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := dial(ctx, "tcp", egressSquid)
		cancel()
		if err == nil {
			c.Close()
			return s
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(dir, "cache.log"))
			t.Fatalf("squid did not listen on %s: %v\n%s\n%s", egressSquid, err, logs.String(), b)
		}
		time.Sleep(50 * time.Millisecond) // polling a listener that appears, not synchronising
	}
}

// agentClient is an agent in the broker's namespace, using the broker as its proxy.
func (n *egressNet) agentClient(t *testing.T, b *brokerProc, token string, h2 bool) *http.Client {
	t.Helper()
	pu, _ := url.Parse(b.proxyURL(agentID, token))
	return &http.Client{Timeout: waitTimeout, Transport: &http.Transport{Proxy: http.ProxyURL(pu), DialContext: nsDial(n.brokerNS),
		TLSClientConfig: &tls.Config{RootCAs: b.caPool(t)}, ForceAttemptHTTP2: h2}}
}

// admin GETs path on the broker's admin listener, from its namespace.
func (n *egressNet) admin(t *testing.T, b *brokerProc, path string) string {
	t.Helper()
	c := &http.Client{Timeout: waitTimeout, Transport: &http.Transport{DialContext: nsDial(n.brokerNS)}}
	_, body := getBody(t, c, "http://"+b.adminAddr+path)
	return body
}

const egressPolicy = `package broker

import rego.v1

default decision := {"allow": true, "intercept": true}

decision := {"allow": true, "intercept": false} if {
	input.phase == "connect"
	input.request.port == data.opaque_port
}

decision := {"allow": true, "credentials": ["api"]} if {
	input.phase == "request"
	input.request.path == "/api/minted"
}

decision := {"allow": true, "upstream_proxy": "direct"} if input.request.path == "/direct"
`

// egressConfig is a broker config with upstream.proxy's proxies (YAML list entries) and
// extra appended.
func egressConfig(caFile, proxies, extra string) string {
	return fmt.Sprintf(`upstream:
  ca_file: %q
  allow_private: ["%s/32"]
  proxy:
    proxies:
%s
agents:
  - {id: %s, token_env: %s}
`, caFile, egressOriginIP, proxies, agentID, tokenEnv(agentID)) + extra
}

// proxyError is the agent's JSON error body.
type proxyError struct{ Error, Reason string }

func decodeProxyError(body string) proxyError {
	var e proxyError
	_ = json.Unmarshal([]byte(body), &e)
	return e
}

func TestUpstreamProxyEgressOnlySquid(t *testing.T) {
	n := newEgressNet(t, "")
	password := "squid-pw-" + randHex(8)
	n.startSquid(t, "broker", password)
	pki := newUpstreamPKI(t)
	plainAddr, plainPeers := n.origin(t, "0", nil, false, helloHandler)
	tlsAddr, tlsPeers := n.origin(t, "0", pki, false, helloHandler)
	h2Addr, h2Peers := n.origin(t, "0", pki, true, helloHandler)
	opaqueAddr, opaquePeers := n.origin(t, "0", pki, false, helloHandler)
	blockedAddr, blockedPeers := n.origin(t, egressBlocked, pki, false, helloHandler)
	_, opaquePort, _ := net.SplitHostPort(opaqueAddr)

	// The broker's own clients: Vault (through a relay in the upstream namespace) holds the
	// OAuth2 client secret; the token endpoint mints a token; the API wants that token.
	vault := vaulttest.Start(t)
	vaultAddr, vaultPeers := n.relay(t, strings.TrimPrefix(vault.Addr, "http://"))
	clientSecret := "oauth-client-secret-" + randHex(12)
	if _, err := vault.Client().KVv2("secret").Put(t.Context(), "broker/oauth", map[string]any{"client_secret": clientSecret}); err != nil {
		t.Fatal(err)
	}
	minted := "minted-" + randHex(12)
	tokenAddr, tokenPeers := n.origin(t, "0", pki, false, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id, secret, ok := r.BasicAuth(); !ok || id != "capbroker" || secret != clientSecret || r.FormValue("grant_type") != "client_credentials" {
			http.Error(w, `{"error":"invalid_client"}`, http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"access_token":%q,"token_type":"Bearer","expires_in":3600}`, minted)
	}))
	apiAddr, apiPeers := n.origin(t, "0", pki, false, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+minted {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		fmt.Fprint(w, "api ok")
	}))

	token := randHex(16)
	proxies := squidEntry("dead", egressDead, "SQUID_PW") + "\n" + squidEntry("corp", egressSquid, "SQUID_PW")
	b := startBroker(t, brokerOpts{
		netns:  n.brokerNS,
		policy: egressPolicy,
		files:  map[string]string{"data.json": `{"opaque_port": ` + opaquePort + `}`},
		mode:   "enforce",
		config: egressConfig(pki.File, proxies, fmt.Sprintf(`vault:
  address: http://%s
  auth: {method: token, token_env: BROKER_VAULT_TOKEN}
credentials:
  - name: api
    hosts: ["%s"]
    source: {vault: {mount: secret, path: broker/oauth, field: client_secret}}
    oauth2:
      token_url: https://%s/token
      grant: client_credentials
      client_id: capbroker
      client_auth: client_secret_basic
`, vaultAddr, egressOriginIP, tokenAddr)),
		env: []string{tokenEnv(agentID) + "=" + token, "SQUID_PW=" + password, "BROKER_VAULT_TOKEN=" + vault.RootToken},
	})
	client := n.agentClient(t, b, token, false)

	t.Run("the broker's namespace has no way to the upstreams but squid", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		if c, err := nsDial(n.brokerNS)(ctx, "tcp", tlsAddr); err == nil {
			c.Close()
			t.Fatal("the broker's namespace reached an origin directly")
		}
		resp, body := getBody(t, client, "http://"+plainAddr+"/direct")
		if resp.StatusCode != http.StatusBadGateway || strings.Contains(body, "hello") {
			t.Fatalf("a policy route of direct: %d %s", resp.StatusCode, body)
		}
	})

	check := func(t *testing.T, resp *http.Response, body, want string, p *peers) {
		t.Helper()
		if resp.StatusCode != 200 || !strings.Contains(body, want) {
			t.Fatalf("got %d %q", resp.StatusCode, body)
		}
		if ev := b.waitAudit(t, resp.Header.Get("X-Broker-Request-Id")); ev["via"] != "corp" {
			t.Fatalf("audit via = %v, want corp: %v", ev["via"], ev)
		}
		p.fromSquidOnly(t)
	}
	t.Run("plain HTTP", func(t *testing.T) {
		resp, body := getBody(t, client, "http://"+plainAddr+"/plain")
		check(t, resp, body, "hello", plainPeers)
	})
	t.Run("intercepted HTTPS", func(t *testing.T) {
		resp, body := getBody(t, client, "https://"+tlsAddr+"/tls")
		check(t, resp, body, "proto=HTTP/1.1", tlsPeers)
	})
	t.Run("HTTP/2 origin", func(t *testing.T) {
		resp, body := getBody(t, n.agentClient(t, b, token, true), "https://"+h2Addr+"/h2")
		check(t, resp, body, "proto=HTTP/2.0", h2Peers)
	})
	t.Run("opaque tunnel", func(t *testing.T) {
		pu, _ := url.Parse(b.proxyURL(agentID, token))
		c := &http.Client{Timeout: waitTimeout, Transport: &http.Transport{Proxy: http.ProxyURL(pu), DialContext: nsDial(n.brokerNS),
			TLSClientConfig: &tls.Config{RootCAs: pki.Pool}}} // the origin's own certificate: not intercepted
		resp, body := getBody(t, c, "https://"+opaqueAddr+"/opaque")
		if resp.StatusCode != 200 || !strings.Contains(body, "hello") {
			t.Fatalf("got %d %q", resp.StatusCode, body)
		}
		c.CloseIdleConnections() // the tunnel's event is written when it ends
		b.waitAuditWhere(t, 1, "the tunnel's event via corp", func(ev auditEvent) bool {
			return ev["phase"] == "connect" && ev["via"] == "corp" && fmt.Sprint(ev["port"]) == opaquePort
		})
		opaquePeers.fromSquidOnly(t)
	})
	t.Run("WebSocket", func(t *testing.T) {
		wsAddr, wsPeers := n.origin(t, "0", pki, false, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			fmt.Fprintf(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
				wsAccept(r.Header.Get("Sec-WebSocket-Key")))
			// One masked text frame of 4 bytes in; the same text back, unmasked.
			frame := make([]byte, 10)
			if _, err := io.ReadFull(brw, frame); err != nil {
				return
			}
			text := make([]byte, 4)
			for i := range text {
				text[i] = frame[6+i] ^ frame[2+i%4]
			}
			conn.Write(append([]byte{0x81, 0x04}, text...))
			_, _ = brw.ReadByte() // until the client closes
		}))
		// A real client's bytes, from the broker's namespace: Python's socket and ssl.
		ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
		defer cancel()
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", n.brokerNS, "python3", "-c", wsProbe,
			b.proxyAddr, wsAddr, agentID+":"+token, b.caFile).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "101 echo=ping") {
			t.Fatalf("WebSocket through the broker: %v\n%s", err, out)
		}
		b.waitAuditWhere(t, 1, "the WebSocket exchange via corp", func(ev auditEvent) bool {
			return ev["path"] == "/ws" && ev["via"] == "corp" && ev["status"] == float64(101)
		})
		wsPeers.fromSquidOnly(t)
	})
	t.Run("the broker's own clients: Vault and the token endpoint", func(t *testing.T) {
		resp, body := getBody(t, client, "https://"+apiAddr+"/api/minted")
		check(t, resp, body, "api ok", apiPeers)
		vaultPeers.fromSquidOnly(t)
		tokenPeers.fromSquidOnly(t)
		if strings.Contains(b.logs.String(), password) || strings.Contains(b.auditLog.String(), password) {
			t.Fatal("the proxy password is in the broker's output")
		}
	})
	t.Run("squid's ACL refuses: its reason, distinct from the broker's", func(t *testing.T) {
		for _, u := range []string{"https://" + blockedAddr + "/x", "http://" + blockedAddr + "/x"} {
			resp, body := getBody(t, client, u)
			e := decodeProxyError(body)
			if resp.StatusCode != http.StatusBadGateway || e.Error != "upstream_proxy_refused" || !strings.Contains(e.Reason, "403") ||
				!strings.Contains(e.Reason, "ERR_ACCESS_DENIED") || !strings.Contains(e.Reason, "corp") {
				t.Fatalf("%s: %d %s", u, resp.StatusCode, body)
			}
		}
		if blockedPeers.count() != 0 {
			t.Fatal("the refused origin was reached")
		}
	})
	t.Run("metrics and readyz", func(t *testing.T) {
		m := n.admin(t, b, "/metrics")
		for _, want := range []string{
			`capbroker_upstream_proxy_requests_total{client="agent",proxy="corp",result="ok"}`,
			// The broker's own connections (Vault, the token endpoint), each trying the dead
			// proxy first.
			`capbroker_upstream_proxy_requests_total{client="broker",proxy="corp",result="ok"}`,
			`capbroker_upstream_proxy_requests_total{client="broker",proxy="dead",result="failed"}`,
		} {
			if !strings.Contains(m, want) {
				t.Fatalf("no %s in metrics:\n%s", want, grepLines(m, "upstream_proxy"))
			}
		}
		var ready map[string]any
		_ = json.Unmarshal([]byte(n.admin(t, b, "/readyz")), &ready)
		down, _ := ready["upstream_proxies"].(map[string]any)
		if down["dead"] == nil || down["corp"] != nil {
			t.Fatalf("readyz: %v", ready)
		}
	})

	t.Run("a reload that changes upstream.proxy reaches the broker's own clients", func(t *testing.T) {
		// A new credential, read from Vault at the reload, by the Vault client the broker
		// started with: its connection must go the new way.
		if _, err := vault.Client().KVv2("secret").Put(t.Context(), "broker/other", map[string]any{"v": "other-" + randHex(8)}); err != nil {
			t.Fatal(err)
		}
		cfgFile := filepath.Join(b.dir, "broker.yaml")
		raw, err := os.ReadFile(cfgFile)
		if err != nil {
			t.Fatal(err)
		}
		next := strings.Replace(string(raw), proxies, squidEntry("corp-b", egressSquid, "SQUID_PW"), 1) + fmt.Sprintf(`  - name: other
    hosts: ["%s"]
    source: {vault: {mount: secret, path: broker/other, field: v}}
    inject: {header: X-Other, value: "{{secret}}"}
`, egressOriginIP)
		if !strings.Contains(next, "corp-b") {
			t.Fatal("the config was not changed")
		}
		before := vaultPeers.count()
		mark := b.logs.mark()
		if err := os.WriteFile(cfgFile, []byte(next), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := b.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		b.logs.waitFrom(t, mark, `"message":"upstream.proxy changed: the broker's own connections follow it from now"`)
		b.logs.waitFrom(t, mark, `"message":"config reloaded"`)
		if vaultPeers.count() == before {
			t.Fatal("the reload read no credential from Vault")
		}
		vaultPeers.fromSquidOnly(t)
		m := n.admin(t, b, "/metrics")
		if want := `capbroker_upstream_proxy_requests_total{client="broker",proxy="corp-b",result="ok"}`; !strings.Contains(m, want) {
			t.Fatalf("no %s in metrics:\n%s", want, grepLines(m, "upstream_proxy"))
		}
		resp, body := getBody(t, client, "http://"+plainAddr+"/after-reload")
		if resp.StatusCode != 200 || b.waitAudit(t, resp.Header.Get("X-Broker-Request-Id"))["via"] != "corp-b" {
			t.Fatalf("after the reload: %d %s", resp.StatusCode, body)
		}
	})

	// Brokers whose proxy refuses them or is down: no Vault, no credential.
	failing := func(t *testing.T, proxies, pw string) (*brokerProc, string) {
		tok := randHex(16)
		return startBroker(t, brokerOpts{
			netns:  n.brokerNS,
			policy: egressPolicy,
			files:  map[string]string{"data.json": `{"opaque_port": ` + opaquePort + `}`},
			mode:   "enforce",
			config: egressConfig(pki.File, proxies, ""),
			env:    []string{tokenEnv(agentID) + "=" + tok, "SQUID_PW=" + pw},
		}), tok
	}
	t.Run("wrong password", func(t *testing.T) {
		fb, tok := failing(t, squidEntry("corp", egressSquid, "SQUID_PW"), "wrong-"+password)
		c := n.agentClient(t, fb, tok, false)
		before := plainPeers.count() + tlsPeers.count()
		for _, u := range []string{"http://" + plainAddr + "/x", "https://" + tlsAddr + "/x"} {
			resp, body := getBody(t, c, u)
			e := decodeProxyError(body)
			if resp.StatusCode != http.StatusBadGateway || e.Error != "upstream_proxy_refused" || !strings.Contains(e.Reason, "407") ||
				!strings.Contains(e.Reason, "ERR_CACHE_ACCESS_DENIED") {
				t.Fatalf("%s: got %d %s", u, resp.StatusCode, body)
			}
			if strings.Contains(body, password) {
				t.Fatal("the proxy password reached the agent")
			}
		}
		// The opaque tunnel: the agent's CONNECT is refused with the proxy's reason.
		status, body := n.rawConnect(t, fb, tok, opaqueAddr)
		if e := decodeProxyError(body); status != http.StatusBadGateway || e.Error != "upstream_proxy_refused" || !strings.Contains(e.Reason, "407") {
			t.Fatalf("opaque tunnel: %d %s", status, body)
		}
		if plainPeers.count()+tlsPeers.count() != before {
			t.Fatal("a refused request reached the origin")
		}
	})
	t.Run("squid down: a clean 502", func(t *testing.T) {
		fb, tok := failing(t, squidEntry("dead", egressDead, "SQUID_PW"), password)
		c := n.agentClient(t, fb, tok, false)
		before := plainPeers.count() + tlsPeers.count()
		for _, u := range []string{"http://" + plainAddr + "/x", "https://" + tlsAddr + "/x"} {
			resp, body := getBody(t, c, u)
			e := decodeProxyError(body)
			if resp.StatusCode != http.StatusBadGateway || e.Error != "upstream_error" || strings.Contains(body, password) {
				t.Fatalf("%s: got %d %s", u, resp.StatusCode, body)
			}
		}
		if status, body := n.rawConnect(t, fb, tok, opaqueAddr); status != http.StatusBadGateway || decodeProxyError(body).Error != "upstream_error" {
			t.Fatalf("opaque tunnel: %d %s", status, body)
		}
		if plainPeers.count()+tlsPeers.count() != before {
			t.Fatal("with squid down, a request reached the origin")
		}
	})
}

// wsProbe opens a WebSocket through the broker (argv: proxy address, origin address,
// agent:token, the broker's CA), sends a text frame "ping" and prints the upgrade's status and
// what the origin echoed.
const wsProbe = `import base64, socket, ssl, sys
proxy, origin, cred, ca = sys.argv[1:5]
host, port = proxy.rsplit(":", 1)
s = socket.create_connection((host, int(port)), timeout=20)
auth = base64.b64encode(cred.encode()).decode()
s.sendall(f"CONNECT {origin} HTTP/1.1\r\nHost: {origin}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    c = s.recv(1)
    assert c, head
    head += c
assert head.startswith(b"HTTP/1.1 200"), head
ctx = ssl.create_default_context(cafile=ca)
t = ctx.wrap_socket(s, server_hostname=origin.rsplit(":", 1)[0])
t.sendall(f"GET /ws HTTP/1.1\r\nHost: {origin}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    c = t.recv(1)
    assert c, head
    head += c
status = head.split(b" ")[1].decode()
mask = b"\x01\x02\x03\x04"
t.sendall(b"\x81\x84" + mask + bytes(c ^ mask[i % 4] for i, c in enumerate(b"ping")))
echo = b""
while len(echo) < 6:
    chunk = t.recv(6 - len(echo))
    if not chunk:
        break
    echo += chunk
print(status, "echo=" + echo[2:].decode(errors="replace"))
t.close()
`

// rawConnect sends the agent's CONNECT for target to b and returns the answer's status and
// body.
func (n *egressNet) rawConnect(t *testing.T, b *brokerProc, token, target string) (int, string) {
	t.Helper()
	raw, err := nsDial(n.brokerNS)(t.Context(), "tcp", b.proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(waitTimeout))
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte(agentID+":"+token))
	fmt.Fprintf(raw, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: %s\r\n\r\n", target, target, auth)
	resp, err := http.ReadResponse(bufio.NewReader(raw), &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// grepLines returns the lines of s that contain substr.
func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestUpstreamProxyTransparentSquid is transparent mode behind squid: the agent's namespace
// routes through the broker's (the sandbox topology of transparent_test.go, its rules applied
// by the built binary), whose only way on is squid. A client with no proxy settings reaches
// the API by name, through the broker's resolver, the broker and squid.
func TestUpstreamProxyTransparentSquid(t *testing.T) {
	sn := newSandboxNet(t)
	requireNft(t)
	n := newEgressNet(t, sn.brokerNS)
	sn.gateway(t)
	password := "squid-pw-" + randHex(8)
	n.startSquid(t, "broker", password)
	pki := newUpstreamPKI(t)
	received := make(chan string, 4)
	_, apiPeers := n.origin(t, "443", pki, false, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		received <- r.Host + " " + r.URL.Path + " " + r.Header.Get("Authorization")
		fmt.Fprintf(w, "host=%s path=%s\n", r.Host, r.URL.Path)
	}))
	hostsFile(t, sn.brokerNS, egressOriginIP+" "+transparentAPI)
	sn.resolvConf(t, "nameserver "+brokerSideIP, "options attempts:1 timeout:3")
	canary := "sk-canary-" + randHex(12)
	token := randHex(16)
	b := startBroker(t, brokerOpts{
		netns:  sn.brokerNS,
		listen: transparentProxy,
		policy: transparentPolicy,
		mode:   "enforce",
		config: fmt.Sprintf(`upstream:
  ca_file: %q
  allow_private: ["%s/32"]
  proxy:
    proxies:
%s
agents:
  - {id: %s, token_env: %s, addresses: ["%s/32", "%s/128"]}
credentials:
  - name: canary
    hosts: [%q]
    source: {env: CANARY_SECRET}
    inject: {header: Authorization, value: "Bearer {{secret}}"}
transparent:
  listen: "[::]:%s"
  log_group: %d
  dns: {listen: %q}
`, pki.File, egressOriginIP, squidEntry("corp", egressSquid, "SQUID_PW"), agentID, tokenEnv(agentID), agentSideIP, agentSideIP6,
			transparentAPI, transparentPort, transparentLog, transparentDNS),
		env: []string{tokenEnv(agentID) + "=" + token, "CANARY_SECRET=" + canary, "SQUID_PW=" + password},
	})
	b.logs.wait(t, `"message":"resolver listening"`)
	sn.transparentRules(t, "--sandbox-iface", sn.vethB, "--sandbox-cidr", agentSideIP+"/32", "--sandbox-cidr", agentSideIP6+"/128",
		"--config", filepath.Join(b.dir, "broker.yaml"), "--apply")

	var env []string // the agent's: the broker's CA, nothing about a proxy
	for _, kv := range sn.agentEnv(t, b.proxyURL(agentID, token), b.caFile) {
		if !strings.Contains(strings.ToLower(kv), "_proxy=") {
			env = append(env, kv)
		}
	}
	for _, c := range []struct {
		name string
		argv []string
	}{
		{"curl", []string{"curl", "--noproxy", "*", "-4", "-sS", "--max-time", "20", "https://" + transparentAPI + "/api/curl"}},
		{"python", []string{"python3", "-c", `import sys, urllib.request
o = urllib.request.build_opener(urllib.request.ProxyHandler({}))
print(o.open(sys.argv[1], timeout=20).read().decode(), end="")`, "https://" + transparentAPI + "/api/python"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := sn.agent(t, env, c.argv...)
			want := fmt.Sprintf("host=%s path=/api/%s\n", transparentAPI, c.name)
			if err != nil || out != want {
				t.Fatalf("%v\n%q, want %q\nbroker log:\n%s", err, out, want, b.logs.String())
			}
			if got := <-received; got != transparentAPI+" /api/"+c.name+" Bearer "+canary {
				t.Fatalf("the upstream received %q", got)
			}
			b.waitAuditWhere(t, 1, "a transparent request via corp", func(ev auditEvent) bool {
				return ev["phase"] == "request" && ev["mode"] == "transparent" && ev["via"] == "corp" && ev["path"] == "/api/"+c.name
			})
		})
	}
	apiPeers.fromSquidOnly(t)
}
