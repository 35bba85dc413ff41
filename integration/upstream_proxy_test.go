package integration

// The broker behind a corporate proxy (issue 35): a real squid, with Basic authentication and
// an ACL, in front of loopback upstreams on 127.0.0.2. Squid leaves from 127.0.0.3
// (tcp_outgoing_address), the broker from 127.0.0.1: every upstream connection's peer address
// shows which way it came, so a path that went direct is seen.

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
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
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	squidBin      = "/usr/sbin/squid"
	squidAuthBin  = "/usr/lib/squid/basic_ncsa_auth"
	squidOutgoing = "127.0.0.3"
	originIP      = "127.0.0.2"
)

// squidProc is a squid started by the test.
type squidProc struct {
	addr string
	cmd  *exec.Cmd
}

// startSquid runs squid on 127.0.0.3 with one user (user/password) and an ACL that lets
// through only destinations on originIP.
func startSquid(t *testing.T, user, password string) *squidProc {
	t.Helper()
	return startSquidWith(t, squidDir(t), user, password, func(addr string) string { return "http_port " + addr }, "")
}

// squidDir is a folder squid (running as its own user) can read and write.
func squidDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "squid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o777)
	return dir
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// startSquidWith runs squid with Basic auth (user/password) and the ACL of startSquid; port
// makes the listening line (http_port or https_port, with options) for the address squid gets,
// and extra is appended to the configuration.
func startSquidWith(t *testing.T, dir, user, password string, port func(addr string) string, extra string) *squidProc {
	t.Helper()
	for _, bin := range []string{squidBin, squidAuthBin} {
		if _, err := os.Stat(bin); err != nil {
			t.Skipf("squid not installed (%s): scripts/install-test-tools.sh installs it", bin)
		}
	}
	hash, err := exec.Command("openssl", "passwd", "-apr1", password).Output()
	if err != nil {
		t.Fatal(err)
	}
	htpasswd := writeFile(t, dir, "htpasswd", user+":"+strings.TrimSpace(string(hash))+"\n")
	l, err := net.Listen("tcp", squidOutgoing+":0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	conf := writeFile(t, dir, "squid.conf", fmt.Sprintf(`%s
pid_filename none
cache_log %s/cache.log
access_log none
cache deny all
coredump_dir %s
shutdown_lifetime 0 seconds
auth_param basic program %s %s
auth_param basic realm corp
acl authed proxy_auth REQUIRED
acl origins dst %s
http_access deny !authed
http_access allow origins
http_access deny all
tcp_outgoing_address %s
%s
`, port(addr), dir, dir, squidAuthBin, htpasswd, originIP, squidOutgoing, extra))
	cmd := exec.Command(squidBin, "-N", "-f", conf)
	cmd.Dir = dir
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &squidProc{addr: addr, cmd: cmd}
	t.Cleanup(s.stop)
	deadline := time.Now().Add(waitTimeout)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return s
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(dir, "cache.log"))
			t.Fatalf("squid did not listen on %s: %v\n%s\n%s", addr, err, logs.String(), b)
		}
		time.Sleep(50 * time.Millisecond) // polling a listener that appears, not synchronising
	}
}

// getBody GETs u with c and returns the response and its whole body.
func getBody(t *testing.T, c *http.Client, u string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

func (s *squidProc) stop() {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
}

// peers records the peer address of every connection an upstream accepts.
type peers struct {
	mu   sync.Mutex
	seen []string
}

func (p *peers) add(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
	p.seen = append(p.seen, host)
}

// onlyThroughSquid fails unless at least one connection came, all from squid.
func (p *peers) onlyThroughSquid(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.seen) == 0 {
		t.Fatal("the upstream saw no connection")
	}
	for _, h := range p.seen {
		if h != squidOutgoing {
			t.Fatalf("the upstream saw a connection from %s, not from squid (%s): it went direct", h, squidOutgoing)
		}
	}
}

// recordingListener is a listener on originIP whose accepted connections p records.
type recordingListener struct {
	net.Listener
	p *peers
}

func (l recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.p.add(c)
	}
	return c, err
}

// originServer serves h on originIP, with TLS from pki when it is not nil.
func originServer(t *testing.T, pki *upstreamPKI, h http.Handler) (string, *peers) {
	t.Helper()
	l, err := net.Listen("tcp", originIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	p := &peers{}
	srv := &http.Server{Handler: h}
	var rl net.Listener = recordingListener{l, p}
	if pki != nil {
		rl = tls.NewListener(rl, &tls.Config{Certificates: []tls.Certificate{pki.Server(t, time.Now().Add(time.Hour), originIP)}})
	}
	go srv.Serve(rl)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String(), p
}

const upstreamProxyPolicy = `package broker

import rego.v1

default decision := {"allow": true, "intercept": true}

decision := {"allow": true, "upstream_proxy": "direct"} if input.request.path == "/direct"

decision := {"allow": true, "upstream_proxy": "nope"} if input.request.path == "/nope"

decision := {"allow": true, "intercept": false} if {
	input.phase == "connect"
	input.request.port == data.opaque_port
}
`

func upstreamProxyConfig(caFile, proxies string) string {
	return fmt.Sprintf(`upstream:
  ca_file: %q
  allow_private: ["%s/32"]
  proxy:
    proxies:
%s
agents:
  - {id: %s, token_env: %s}
`, caFile, originIP, proxies, agentID, tokenEnv(agentID))
}

func squidEntry(name, addr, passwordEnv string) string {
	return fmt.Sprintf("      - {name: %s, url: \"http://%s\", username: broker, password: {env: %s}}", name, addr, passwordEnv)
}

func TestUpstreamProxySquid(t *testing.T) {
	password := "squid-pw-" + randHex(8)
	squid := startSquid(t, "broker", password)
	pki := newUpstreamPKI(t)
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s %s", r.Host, r.URL.Path)
	})
	plainAddr, plainPeers := originServer(t, nil, hello)
	tlsAddr, tlsPeers := originServer(t, pki, hello)
	opaqueAddr, opaquePeers := originServer(t, pki, hello)
	directAddr, directPeers := originServer(t, nil, hello)
	_, opaquePort, _ := net.SplitHostPort(opaqueAddr)

	token := randHex(16)
	// A dead proxy first: the broker goes on to squid.
	dead, err := net.Listen("tcp", squidOutgoing+":0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	b := startBroker(t, brokerOpts{
		policy: upstreamProxyPolicy,
		files:  map[string]string{"data.json": `{"opaque_port": ` + opaquePort + `}`},
		mode:   "enforce",
		config: upstreamProxyConfig(pki.File, squidEntry("dead", deadAddr, "SQUID_PW")+"\n"+squidEntry("corp", squid.addr, "SQUID_PW")),
		env:    []string{tokenEnv(agentID) + "=" + token, "SQUID_PW=" + password},
	})
	client := b.client(t, agentID, token)

	viaOf := func(t *testing.T, resp *http.Response) string {
		t.Helper()
		ev := b.waitAudit(t, resp.Header.Get("X-Broker-Request-Id"))
		v, _ := ev["via"].(string)
		return v
	}

	t.Run("plain HTTP", func(t *testing.T) {
		resp, body := getBody(t, client, "http://"+plainAddr+"/plain")
		if resp.StatusCode != 200 || !strings.Contains(body, "hello") {
			t.Fatalf("got %d %q", resp.StatusCode, body)
		}
		if v := viaOf(t, resp); v != "corp" {
			t.Fatalf("audit via = %q, want corp", v)
		}
		plainPeers.onlyThroughSquid(t)
	})
	t.Run("intercepted HTTPS", func(t *testing.T) {
		resp, body := getBody(t, client, "https://"+tlsAddr+"/tls")
		if resp.StatusCode != 200 || !strings.Contains(body, "hello") {
			t.Fatalf("got %d %q", resp.StatusCode, body)
		}
		if v := viaOf(t, resp); v != "corp" {
			t.Fatalf("audit via = %q, want corp", v)
		}
		tlsPeers.onlyThroughSquid(t)
	})
	t.Run("opaque tunnel", func(t *testing.T) {
		roots := x509.NewCertPool()
		pem, _ := os.ReadFile(pki.File)
		roots.AppendCertsFromPEM(pem)
		pu, _ := url.Parse(b.proxyURL(agentID, token))
		c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu), TLSClientConfig: &tls.Config{RootCAs: roots}}, Timeout: waitTimeout}
		resp, body := getBody(t, c, "https://"+opaqueAddr+"/opaque")
		if resp.StatusCode != 200 || !strings.Contains(body, "hello") {
			t.Fatalf("got %d %q", resp.StatusCode, body)
		}
		c.CloseIdleConnections() // the tunnel's event is written when it ends
		opaquePeers.onlyThroughSquid(t)
		evs := b.waitAuditWhere(t, 1, "the opaque tunnel's event", func(ev auditEvent) bool {
			return ev["phase"] == "connect" && ev["via"] != nil && strings.HasSuffix(fmt.Sprint(ev["host"]), "127.0.0.2") && fmt.Sprint(ev["port"]) == opaquePort
		})
		if evs[0]["via"] != "corp" {
			t.Fatalf("tunnel via = %v", evs[0]["via"])
		}
	})

	t.Run("WebSocket", func(t *testing.T) {
		wsAddr, wsPeers := originServer(t, pki, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			fmt.Fprintf(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
				wsAccept(r.Header.Get("Sec-WebSocket-Key")))
			buf := make([]byte, 4)
			if _, err := io.ReadFull(brw, buf); err == nil {
				conn.Write(buf)
			}
		}))
		raw, err := net.Dial("tcp", b.proxyAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		_ = raw.SetDeadline(time.Now().Add(waitTimeout))
		auth := "Basic " + base64.StdEncoding.EncodeToString([]byte(agentID+":"+token))
		fmt.Fprintf(raw, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: %s\r\n\r\n", wsAddr, wsAddr, auth)
		resp, err := http.ReadResponse(bufio.NewReader(raw), &http.Request{Method: http.MethodConnect})
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("CONNECT: %v %v", resp, err)
		}
		tc := tls.Client(raw, &tls.Config{RootCAs: b.caPool(t), ServerName: originIP, NextProtos: []string{"http/1.1"}})
		fmt.Fprintf(tc, "GET /ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", wsAddr)
		tbr := bufio.NewReader(tc)
		resp, err = http.ReadResponse(tbr, nil)
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("upgrade: %v %v", resp, err)
		}
		tc.Write([]byte("ping"))
		got := make([]byte, 4)
		if _, err := io.ReadFull(tbr, got); err != nil || string(got) != "ping" {
			t.Fatalf("echo: %q %v", got, err)
		}
		wsPeers.onlyThroughSquid(t)
	})

	t.Run("readyz reports a dead proxy", func(t *testing.T) {
		resp, err := http.Get("http://" + b.adminAddr + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&body)
		down, _ := body["upstream_proxies"].(map[string]any)
		if body["status"] != "degraded" || down["dead"] == nil || down["corp"] != nil {
			t.Fatalf("readyz: %v", body)
		}
	})

	t.Run("policy route", func(t *testing.T) {
		resp, body := getBody(t, client, "http://"+directAddr+"/direct")
		if resp.StatusCode != 200 || viaOf(t, resp) != "direct" {
			t.Fatalf("direct: %d %s", resp.StatusCode, body)
		}
		directPeers.mu.Lock()
		from := directPeers.seen
		directPeers.mu.Unlock()
		if len(from) != 1 || from[0] == squidOutgoing {
			t.Fatalf("the direct request came from %v", from)
		}
		resp, body = getBody(t, client, "http://"+plainAddr+"/nope")
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "not configured") {
			t.Fatalf("unknown proxy: %d %s", resp.StatusCode, body)
		}
	})

	t.Run("wrong password", func(t *testing.T) {
		token2 := randHex(16)
		b2 := startBroker(t, brokerOpts{
			policy: upstreamProxyPolicy,
			files:  map[string]string{"data.json": `{"opaque_port": 1}`},
			mode:   "enforce",
			config: upstreamProxyConfig(pki.File, squidEntry("corp", squid.addr, "SQUID_PW")),
			env:    []string{tokenEnv(agentID) + "=" + token2, "SQUID_PW=wrong-" + password},
		})
		c := b2.client(t, agentID, token2)
		for _, u := range []string{"http://" + plainAddr + "/x", "https://" + tlsAddr + "/x"} {
			resp, body := getBody(t, c, u)
			var e struct{ Error, Reason string }
			_ = json.Unmarshal([]byte(body), &e)
			if resp.StatusCode != http.StatusBadGateway || e.Error != "upstream_proxy_refused" || !strings.Contains(e.Reason, "407") {
				t.Fatalf("%s: got %d %s", u, resp.StatusCode, body)
			}
			if strings.Contains(body, password) {
				t.Fatal("the proxy password reached the agent")
			}
		}
	})

	t.Run("every proxy down", func(t *testing.T) {
		token3 := randHex(16)
		b3 := startBroker(t, brokerOpts{
			policy: upstreamProxyPolicy,
			files:  map[string]string{"data.json": `{"opaque_port": 1}`},
			mode:   "enforce",
			config: upstreamProxyConfig(pki.File, squidEntry("dead", deadAddr, "SQUID_PW")),
			env:    []string{tokenEnv(agentID) + "=" + token3, "SQUID_PW=" + password},
		})
		before := len(plainPeers.seen)
		resp, body := getBody(t, b3.client(t, agentID, token3), "http://"+plainAddr+"/down")
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("got %d %s", resp.StatusCode, body)
		}
		plainPeers.mu.Lock()
		after := len(plainPeers.seen)
		plainPeers.mu.Unlock()
		if after != before {
			t.Fatal("with every proxy down, the request went direct")
		}
	})
}
