//go:build linux

package integration

import (
	"context"
	"crypto/tls"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"golang.org/x/sys/unix"

	"github.com/capbroker/capbroker/credentials/vaulttest"
)

// The sandbox topology of docker-compose.yml, without Docker: two network namespaces joined
// by one veth pair, and nothing else.
//
//	agent namespace                         broker namespace
//	 curl, python3 (user nobody,             broker (proxy.listen on 10.250.0.1)
//	 own PID namespace, empty    veth /30    TLS upstream on 127.0.0.1 only
//	 resolv.conf, no default   <---------->  (upstream.allow_private: 127.0.0.1/32)
//	 route)        10.250.0.2    10.250.0.1
//
// The broker's side is a namespace of its own, as the broker container is in compose: had it
// been the test machine's own namespace, the agent could reach every service listening on
// the machine's wildcard address through the veth, and the broker would not be the only way out.
// Both namespaces are new and private to one test, so the addresses never collide with the
// machine's, and no packet can reach any network outside them.
const (
	brokerSideIP = "10.250.0.1"
	agentSideIP  = "10.250.0.2"
	agentUID     = "65534" // nobody
)

// agentPath is the agent's PATH: system folders only (no home-directory shims).
const agentPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

type sandboxNet struct {
	brokerNS, agentNS string
	agentDir          string // the agent's home: the only folder it writes to
	vethB, vethA      string // the link's ends, in the broker's and the agent's namespace
}

// requireNetns skips the test where network namespaces cannot be made: not root, or no
// iproute2. In CI (CI set), which runs as root, a missing tool fails the test instead.
func requireNetns(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root to create network namespaces (ip netns add); CI runs it as root")
	}
	for _, tool := range []string{"ip", "unshare", "setpriv", "curl", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is missing: the sandbox topology test cannot run (iproute2, util-linux, curl, python3)", tool)
			}
			t.Skipf("skipped: %s is missing (iproute2, util-linux, curl and python3 are needed)", tool)
		}
	}
}

// newSandboxNet makes the two namespaces and the link between them, and removes them when
// the test ends.
func newSandboxNet(t *testing.T) *sandboxNet {
	t.Helper()
	return newSandboxNetNamed(t, "cbtest")
}

// newSandboxNetNamed is newSandboxNet with the names of the namespaces, the link's ends and
// the agent's home starting with prefix (a test file's own, so that its leftovers are told
// apart).
func newSandboxNetNamed(t *testing.T, prefix string) *sandboxNet {
	t.Helper()
	requireNetns(t)
	id := randHex(4)
	s := &sandboxNet{brokerNS: prefix + "-" + id + "-b", agentNS: prefix + "-" + id + "-a"}
	resolvDir := filepath.Join("/etc/netns", s.agentNS)
	t.Cleanup(func() {
		for _, ns := range []string{s.agentNS, s.brokerNS} {
			// Deleting a namespace destroys its end of the veth pair, and so the pair.
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil && !strings.Contains(string(out), "No such file") {
				t.Errorf("ip netns del %s: %v %s", ns, err, out)
			}
		}
		_ = os.RemoveAll(resolvDir)
		_ = os.Remove("/etc/netns") // only if empty: another user's namespaces keep it
	})
	vethB, vethA := "cb"+id+"b", "cb"+id+"a" // at most 15 bytes: an interface name's limit
	s.vethB, s.vethA = vethB, vethA
	ipCmd(t, "netns", "add", s.brokerNS)
	ipCmd(t, "netns", "add", s.agentNS)
	ipCmd(t, "link", "add", vethB, "type", "veth", "peer", "name", vethA)
	ipCmd(t, "link", "set", vethB, "netns", s.brokerNS)
	ipCmd(t, "link", "set", vethA, "netns", s.agentNS)
	ipCmd(t, "-n", s.brokerNS, "addr", "add", brokerSideIP+"/30", "dev", vethB)
	ipCmd(t, "-n", s.agentNS, "addr", "add", agentSideIP+"/30", "dev", vethA)
	for ns, dev := range map[string]string{s.brokerNS: vethB, s.agentNS: vethA} {
		ipCmd(t, "-n", ns, "link", "set", "lo", "up")
		ipCmd(t, "-n", ns, "link", "set", dev, "up")
	}
	// `ip netns exec` bind-mounts /etc/netns/NAME/resolv.conf over /etc/resolv.conf: the
	// agent gets an empty one, so no name server.
	if err := os.MkdirAll(resolvDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(resolvDir, "resolv.conf"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", prefix+"-agent-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	s.agentDir = dir
	return s
}

// The gateway's IPv6 addresses on the link (sandboxNet.gateway).
const (
	brokerSideIP6 = "fd00:250::1"
	agentSideIP6  = "fd00:250::2"
)

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

// gateway makes the broker's namespace the agent's router, as transparent mode's gateway form
// has it (docs/transparent.md): IPv6 addresses on the link, the agent's default routes (IPv4
// and IPv6) through the broker's side, forwarding on there. The rules are the caller's.
func (s *sandboxNet) gateway(t *testing.T) {
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
}

// transparentRules runs the built `broker transparent rules` with args in the broker's
// namespace, as an operator would on the gateway, and returns what it printed.
func (s *sandboxNet) transparentRules(t *testing.T, args ...string) string {
	t.Helper()
	argv := append([]string{"netns", "exec", s.brokerNS, brokerBin, "transparent", "rules"}, args...)
	out, err := exec.Command("ip", argv...).CombinedOutput()
	if err != nil {
		t.Fatalf("broker transparent rules %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// resolvConf replaces the agent's resolv.conf (empty: no name server) with lines.
func (s *sandboxNet) resolvConf(t *testing.T, lines ...string) {
	t.Helper()
	conf := filepath.Join("/etc/netns", s.agentNS, "resolv.conf")
	if err := os.WriteFile(conf, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func ipCmd(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// listenInBroker opens a TCP listener inside the broker's namespace: the socket is created on
// an OS thread switched into that namespace, and keeps it after the thread is gone.
func (s *sandboxNet) listenInBroker(t *testing.T, addr string) net.Listener {
	t.Helper()
	var (
		ln  net.Listener
		err error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The thread stays locked: when this goroutine returns, the runtime ends the thread
		// instead of reusing it in the wrong namespace.
		runtime.LockOSThread()
		f, openErr := os.Open(filepath.Join("/run/netns", s.brokerNS))
		if openErr != nil {
			err = openErr
			return
		}
		defer f.Close()
		if err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			return
		}
		ln, err = net.Listen("tcp", addr)
	}()
	<-done
	if err != nil {
		t.Fatalf("listening in %s: %v", s.brokerNS, err)
	}
	return ln
}

// agent runs argv as the agent: in the agent namespace, in a PID namespace of its own (it
// sees only its own processes), as user nobody, with env as its whole environment.
func (s *sandboxNet) agent(t *testing.T, env []string, argv ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args := []string{"netns", "exec", s.agentNS,
		"unshare", "--pid", "--fork", "--mount-proc",
		"setpriv", "--reuid", agentUID, "--regid", agentUID, "--clear-groups",
		"env", "-i"}
	args = append(append(args, env...), argv...)
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Env = []string{"PATH=" + agentPath}
	cmd.Dir = s.agentDir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// agentEnv is everything the agent is given: where the broker is, its proxy token (which
// names the agent and is worth nothing elsewhere), and the broker's CA.
func (s *sandboxNet) agentEnv(t *testing.T, proxyURL, brokerCA string) []string {
	t.Helper()
	b, err := os.ReadFile(brokerCA)
	if err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(s.agentDir, "broker-ca.crt")
	if err := os.WriteFile(ca, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{
		"PATH=" + agentPath, "HOME=" + s.agentDir, "LANG=C.UTF-8",
		"HTTPS_PROXY=" + proxyURL, "https_proxy=" + proxyURL, "HTTP_PROXY=" + proxyURL, "http_proxy=" + proxyURL,
		"SSL_CERT_FILE=" + ca, "CURL_CA_BUNDLE=" + ca, "REQUESTS_CA_BUNDLE=" + ca,
	}
}

// netnsPolicy: tunnels to 127.0.0.1 only; GET under /api/ with the canary credential; a
// reason everywhere else.
const netnsPolicy = `package broker

default decision := {"allow": false, "reason": "not on the sandbox test's allow-list"}

decision := {"allow": true, "intercept": true} if {
	input.phase == "connect"
	input.request.host == "127.0.0.1"
}

decision := {"allow": true, "credentials": ["canary"]} if {
	input.phase == "request"
	input.request.method == "GET"
	startswith(input.request.path, "/api/")
}

decision := {"allow": false, "reason": "the /admin area is off limits"} if {
	input.phase == "request"
	startswith(input.request.path, "/admin")
}
`

// connectProbe tries a TCP connection to each host:port argument and prints how it ended:
// "connected", or the errno name (ECONNREFUSED: the address answered, nothing listens;
// ENETUNREACH: no route, no packet was sent).
const connectProbe = `import errno, socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect((host, int(port)))
        print(target, "connected")
    except socket.timeout:
        print(target, "timeout")
    except OSError as e:
        print(target, errno.errorcode.get(e.errno, str(e)))
    finally:
        s.close()
`

// dnsProbe asks the resolver for a name and tries UDP port 53 where a name server could be.
const dnsProbe = `import errno, socket, sys
for name in sys.argv[1:-2]:
    try:
        print("resolve", name, sorted({a[4][0] for a in socket.getaddrinfo(name, 443)}))
    except socket.gaierror as e:
        print("resolve", name, "failed:", e)
for host in sys.argv[-2:]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    try:
        s.connect((host, 53))
        s.send(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x05exfil\x04test\x00\x00\x01\x00\x01")
        s.recv(512)
        print("udp53", host, "answered")
    except socket.timeout:
        print("udp53", host, "timeout")
    except OSError as e:
        print("udp53", host, errno.errorcode.get(e.errno, str(e)))
    finally:
        s.close()
`

// TestNetnsBrokerIsTheOnlyWayOut builds the sandbox topology and proves, from inside the
// agent's namespace: direct connections fail; proxied requests work with the credential
// injected; the agent's environment and files hold no secret; there is no resolver and no
// path for DNS.
func TestNetnsBrokerIsTheOnlyWayOut(t *testing.T) {
	sn := newSandboxNet(t)
	canary := "sk-canary-" + randHex(12)
	token := randHex(16)

	var mu sync.Mutex
	var seen []string // Authorization headers the upstream received
	pki := newUpstreamPKI(t)
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "path=%s auth=%s\n", r.URL.Path, r.Header.Get("Authorization"))
	}))
	up.Listener.Close()
	up.Listener = sn.listenInBroker(t, "127.0.0.1:0")
	up.TLS = &tls.Config{Certificates: []tls.Certificate{pki.Leaf}}
	up.StartTLS()
	t.Cleanup(up.Close)
	upPort := up.Listener.Addr().(*net.TCPAddr).Port
	received := func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), seen...) }

	b := startBroker(t, brokerOpts{
		netns:  sn.brokerNS,
		listen: brokerSideIP + ":0",
		policy: netnsPolicy,
		mode:   "enforce",
		config: canaryConfig(pki.File, []string{agentID}, ""),
		env:    []string{tokenEnv(agentID) + "=" + token, "CANARY_SECRET=" + canary},
	})
	brokerHost, brokerPort, _ := net.SplitHostPort(b.proxyAddr)
	_, adminPort, _ := net.SplitHostPort(b.adminAddr)
	if brokerHost != brokerSideIP {
		t.Fatalf("the broker listens on %s, want %s", b.proxyAddr, brokerSideIP)
	}
	env := sn.agentEnv(t, b.proxyURL(agentID, token), b.caFile)
	target := fmt.Sprintf("https://127.0.0.1:%d", upPort) // the upstream, as the broker sees it

	t.Run("the agent namespace has one link and no default route", func(t *testing.T) {
		links := ipCmd(t, "-n", sn.agentNS, "-o", "link", "show")
		if n := strings.Count(strings.TrimSpace(links), "\n") + 1; n != 2 || !strings.Contains(links, ": lo:") {
			t.Fatalf("the agent namespace should have lo and one veth, has:\n%s", links)
		}
		for _, family := range []string{"-4", "-6"} {
			routes := ipCmd(t, "-n", sn.agentNS, family, "route", "show", "table", "all")
			if strings.Contains(routes, "default") {
				t.Fatalf("the agent namespace has a default route (%s):\n%s", family, routes)
			}
		}
		v4 := strings.TrimSpace(ipCmd(t, "-n", sn.agentNS, "-4", "route", "show"))
		if !regexp.MustCompile(`^10\.250\.0\.0/30 dev cb[0-9a-f]+a proto kernel scope link src 10\.250\.0\.2\s*$`).MatchString(v4) {
			t.Fatalf("the agent's IPv4 routes should be the /30 link alone:\n%s", v4)
		}
	})

	t.Run("direct connections from the agent fail", func(t *testing.T) {
		before := len(received())
		probes := []struct{ addr, want string }{
			{brokerSideIP + ":" + brokerPort, "connected"},               // the broker: the one open door
			{fmt.Sprintf("127.0.0.1:%d", upPort), "ECONNREFUSED"},        // the upstream's address: the agent's own loopback
			{fmt.Sprintf("%s:%d", brokerSideIP, upPort), "ECONNREFUSED"}, // the upstream's port on the broker's side: loopback only
			{brokerSideIP + ":" + adminPort, "ECONNREFUSED"},             // the broker's admin port: loopback only
			{fmt.Sprintf("10.250.0.5:%d", upPort), "ENETUNREACH"},        // any other address: no route
			{"10.250.1.1:443", "ENETUNREACH"},
		}
		// The broker, the upstream and the admin listener each took port 0 of their own
		// address, and the kernel may give two of them the same number: a probe of the
		// broker's side at the broker's own port is its open door again, and left out.
		door := probes[0]
		probes = slices.DeleteFunc(probes[1:], func(p struct{ addr, want string }) bool { return p.addr == door.addr })
		probes = slices.Insert(probes, 0, door)
		args := []string{"python3", "-c", connectProbe}
		var want []string
		for _, p := range probes {
			args = append(args, p.addr)
			want = append(want, p.addr+" "+p.want)
		}
		out, err := sn.agent(t, env, args...)
		if err != nil {
			t.Fatalf("probe: %v\n%s", err, out)
		}
		if got := strings.Split(strings.TrimSpace(out), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("connections from the agent:\n%s\nwant:\n%s", out, strings.Join(want, "\n"))
		}
		// curl straight to the upstream, bypassing the proxy settings.
		if out, err := sn.agent(t, env, "curl", "--noproxy", "*", "-sS", "--max-time", "5", target+"/api/direct"); err == nil {
			t.Fatalf("a direct request reached the upstream:\n%s", out)
		}
		if n := len(received()); n != before {
			t.Fatalf("the upstream received %d requests that did not go through the broker", n-before)
		}
	})

	t.Run("proxied requests work with the credential injected", func(t *testing.T) {
		before := len(received())
		out, err := sn.agent(t, env, "curl", "-sS", "--max-time", "20", "-o", filepath.Join(sn.agentDir, "curl-response.txt"),
			"-w", "%{http_code}", target+"/api/echo")
		if err != nil || out != "200" {
			t.Fatalf("curl through the broker: %v\n%s", err, out)
		}
		body, _ := os.ReadFile(filepath.Join(sn.agentDir, "curl-response.txt"))
		if string(body) != "path=/api/echo auth=Bearer [REDACTED]\n" {
			t.Fatalf("the agent got %q", body)
		}
		out, err = sn.agent(t, env, "python3", "-c", `import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=20) as r:
    body = r.read().decode()
open(sys.argv[2], "w").write(body)
print(r.status, body, end="")`, target+"/api/python", filepath.Join(sn.agentDir, "python-response.txt"))
		if err != nil || out != "200 path=/api/python auth=Bearer [REDACTED]\n" {
			t.Fatalf("python3 urllib through the broker: %v\n%s", err, out)
		}
		got := received()[before:]
		if len(got) != 2 || got[0] != "Bearer "+canary || got[1] != "Bearer "+canary {
			t.Fatalf("the upstream should have received the credential twice, got %d requests", len(got))
		}

		// Denied: a path the policy refuses, and a host it does not allow (refused at CONNECT,
		// before any name is resolved).
		out, err = sn.agent(t, env, "curl", "-sS", "--max-time", "20", target+"/admin/users")
		if err != nil || !strings.Contains(out, `"error":"denied"`) || !strings.Contains(out, `"reason":"the /admin area is off limits"`) {
			t.Fatalf("denied request: %v\n%s", err, out)
		}
		out, err = sn.agent(t, env, "curl", "-sS", "--max-time", "20", "https://exfil.invalid/")
		if err == nil || !strings.Contains(out, "403") {
			t.Fatalf("a CONNECT to a host off the allow-list should be refused with 403: %v\n%s", err, out)
		}
		if n := len(received()) - before; n != 2 {
			t.Fatalf("denied requests reached the upstream (%d requests in all)", n)
		}
		isAllowed := func(ev auditEvent) bool {
			return ev["agent"] == agentID && ev["phase"] == "request" && ev["decision"] == "allow" && ev["source_ip"] == agentSideIP
		}
		b.waitAuditWhere(t, 2, "allowed request events from "+agentSideIP, isAllowed)
		var allowed int
		for _, ev := range b.audit(t) {
			if isAllowed(ev) {
				allowed++
			}
		}
		if allowed != 2 {
			t.Fatalf("want 2 allowed request events from %s in the audit log, got %d", agentSideIP, allowed)
		}
	})

	t.Run("the agent's environment and files hold no secret", func(t *testing.T) {
		out, err := sn.agent(t, env, "sh", "-c", `env
echo "--- processes the agent can see:"
for p in /proc/[0-9]*; do printf '%s %s\n' "${p#/proc/}" "$(cat "$p/comm" 2>/dev/null)"; done
echo "--- their environments and command lines:"
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\0' '\n' <"$f" 2>/dev/null; done
echo "--- files under HOME holding a canary-like value:"
grep -rlF sk-canary- "$HOME"; echo "grep exit $?"`)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if strings.Contains(out, canary) {
			t.Fatalf("the canary is visible to the agent:\n%s", out)
		}
		if !strings.Contains(out, "grep exit 1") {
			t.Fatalf("grep in the agent's home found a canary-like value, or failed:\n%s", out)
		}
		procs := out[strings.Index(out, "--- processes"):strings.Index(out, "--- their")]
		if strings.Contains(procs, "broker") {
			t.Fatalf("the agent can see the broker's process:\n%s", procs)
		}
		// The agent's environment is exactly what it was given, and that holds no secret.
		for _, kv := range env {
			if strings.Contains(kv, canary) {
				t.Fatalf("the agent's environment holds the canary: %s", kv)
			}
		}
		// Every file the agent has, including the responses it saved.
		var files int
		err = filepath.WalkDir(sn.agentDir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			files++
			b, err := os.ReadFile(path)
			if err == nil && strings.Contains(string(b), canary) {
				t.Errorf("the canary is in the agent's file %s", path)
			}
			return err
		})
		if err != nil || files < 3 {
			t.Fatalf("walking the agent's files: %v (%d files)", err, files)
		}
	})

	t.Run("no resolver and no path for DNS", func(t *testing.T) {
		conf, err := sn.agent(t, env, "cat", "/etc/resolv.conf")
		if err != nil || strings.TrimSpace(conf) != "" {
			t.Fatalf("the agent's resolv.conf should be empty: %v\n%s", err, conf)
		}
		name := "exfil-" + randHex(6) + ".example.com"
		if out, err := sn.agent(t, env, "getent", "hosts", name); err == nil {
			t.Fatalf("getent resolved %s in the agent namespace:\n%s", name, out)
		}
		out, err := sn.agent(t, env, "python3", "-c", dnsProbe, "localhost", name, brokerSideIP, "10.250.1.1")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 4 ||
			!strings.HasPrefix(lines[0], "resolve localhost [") || // local names work: the lookup itself is not broken
			!strings.HasPrefix(lines[1], "resolve "+name+" failed:") ||
			lines[2] != "udp53 "+brokerSideIP+" ECONNREFUSED" || // no name server on the only reachable host
			lines[3] != "udp53 10.250.1.1 ENETUNREACH" { // and no route to any other
			t.Fatalf("DNS from the agent:\n%s", out)
		}
	})
}

// TestNetnsComposeDemoSession runs the docker-compose demo's own pieces in the sandbox
// topology: Vault seeded by deploy/vault/seed.sh, the demo API (deploy/demo-upstream), the
// broker with deploy/broker/broker.yaml (its agent, AppRole login and Vault credential) and
// the demo policy, and the agent with the compose file's environment running
// deploy/agent/session.sh. Only what Docker would provide differs: addresses and paths.
func TestNetnsComposeDemoSession(t *testing.T) {
	sn := newSandboxNet(t)
	vaultBin, err := vaulttest.Binary()
	if err != nil {
		if os.Getenv("CAPBROKER_REQUIRE_VAULT") == "1" {
			t.Fatalf("no Vault binary: %v", err)
		}
		t.Skipf("skipped: no Vault binary: %v", err)
	}
	work := t.TempDir()
	dir := func(name string) string {
		d := filepath.Join(work, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	approleDir, keyDir, pkiDir, binDir := dir("vault-approle"), dir("demo-api-key"), dir("pki"), dir("bin")
	if err := os.Symlink(vaultBin, filepath.Join(binDir, "vault")); err != nil {
		t.Fatal(err)
	}
	// inBroker starts a process in the broker's namespace (compose's egress and control
	// networks), killed when the test ends.
	inBroker := func(name string, env []string, argv ...string) *logTail {
		t.Helper()
		cmd := exec.Command("ip", append([]string{"netns", "exec", sn.brokerNS}, argv...)...)
		cmd.Env = append([]string{"HOME=" + work, "PATH=" + binDir + ":" + agentPath}, env...)
		logs := newLogTail()
		cmd.Stdout, cmd.Stderr = logs, logs
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
		return logs
	}

	// Vault in dev mode, then the one-shot seed job, as compose runs them.
	rootToken := "root-" + randHex(8)
	const vaultAddr = "http://127.0.0.1:8200" // a fixed port is safe in a namespace of our own
	inBroker("vault", nil, vaultBin, "server", "-dev", "-dev-root-token-id="+rootToken,
		"-dev-listen-address=127.0.0.1:8200", "-dev-no-store-token")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	seed := exec.CommandContext(ctx, "ip", "netns", "exec", sn.brokerNS, "sh", "../deploy/vault/seed.sh")
	seed.Env = []string{"HOME=" + work, "PATH=" + binDir + ":" + agentPath, "VAULT_ADDR=" + vaultAddr,
		"VAULT_TOKEN=" + rootToken, "APPROLE_DIR=" + approleDir, "API_KEY_DIR=" + keyDir, "OWNER=0:0"}
	if out, err := seed.CombinedOutput(); err != nil || !strings.Contains(string(out), "vault-seed: stored secret/demo/api") {
		t.Fatalf("deploy/vault/seed.sh: %v\n%s", err, out)
	}
	keyBytes, err := os.ReadFile(filepath.Join(keyDir, "api_key"))
	if err != nil || !strings.HasPrefix(string(keyBytes), "sk-demo-") {
		t.Fatalf("the seed job wrote no demo key: %v", err)
	}
	key := string(keyBytes)

	// The demo API, on the broker side's loopback only.
	demoBin := filepath.Join(work, "demo-upstream")
	if out, err := exec.Command("go", "build", "-o", demoBin, "../deploy/demo-upstream").CombinedOutput(); err != nil {
		t.Fatalf("building deploy/demo-upstream: %v\n%s", err, out)
	}
	apiLog := inBroker("demo-upstream", nil, demoBin, "-listen", "127.0.0.1:8443", "-pki", pkiDir,
		"-names", "localhost,127.0.0.1", "-key-file", filepath.Join(keyDir, "api_key"))
	apiLog.wait(t, "demo API listening")

	// The broker: deploy/broker/broker.yaml with the compose paths and addresses replaced.
	policy, err := os.ReadFile("../deploy/broker/policies/broker.rego")
	if err != nil {
		t.Fatal(err)
	}
	b := startBroker(t, brokerOpts{
		netns:  sn.brokerNS,
		listen: brokerSideIP + ":0",
		policy: string(policy),
		mode:   "enforce",
		config: demoBrokerConfig(t, filepath.Join(pkiDir, "ca.crt"), vaultAddr, approleDir, "localhost"),
	})
	mark := b.logs.mark()
	b.writePolicy(t, "data.yaml", "demo:\n  api_hosts: [localhost]\n  api_ports: [8443]\n")
	b.logs.waitFrom(t, mark, `"message":"policy reloaded"`)

	// The agent: the compose file's environment, with the broker's address and CA path here.
	p := loadCompose(t)
	env := []string{"PATH=" + agentPath, "HOME=" + sn.agentDir, "LANG=C.UTF-8",
		"DEMO_API=https://localhost:8443", "DEMO_DIRECT=https://" + brokerSideIP + ":8443",
		"DEMO_DENIED=exfil.invalid", "DEMO_SCAN=" + sn.agentDir, "DEMO_SCAN_PROC=1"}
	ca := filepath.Join(sn.agentDir, "ca.crt")
	caPEM, err := os.ReadFile(b.caFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ca, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, v := range service(t, p, "agent").Environment {
		switch {
		case v == nil:
		case slices.Contains(proxyVars, name):
			u, err := url.Parse(*v)
			if err != nil {
				t.Fatal(err)
			}
			u.Host = b.proxyAddr
			env = append(env, name+"="+u.String())
		case slices.Contains(caVars, name):
			env = append(env, name+"="+ca)
		default:
			env = append(env, name+"="+*v)
		}
	}
	script, err := os.ReadFile("../deploy/agent/session.sh")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sn.agentDir, "session.sh"), script, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := sn.agent(t, env, "sh", filepath.Join(sn.agentDir, "session.sh"))
	if testing.Verbose() {
		t.Logf("session:\n%s", out)
	}
	if err != nil || !strings.Contains(out, "All as expected") {
		t.Fatalf("deploy/agent/session.sh: %v\n%s\nbroker log:\n%s\ndemo API log:\n%s", err, out, b.logs.String(), apiLog.String())
	}
	if strings.Contains(out, key) {
		t.Fatal("the agent saw the demo key")
	}
	if !strings.Contains(apiLog.String(), "authenticated=true") {
		t.Fatalf("the demo API never received its key:\n%s", apiLog.String())
	}
	_ = filepath.WalkDir(sn.agentDir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if b, _ := os.ReadFile(path); strings.Contains(string(b), key) {
				t.Errorf("the demo key is in the agent's file %s", path)
			}
		}
		return nil
	})
	if text := strings.Join(b.auditLog.snapshot(), "\n") + b.logs.String(); strings.Contains(text, key) {
		t.Fatal("the demo key is in the broker's logs")
	}
}

// demoBrokerConfig is deploy/broker/broker.yaml without the sections startBroker writes,
// and with the compose file's paths and addresses replaced by this test's.
func demoBrokerConfig(t *testing.T, upstreamCA, vaultAddr, approleDir, apiHost string) string {
	t.Helper()
	raw, err := os.ReadFile(demoConfig)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"proxy", "admin", "ca", "policy", "audit"} {
		delete(m, k)
	}
	m["upstream"] = map[string]any{"ca_file": upstreamCA, "allow_private": []string{"127.0.0.1/32"}}
	vault, _ := m["vault"].(map[string]any)
	auth, _ := vault["auth"].(map[string]any)
	if auth == nil || auth["method"] != "approle" {
		t.Fatalf("%s: vault.auth is not approle", demoConfig)
	}
	vault["address"] = vaultAddr
	auth["role_id_file"] = filepath.Join(approleDir, "role_id")
	auth["secret_id_file"] = filepath.Join(approleDir, "secret_id")
	creds, _ := m["credentials"].([]any)
	for _, c := range creds {
		c.(map[string]any)["hosts"] = []string{apiHost}
	}
	if approvals, ok := m["approvals"].(map[string]any); ok && approvals["state_file"] != nil {
		approvals["state_file"] = filepath.Join(t.TempDir(), "approvals.json") // compose's volume
	}
	out, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}
