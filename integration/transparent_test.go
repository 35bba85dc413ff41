//go:build linux

package integration

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/transparent"
)

// Transparent mode in the sandbox topology (netns_test.go) turned into a gateway, as the
// design's rules make it (docs/transparent.md): the agent has default routes (IPv4 and IPv6)
// through the broker's namespace, whose nftables rules redirect every TCP connection from the
// agent to the transparent listener, leave the explicit proxy's port alone, and reject the
// rest. The agent's clients have no proxy settings; its names resolve (through the agent
// namespace's hosts file, standing in for the broker's resolver) to the pool addresses the
// broker's name table gives them.
const (
	brokerSideIP6    = "fd00:250::1"
	agentSideIP6     = "fd00:250::2"
	transparentPort  = "15001"
	transparentAPI   = "api.cb.test"    // allowed, with the canary credential
	transparentOther = "other.cb.test"  // allowed too, at another pool address
	transparentDeny  = "denied.cb.test" // off the allow-list
)

const transparentPolicy = `package broker

default decision := {"allow": false, "reason": "not on the transparent test's allow-list"}

decision := {"allow": true, "intercept": true} if {
	input.phase == "connect"
	input.request.host in {"api.cb.test", "other.cb.test"}
	input.request.port == 443
}

decision := {"allow": true, "credentials": ["canary"]} if {
	input.phase == "request"
	input.request.host == "api.cb.test"
	startswith(input.request.path, "/api/")
}
`

// requireNft skips (fails in CI) without nft.
func requireNft(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("nft is missing: scripts/install-test-tools.sh installs nftables")
		}
		t.Skip("skipped: nft (nftables) is missing")
	}
}

// gateway gives the agent default routes through the broker's namespace and IPv6 addresses on
// the link, turns forwarding on there, and writes the rules of the gateway form.
func (s *sandboxNet) gateway(t *testing.T, proxyPort string) {
	t.Helper()
	ipCmd(t, "-n", s.brokerNS, "-6", "addr", "add", brokerSideIP6+"/64", "dev", s.vethB, "nodad")
	ipCmd(t, "-n", s.agentNS, "-6", "addr", "add", agentSideIP6+"/64", "dev", s.vethA, "nodad")
	ipCmd(t, "-n", s.agentNS, "route", "add", "default", "via", brokerSideIP)
	ipCmd(t, "-n", s.agentNS, "-6", "route", "add", "default", "via", brokerSideIP6)
	for _, k := range []string{"net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"} {
		if out, err := exec.Command("ip", "netns", "exec", s.brokerNS, "sysctl", "-qw", k).CombinedOutput(); err != nil {
			t.Fatalf("sysctl %s: %v %s", k, err, out)
		}
	}
	rules := fmt.Sprintf(`table inet capbroker {
	chain prerouting {
		type nat hook prerouting priority dstnat;
		ip saddr %[1]s ip daddr %[3]s tcp dport %[5]s return
		ip6 saddr %[2]s ip6 daddr %[4]s tcp dport %[5]s return
		ip saddr %[1]s meta l4proto tcp redirect to :%[6]s
		ip6 saddr %[2]s meta l4proto tcp redirect to :%[6]s
	}
	chain forward {
		type filter hook forward priority filter;
		ip saddr %[1]s reject
		ip6 saddr %[2]s reject
	}
	chain input {
		type filter hook input priority filter;
		meta l4proto ipv6-icmp accept
		ip saddr %[1]s tcp dport { %[5]s, %[6]s } accept
		ip6 saddr %[2]s tcp dport { %[5]s, %[6]s } accept
		ip saddr %[1]s reject
		ip6 saddr %[2]s reject
	}
}
`, agentSideIP, agentSideIP6, brokerSideIP, brokerSideIP6, proxyPort, transparentPort)
	cmd := exec.Command("ip", "netns", "exec", s.brokerNS, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f: %v\n%s\n%s", err, out, rules)
	}
}

// hosts writes /etc/netns/<ns>/hosts, which `ip netns exec` puts over /etc/hosts there.
func hostsFile(t *testing.T, ns string, lines ...string) {
	t.Helper()
	dir := filepath.Join("/etc/netns", ns)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir); _ = os.Remove("/etc/netns") })
	body := "127.0.0.1 localhost\n::1 localhost\n" + strings.Join(lines, "\n") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// goClient is a client with no proxy at all (Proxy: nil), as many Go binaries are.
const goClient = `package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
)

func main() {
	pem, err := os.ReadFile(os.Args[2])
	if err != nil {
		panic(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	c := &http.Client{Transport: &http.Transport{Proxy: nil, TLSClientConfig: &tls.Config{RootCAs: roots}}}
	resp, err := c.Get(os.Args[1])
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	b, _ := io.ReadAll(resp.Body)
	fmt.Printf("%d %s", resp.StatusCode, b)
}
`

func TestTransparentGateway(t *testing.T) {
	sn := newSandboxNet(t)
	requireNft(t)
	for _, tool := range []string{"node", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing (scripts/install-test-tools.sh)", tool)
		}
	}
	canary := "sk-canary-" + randHex(12)
	token := randHex(16)

	// The upstream: one TLS server on the broker side's loopback, port 443, for every name.
	var mu sync.Mutex
	var seen []string // "host path auth" of every request the upstream received
	pki := newUpstreamPKI(t)
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Host+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "host=%s path=%s auth=%s\n", r.Host, r.URL.Path, r.Header.Get("Authorization"))
	})}
	ln := sn.listenInBroker(t, "127.0.0.1:443")
	up.TLSConfig = &tls.Config{Certificates: []tls.Certificate{pki.Server(t, time.Now().Add(time.Hour), transparentAPI, transparentOther, transparentDeny)}}
	go func() { _ = up.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = up.Close() })
	received := func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), seen...) }

	// Names: the broker resolves them to its loopback; the agent to their pool addresses.
	hostsFile(t, sn.brokerNS, "127.0.0.1 "+transparentAPI+" "+transparentOther+" "+transparentDeny)
	var pool []netip.Prefix
	for _, p := range config.DefaultDNSPool {
		pool = append(pool, netip.MustParsePrefix(p))
	}
	names := transparent.NewNames(pool)
	addr := func(name string, v6 bool) string {
		a, ok := names.Assign(name, v6)
		if !ok {
			t.Fatalf("no pool address for %s", name)
		}
		return a.String()
	}
	hostsFile(t, sn.agentNS,
		addr(transparentAPI, false)+" "+transparentAPI,
		addr(transparentOther, false)+" "+transparentOther,
		addr(transparentDeny, false)+" "+transparentDeny)

	b := startBroker(t, brokerOpts{
		netns:  sn.brokerNS,
		listen: brokerSideIP + ":0",
		policy: transparentPolicy,
		mode:   "enforce",
		config: fmt.Sprintf(`upstream:
  ca_file: %q
  allow_private: ["127.0.0.1/32"]
agents:
  - {id: %s, token_env: %s, addresses: ["%s/32", "%s/128"]}
credentials:
  - name: canary
    hosts: [%q]
    source: {env: CANARY_SECRET}
    inject: {header: Authorization, value: "Bearer {{secret}}"}
transparent:
  listen: "[::]:%s"
`, pki.File, agentID, tokenEnv(agentID), agentSideIP, agentSideIP6, transparentAPI, transparentPort),
		env: []string{tokenEnv(agentID) + "=" + token, "CANARY_SECRET=" + canary},
	})
	_, proxyPort, _ := net.SplitHostPort(b.proxyAddr)
	sn.gateway(t, proxyPort)

	// The agent's environment: the broker's CA and nothing about a proxy.
	explicit := sn.agentEnv(t, b.proxyURL(agentID, token), b.caFile)
	ca := filepath.Join(sn.agentDir, "broker-ca.crt")
	var env []string
	for _, kv := range explicit {
		if !strings.Contains(strings.ToLower(kv), "_proxy=") {
			env = append(env, kv)
		}
	}
	env = append(env, "NODE_EXTRA_CA_CERTS="+ca)
	goBin := filepath.Join(sn.agentDir, "goclient")
	src := filepath.Join(t.TempDir(), "main.go")
	if err := os.WriteFile(src, []byte(goClient), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(src), "go.mod"), []byte("module goclient\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-o", goBin, ".")
	build.Dir = filepath.Dir(src)
	build.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off", "CGO_ENABLED=0", "GOTOOLCHAIN=local")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the Go client: %v\n%s", err, out)
	}

	api := "https://" + transparentAPI
	want := func(path string) string {
		return fmt.Sprintf("host=%s path=%s auth=Bearer [REDACTED]\n", transparentAPI, path)
	}
	t.Run("clients without proxy settings reach the API through the broker", func(t *testing.T) {
		before := len(received())
		clients := []struct {
			name string
			argv []string
		}{
			{"curl", []string{"curl", "--noproxy", "*", "-sS", "--max-time", "20", "-w", "%{http_code} ", api + "/api/curl"}},
			{"node", []string{"node", "-e", `fetch(process.argv[1]).then(async r => process.stdout.write(r.status + " " + await r.text())).catch(e => { console.log("error:", e.cause || e); process.exit(1) })`, api + "/api/node"}},
			{"go", []string{goBin, api + "/api/go", ca}},
			{"python", []string{"python3", "-c", `import ssl, sys, urllib.request
o = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=sys.argv[2])))
with o.open(sys.argv[1], timeout=20) as r:
    print(r.status, r.read().decode(), end="")`, api + "/api/python", ca}},
		}
		for _, c := range clients {
			out, err := sn.agent(t, env, c.argv...)
			// curl prints the status after the body; the others before it.
			if got := strings.TrimSpace(out); err != nil || (got != "200 "+strings.TrimSpace(want("/api/"+c.name)) && !(c.name == "curl" && out == want("/api/curl")+"200 ")) {
				t.Errorf("%s: %v\n%q\nbroker log:\n%s", c.name, err, out, b.logs.String())
			}
		}
		got := received()[before:]
		if len(got) != len(clients) {
			t.Fatalf("the upstream received %d requests, want %d: %q", len(got), len(clients), got)
		}
		for _, g := range got {
			if !strings.HasSuffix(g, " Bearer "+canary) || !strings.HasPrefix(g, transparentAPI+" /api/") {
				t.Fatalf("the upstream received %q", g)
			}
		}
		b.waitAuditWhere(t, len(clients), "transparent request events", func(ev auditEvent) bool {
			return ev["phase"] == "request" && ev["mode"] == "transparent" && ev["decision"] == "allow" &&
				ev["agent"] == agentID && ev["source_ip"] == agentSideIP
		})
	})

	t.Run("IPv6", func(t *testing.T) {
		before := len(received())
		out, err := sn.agent(t, env, "curl", "-6", "--noproxy", "*", "-sS", "--max-time", "20",
			"--resolve", transparentAPI+":443:["+addr(transparentAPI, true)+"]", api+"/api/v6")
		if err != nil || out != want("/api/v6") {
			t.Fatalf("curl over IPv6: %v\n%s\nbroker log:\n%s", err, out, b.logs.String())
		}
		if got := received()[before:]; len(got) != 1 || got[0] != transparentAPI+" /api/v6 Bearer "+canary {
			t.Fatalf("the upstream received %q", got)
		}
		b.waitAuditWhere(t, 1, "an IPv6 transparent event", func(ev auditEvent) bool {
			return ev["phase"] == "request" && ev["mode"] == "transparent" && ev["source_ip"] == agentSideIP6
		})
	})

	t.Run("an explicit-proxy client works beside them", func(t *testing.T) {
		before := len(received())
		out, err := sn.agent(t, explicit, "curl", "-sS", "--max-time", "20", api+"/api/explicit")
		if err != nil || out != want("/api/explicit") {
			t.Fatalf("curl through HTTPS_PROXY: %v\n%s", err, out)
		}
		if n := len(received()) - before; n != 1 {
			t.Fatalf("the upstream received %d requests", n)
		}
		b.waitAuditWhere(t, 1, "an explicit request event", func(ev auditEvent) bool {
			return ev["phase"] == "request" && ev["mode"] == "explicit" && ev["path"] == "/api/explicit"
		})
	})

	t.Run("refused", func(t *testing.T) {
		before := len(received())
		// A host off the allow-list: the client reports the broker's 403.
		out, err := sn.agent(t, env, "curl", "--noproxy", "*", "-sS", "--max-time", "20", "-w", " %{http_code}", "https://"+transparentDeny+"/")
		if err != nil || !strings.HasSuffix(out, " 403") || !strings.Contains(out, `"error":"denied"`) {
			t.Errorf("denied host: %v\n%s", err, out)
		}
		out, err = sn.agent(t, env, "node", "-e", `fetch(process.argv[1]).then(async r => console.log(r.status, await r.text()))`, "https://"+transparentDeny+"/")
		if err != nil || !strings.HasPrefix(out, "403 ") {
			t.Errorf("denied host, node: %v\n%s", err, out)
		}
		// A ClientHello for the API sent to another name's address: domain fronting.
		out, err = sn.agent(t, env, "curl", "--noproxy", "*", "-sS", "--max-time", "20",
			"--resolve", transparentAPI+":443:"+addr(transparentOther, false), api+"/api/fronted")
		if err == nil {
			t.Errorf("a fronted connection was served:\n%s", out)
		}
		// A port outside transparent.ports, and a protocol other than TLS and HTTP on 443.
		probe := `import socket, sys
host = sys.argv[1]
for port, data in ((22, b""), (443, b"SSH-2.0-OpenSSH_9.6\r\n")):
    try:
        s = socket.create_connection((host, port), timeout=10)
        if data:
            s.sendall(data)
        print(port, "read", s.recv(100))
        s.close()
    except OSError as e:
        print(port, type(e).__name__)
`
		out, err = sn.agent(t, env, "python3", "-c", probe, addr(transparentAPI, false))
		// Port 22: reset (before or after the connect returned); 443: closed without a byte.
		if lines := strings.Split(strings.TrimSpace(out), "\n"); err != nil || len(lines) != 2 ||
			(lines[0] != "22 ConnectionResetError" && lines[0] != "22 ConnectionRefusedError") ||
			(lines[1] != "443 read b''" && lines[1] != "443 ConnectionResetError") {
			t.Errorf("raw TCP: %v\n%s", err, out)
		}
		for _, w := range []struct{ what, reason string }{
			{"denied host", "not on the transparent test's allow-list"},
			{"fronting", "domain fronting"},
			{"port", "port 22 is not served"},
			{"protocol", "not TLS or HTTP"},
		} {
			b.waitAuditWhere(t, 1, w.what, func(ev auditEvent) bool {
				r, _ := ev["reason"].(string)
				return ev["mode"] == "transparent" && ev["decision"] == "deny" && strings.Contains(r, w.reason) && ev["source_ip"] == agentSideIP
			})
		}
		if n := len(received()) - before; n != 0 {
			t.Fatalf("refused connections reached the upstream (%d requests)", n)
		}
	})

	t.Run("nothing reaches the upstream but through the broker", func(t *testing.T) {
		before := len(received())
		// The upstream's own address and port, straight: the rules redirect it to the broker,
		// which refuses a literal loopback (it resolves nothing to it for the agent).
		out, err := sn.agent(t, env, "curl", "--noproxy", "*", "-sS", "--max-time", "10", "-k", "https://127.0.0.1/api/direct")
		if err == nil && strings.Contains(out, "auth=") {
			t.Fatalf("a direct request reached the upstream:\n%s", out)
		}
		out, err = sn.agent(t, env, "curl", "--noproxy", "*", "-sS", "--max-time", "10", "-k", "https://"+brokerSideIP+"/api/direct")
		if err == nil && strings.Contains(out, "auth=") {
			t.Fatalf("a direct request reached the upstream:\n%s", out)
		}
		b.waitAuditWhere(t, 1, "the direct connection to the broker's address", func(ev auditEvent) bool {
			r, _ := ev["reason"].(string)
			return ev["mode"] == "transparent" && ev["decision"] == "deny" && ev["host"] == brokerSideIP && strings.Contains(r, "names no server")
		})
		if n := len(received()) - before; n != 0 {
			t.Fatalf("the upstream received %d requests that did not go through the broker", n)
		}
	})
	if text := strings.Join(b.auditLog.snapshot(), "\n") + b.logs.String(); strings.Contains(text, canary) {
		t.Fatal("the canary is in the broker's logs")
	}
}
