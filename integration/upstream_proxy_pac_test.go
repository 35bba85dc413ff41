package integration

// A PAC file choosing the way out per destination (issue 35), behind a real squid: squid for
// one host, DIRECT for another, an unconfigured proxy to the operator's fallback, and
// "PROXY dead; PROXY squid" failing over to squid.

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// pacDirectIP is a loopback address squid's ACL does not let through: only a direct
// connection reaches an origin there.
const pacDirectIP = "127.0.0.4"

func pacOrigin(t *testing.T, h http.Handler) (string, *peers) {
	t.Helper()
	l, err := net.Listen("tcp", pacDirectIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	p := &peers{}
	srv := &http.Server{Handler: h}
	go srv.Serve(recordingListener{l, p})
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String(), p
}

func pacConfig(caFile, pacFile, fallback, proxies string) string {
	return fmt.Sprintf(`upstream:
  ca_file: %q
  allow_private: ["%s/32", "%s/32"]
  proxy:
    pac: %q
    pac_fallback: %s
    proxies:
%s
agents:
  - {id: %s, token_env: %s}
`, caFile, originIP, pacDirectIP, pacFile, fallback, proxies, agentID, tokenEnv(agentID))
}

func TestUpstreamProxyPACSquid(t *testing.T) {
	password := "squid-pw-" + randHex(8)
	squid := startSquid(t, "broker", password)
	pki := newUpstreamPKI(t)
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s %s", r.Host, r.URL.Path)
	})
	squidAddr, squidPeers := originServer(t, pki, hello)
	unconfAddr, unconfPeers := originServer(t, nil, hello)
	failAddr, failPeers := originServer(t, pki, hello)
	directAddr, directPeers := pacOrigin(t, hello)
	dead, err := net.Listen("tcp", squidOutgoing+":0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()

	port := func(a string) string { _, p, _ := net.SplitHostPort(a); return p }
	pac := fmt.Sprintf(`function FindProxyForURL(url, host) {
  if (host == %q) return "DIRECT";
  if (url == "https://%s:%s/") return "PROXY %s";
  if (url == "http://%s:%s/") return "PROXY 127.0.0.9:3128";
  if (url == "https://%s:%s/") return "PROXY %s; PROXY %s";
  throw new Error("not in the test's PAC file");
}`, pacDirectIP, originIP, port(squidAddr), squid.addr, originIP, port(unconfAddr),
		originIP, port(failAddr), deadAddr, squid.addr)
	pacFile := filepath.Join(t.TempDir(), "proxy.pac")
	if err := os.WriteFile(pacFile, []byte(pac), 0o644); err != nil {
		t.Fatal(err)
	}
	token := randHex(16)
	b := startBroker(t, brokerOpts{
		policy: upstreamProxyPolicy,
		files:  map[string]string{"data.json": `{"opaque_port": 1}`},
		mode:   "enforce",
		config: pacConfig(pki.File, pacFile, "corp", squidEntry("corp", squid.addr, "SQUID_PW")+"\n"+squidEntry("dead", deadAddr, "SQUID_PW")),
		env:    []string{tokenEnv(agentID) + "=" + token, "SQUID_PW=" + password},
	})
	client := b.client(t, agentID, token)
	check := func(t *testing.T, c *http.Client, u, via string) {
		t.Helper()
		resp, body := getBody(t, c, u)
		if resp.StatusCode != 200 || !strings.Contains(body, "hello") {
			t.Fatalf("%s: got %d %q", u, resp.StatusCode, body)
		}
		ev := b.waitAudit(t, resp.Header.Get("X-Broker-Request-Id"))
		if ev["via"] != via {
			t.Fatalf("%s: audit via = %v, want %s", u, ev["via"], via)
		}
	}

	t.Run("PROXY squid", func(t *testing.T) {
		check(t, client, "https://"+squidAddr+"/a", "corp")
		squidPeers.onlyThroughSquid(t)
	})
	t.Run("DIRECT", func(t *testing.T) {
		check(t, client, "http://"+directAddr+"/b", "direct")
		directPeers.mu.Lock()
		defer directPeers.mu.Unlock()
		if len(directPeers.seen) != 1 || directPeers.seen[0] == squidOutgoing {
			t.Fatalf("the direct origin saw %v", directPeers.seen)
		}
	})
	t.Run("unconfigured proxy to the fallback", func(t *testing.T) {
		check(t, client, "http://"+unconfAddr+"/c", "corp")
		unconfPeers.onlyThroughSquid(t)
	})
	t.Run("PROXY dead; PROXY squid", func(t *testing.T) {
		check(t, client, "https://"+failAddr+"/d", "corp")
		failPeers.onlyThroughSquid(t)
	})
	t.Run("policy route first", func(t *testing.T) {
		// The policy sends /direct around every proxy, whatever the PAC file says.
		check(t, client, "http://"+directAddr+"/direct", "direct")
	})

	t.Run("reload", func(t *testing.T) {
		// A PAC file that does not compile is refused on reload; the running one stays.
		if err := os.WriteFile(pacFile, []byte("function FindProxyForURL("), 0o644); err != nil {
			t.Fatal(err)
		}
		mark := b.logs.mark()
		if err := b.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		b.logs.waitFrom(t, mark, "upstream.proxy.pac: pac: compile")
		check(t, client, "https://"+squidAddr+"/still", "corp")
		// A new PAC file takes effect on reload, with an empty cache.
		next := strings.Replace(pac, `return "PROXY `+squid.addr+`";`, `return "DIRECT";`, 1)
		if err := os.WriteFile(pacFile, []byte(next), 0o644); err != nil {
			t.Fatal(err)
		}
		mark = b.logs.mark()
		if err := b.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		b.logs.waitFrom(t, mark, `"message":"config reloaded"`)
		check(t, client, "https://"+squidAddr+"/reloaded", "direct")
		if err := os.WriteFile(pacFile, []byte(pac), 0o644); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("fallback refuse", func(t *testing.T) {
		token2 := randHex(16)
		b2 := startBroker(t, brokerOpts{
			policy: upstreamProxyPolicy,
			files:  map[string]string{"data.json": `{"opaque_port": 1}`},
			mode:   "enforce",
			config: pacConfig(pki.File, pacFile, "refuse", squidEntry("corp", squid.addr, "SQUID_PW")),
			env:    []string{tokenEnv(agentID) + "=" + token2, "SQUID_PW=" + password},
		})
		before := len(unconfPeers.seen)
		resp, body := getBody(t, b2.client(t, agentID, token2), "http://"+unconfAddr+"/refused")
		var e struct{ Error, Reason string }
		_ = json.Unmarshal([]byte(body), &e)
		if resp.StatusCode != http.StatusBadGateway || e.Error != "upstream_error" || !strings.Contains(e.Reason, "PAC file") {
			t.Fatalf("got %d %s", resp.StatusCode, body)
		}
		ev := b2.waitAudit(t, resp.Header.Get("X-Broker-Request-Id"))
		if !strings.Contains(fmt.Sprint(ev["error"]), "not configured") {
			t.Fatalf("the audit event does not say why: %v", ev)
		}
		unconfPeers.mu.Lock()
		defer unconfPeers.mu.Unlock()
		if len(unconfPeers.seen) != before {
			t.Fatal("a refused connection reached the origin")
		}
	})

	t.Run("https PAC file fetched through squid", func(t *testing.T) {
		pacURL, pacPeers := originServer(t, pki, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/x-ns-proxy-autoconfig")
			io.WriteString(w, pac)
		}))
		token3 := randHex(16)
		b3 := startBroker(t, brokerOpts{
			policy: upstreamProxyPolicy,
			files:  map[string]string{"data.json": `{"opaque_port": 1}`},
			mode:   "enforce",
			config: pacConfig(pki.File, "https://"+pacURL+"/proxy.pac", "refuse", squidEntry("corp", squid.addr, "SQUID_PW")),
			env:    []string{tokenEnv(agentID) + "=" + token3, "SQUID_PW=" + password},
		})
		pacPeers.onlyThroughSquid(t)
		c := b3.client(t, agentID, token3)
		resp, body := getBody(t, c, "http://"+directAddr+"/from-https-pac")
		if resp.StatusCode != 200 {
			t.Fatalf("got %d %s", resp.StatusCode, body)
		}
		if ev := b3.waitAudit(t, resp.Header.Get("X-Broker-Request-Id")); ev["via"] != "direct" {
			t.Fatalf("via = %v", ev["via"])
		}
	})
}
