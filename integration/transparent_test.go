//go:build linux

package integration

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/transparent"
)

// Transparent mode as a user deploys it, in the sandbox topology (netns_test.go) made a
// gateway (sandboxNet.gateway): the agent's default routes (IPv4 and IPv6) go through the
// broker's namespace, where the rules are the ones the built binary writes and applies
// (`broker transparent rules --sandbox-iface ... --config broker.yaml --apply`); the agent's
// resolv.conf names the broker's resolver (transparent.dns.listen) and nothing else gives it
// a name; refused packets are logged to transparent.log_group, which the broker reads. The
// agent's clients have no proxy settings.
const (
	transparentPort  = "15001"
	transparentProxy = brokerSideIP + ":8080" // fixed: the namespace is the test's own
	transparentDNS   = brokerSideIP + ":53"
	transparentLog   = 7
	transparentAPI   = "api.cb.test"    // allowed, with the canary credential
	transparentOther = "other.cb.test"  // allowed too, at another pool address
	transparentDeny  = "denied.cb.test" // off the allow-list
	// A name server the agent hard-codes, which nothing answers at: the rules send its
	// queries to the broker's resolver.
	outsideResolver = "10.250.1.53"
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

// resolveProbe prints, for each name, "NAME ADDR..." (its TCP addresses, sorted) or
// "NAME failed: ERROR", through the C library's resolver as most clients do.
const resolveProbe = `import socket, sys
for name in sys.argv[1:]:
    try:
        print(name, *sorted({a[4][0] for a in socket.getaddrinfo(name, 443, proto=socket.IPPROTO_TCP)}))
    except socket.gaierror as e:
        print(name, "failed:", e)
`

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

	// The broker resolves the names to its loopback; the agent only through the broker's
	// resolver.
	hostsFile(t, sn.brokerNS, "127.0.0.1 "+transparentAPI+" "+transparentOther+" "+transparentDeny)
	sn.resolvConf(t, "nameserver "+brokerSideIP, "options attempts:1 timeout:3")
	// The gateway, routing on to an outside namespace (the internet's stand-in, the name
	// pool routed to it), as a real gateway routes on to its uplink.
	outsideNS := gatewayNet(t, sn)

	b := startBroker(t, brokerOpts{
		netns:  sn.brokerNS,
		listen: transparentProxy,
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
  log_group: %d
  dns: {listen: %q}
`, pki.File, agentID, tokenEnv(agentID), agentSideIP, agentSideIP6, transparentAPI, transparentPort, transparentLog, transparentDNS),
		env: []string{tokenEnv(agentID) + "=" + token, "CANARY_SECRET=" + canary},
	})
	b.logs.wait(t, `"message":"resolver listening"`)
	// The rules, from the broker's own config, as the operator applies them.
	out := sn.transparentRules(t, "--sandbox-iface", sn.vethB, "--sandbox-cidr", agentSideIP+"/32", "--sandbox-cidr", agentSideIP6+"/128",
		"--config", filepath.Join(b.dir, "broker.yaml"), "--apply")
	if !strings.Contains(out, fmt.Sprintf("TCP to port %s, DNS to port 53, log group %d", transparentPort, transparentLog)) {
		t.Fatalf("--apply said:\n%s", out)
	}

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

	var pool []netip.Prefix
	for _, p := range config.DefaultDNSPool {
		pool = append(pool, netip.MustParsePrefix(p))
	}
	names := transparent.NewNames(pool) // the broker's table: the same hash gives the same addresses
	inPool := func(s string, v6 bool) bool {
		a, err := netip.ParseAddr(s)
		return err == nil && a.Is6() == v6 && names.InPool(a)
	}
	resolved := map[string][]string{} // name: its IPv4 and IPv6 pool addresses, as the agent got them
	v4 := func(name string) string { return resolved[name][0] }

	t.Run("the agent resolves names through the broker's resolver", func(t *testing.T) {
		if out, err := sn.agent(t, env, "cat", "/etc/hosts"); err != nil || strings.Contains(out, ".cb.test") {
			t.Fatalf("the agent's /etc/hosts names the test's hosts: %v\n%s", err, out)
		}
		out, err := sn.agent(t, env, "python3", "-c", resolveProbe, transparentAPI, transparentOther, transparentDeny)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(line)
			resolved[f[0]] = f[1:]
		}
		for _, name := range []string{transparentAPI, transparentOther} {
			a := resolved[name]
			if len(a) != 2 || !inPool(a[0], false) || !inPool(a[1], true) {
				t.Fatalf("%s resolved to %q, want a pool address of each family:\n%s", name, a, out)
			}
		}
		if v4(transparentAPI) == v4(transparentOther) {
			t.Fatalf("two names got one address:\n%s", out)
		}
		if a := resolved[transparentDeny]; len(a) == 0 || a[0] != "failed:" {
			t.Fatalf("the denied name resolved:\n%s", out)
		}
		b.waitAuditWhere(t, 1, "the denied name's refused lookup", func(ev auditEvent) bool {
			return ev["phase"] == "dns" && ev["host"] == transparentDeny && ev["decision"] == "deny" && ev["mode"] == "transparent" &&
				ev["agent"] == agentID && ev["reason"] == "not on the transparent test's allow-list"
		})
	})
	if t.Failed() {
		t.FailNow()
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
		// Over IPv4 or IPv6, as each client's address selection has it (glibc's puts the
		// IPv6 pool first, Go's the IPv4 one).
		b.waitAuditWhere(t, len(clients), "transparent request events", func(ev auditEvent) bool {
			return ev["phase"] == "request" && ev["mode"] == "transparent" && ev["decision"] == "allow" &&
				ev["agent"] == agentID && (ev["source_ip"] == agentSideIP || ev["source_ip"] == agentSideIP6)
		})
	})

	t.Run("IPv6", func(t *testing.T) {
		before := len(received())
		out, err := sn.agent(t, env, "curl", "-6", "--noproxy", "*", "-sS", "--max-time", "20", api+"/api/v6")
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

	t.Run("a hard-coded name server gets the broker's resolver's answers", func(t *testing.T) {
		isRefusal := func(ev auditEvent) bool {
			return ev["phase"] == "dns" && ev["host"] == transparentDeny && ev["decision"] == "deny" && ev["source_ip"] == agentSideIP
		}
		var refusals int
		for _, ev := range b.audit(t) {
			if isRefusal(ev) {
				refusals++
			}
		}
		for _, c := range []struct {
			name  string
			rcode float64
			addrs []string
		}{
			{transparentAPI, 0, []string{v4(transparentAPI)}},
			{transparentDeny, 5, nil},
		} {
			out, err := sn.agent(t, env, "python3", "-c", dnsQueryProbe, "ask", c.name, "A", outsideResolver)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			var r dnsReply
			if err := json.Unmarshal([]byte(out), &r); err != nil || !r.IDOK || r.Rcode != c.rcode || !slices.Equal(r.Addrs, c.addrs) {
				t.Fatalf("%s, asked of %s: %s", c.name, outsideResolver, out)
			}
		}
		b.waitAuditWhere(t, refusals+1, "the refusal of the query to "+outsideResolver, isRefusal)
	})

	t.Run("refused", func(t *testing.T) {
		before := len(received())
		// A denied name does not resolve: Node's fetch reports the failed lookup.
		out, err := sn.agent(t, env, "node", "-e", `fetch(process.argv[1]).then(r => console.log(r.status), e => console.log("error:", (e.cause || e).code))`, "https://"+transparentDeny+"/")
		if err != nil || !strings.HasPrefix(out, "error: E") || !strings.Contains(out, "NOTFOUND") && !strings.Contains(out, "AGAIN") {
			t.Errorf("denied host, node: %v\n%s", err, out)
		}
		// A client that has the denied name's address anyway (cached, hard-coded: the pool
		// address is the name's hash, the same on every broker) reports the broker's 403.
		denied, ok := names.Assign(transparentDeny, false)
		if !ok {
			t.Fatal("no pool address for the denied name")
		}
		out, err = sn.agent(t, env, "curl", "--noproxy", "*", "-sS", "--max-time", "20", "-w", " %{http_code}",
			"--resolve", transparentDeny+":443:"+denied.String(), "https://"+transparentDeny+"/")
		if err != nil || !strings.HasSuffix(out, " 403") || !strings.Contains(out, `"error":"denied"`) {
			t.Errorf("denied host: %v\n%s", err, out)
		}
		// A ClientHello for the API sent to another name's address: domain fronting.
		out, err = sn.agent(t, env, "curl", "--noproxy", "*", "-sS", "--max-time", "20",
			"--resolve", transparentAPI+":443:"+v4(transparentOther), api+"/api/fronted")
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
		out, err = sn.agent(t, env, "python3", "-c", probe, v4(transparentAPI))
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
				return ev["mode"] == "transparent" && ev["decision"] == "deny" && ev["phase"] == "connect" &&
					strings.Contains(r, w.reason) && ev["source_ip"] == agentSideIP
			})
		}
		if n := len(received()) - before; n != 0 {
			t.Fatalf("refused connections reached the upstream (%d requests)", n)
		}
	})

	t.Run("UDP (QUIC) is refused and audited once", func(t *testing.T) {
		// What an HTTP/3 client does first: datagrams to the name's address, port 443, on a
		// connected socket. The rules refuse them with an ICMP error (administratively
		// prohibited), which the socket reports at once: the client falls back to TCP.
		target := "udp:" + v4(transparentAPI) + ":443"
		// The outside answers at that address: what the datagrams would reach unrefused.
		ipCmd(t, "-n", outsideNS, "addr", "add", v4(transparentAPI)+"/32", "dev", "lo")
		outside := serveUDP(t, outsideNS, v4(transparentAPI)+":443", "")
		out, err := sn.agent(t, env, "python3", "-c", packetProbe, target)
		got := strings.TrimPrefix(strings.TrimSpace(out), target+" ")
		if err != nil || got != "EHOSTUNREACH" {
			t.Fatalf("UDP to %s: %v\n%s", target, err, out)
		}
		isUDP := func(ev auditEvent) bool {
			return ev["scheme"] == "udp" && ev["mode"] == "transparent" && ev["decision"] == "deny"
		}
		b.waitAuditWhere(t, 1, "the refused UDP flow", func(ev auditEvent) bool {
			return isUDP(ev) && ev["host"] == transparentAPI && ev["port"] == float64(443) && ev["agent"] == agentID &&
				ev["source_ip"] == agentSideIP && strings.Contains(fmt.Sprint(ev["reason"]), "UDP is not carried by the broker")
		})
		var n int
		for _, ev := range b.audit(t) {
			if isUDP(ev) {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%d UDP audit events for one flow of three datagrams, want 1", n)
		}
		if got := outside.got.Load(); got != 0 {
			t.Fatalf("the outside received %d datagrams", got)
		}
	})

	t.Run("nothing reaches the upstream but through the broker", func(t *testing.T) {
		before := len(received())
		// The upstream's own address and port, straight: the agent's own loopback; and the
		// broker's address: the rules redirect it to the broker, which refuses it.
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
