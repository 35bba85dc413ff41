//go:build linux

package integration

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// The ways a sandbox with NET_RAW (Docker's default) or NET_ADMIN sent traffic around the
// broker in the gateway form, when the rules knew the sandbox by its source addresses: IPv6
// from a dual-stack sandbox whose rules named its IPv4 range only, datagrams with a forged
// source, and connections from an address added inside the sandbox.
const (
	// Forged sources: nothing routes them back to the sandbox's interface.
	forgedIP  = "10.77.0.9"
	forgedIP6 = "fd00:77::9"
	// Added inside the sandbox: one in a range the gateway routes to the sandbox (so the
	// reverse path holds, and only the sandbox's prefixes or the broker's agents refuse it),
	// one in a range it does not.
	addedRoutedIP = "10.250.9.9"
	addedIP       = "10.99.0.9"
	addedIP6      = "fd00:99::9"
)

// bypassAttack runs each spec as root in the agent's namespace (NET_RAW and NET_ADMIN: the
// attacker of the finding), at once, and prints "SPEC RESULT" for each. A spec is
// "kind|source|destination|port|source port": tcp connects from source ("-": the kernel's
// choice) and prints "connected", "timeout" or the errno; udp sends three datagrams from
// source; raw sends three UDP datagrams in hand-made IPv4 or IPv6 packets with a forged
// source address and port (IPPROTO_RAW: the header is the sender's).
const bypassAttack = `import errno, socket, struct, sys, threading

def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xffff) + (s >> 16)
    return ~s & 0xffff

def raw(src, dst, dport, sport):
    payload = b"bypass"
    udp = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
    if ":" in dst:
        s6, d6 = socket.inet_pton(socket.AF_INET6, src), socket.inet_pton(socket.AF_INET6, dst)
        c = csum(s6 + d6 + struct.pack("!IxxxB", len(udp), 17) + udp) or 0xffff
        udp = udp[:6] + struct.pack("!H", c) + udp[8:]
        pkt = struct.pack("!IHBB", 6 << 28, len(udp), 17, 64) + s6 + d6 + udp
        s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
    else:
        pkt = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0x4242, 0, 64, 17, 0,
                          socket.inet_aton(src), socket.inet_aton(dst)) + udp
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    for i in range(3):
        s.sendto(pkt, (dst, 0))
    s.close()
    return "sent"

def one(spec, out):
    kind, src, dst, port, sport = spec.split("|")
    family = socket.AF_INET6 if ":" in dst else socket.AF_INET
    try:
        if kind == "raw":
            out[spec] = raw(src, dst, int(port), int(sport))
            return
        s = socket.socket(family, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
        s.settimeout(3)
        if src != "-":
            s.bind((src, 0))
        try:
            if kind == "tcp":
                s.connect((dst, int(port)))
                out[spec] = "connected"
            else:
                for i in range(3):
                    s.sendto(b"bypass", (dst, int(port)))
                out[spec] = "sent"
        finally:
            s.close()
    except socket.timeout:
        out[spec] = "timeout"
    except OSError as e:
        out[spec] = errno.errorcode.get(e.errno, str(e))

out = {}
threads = [threading.Thread(target=one, args=(spec, out)) for spec in sys.argv[1:]]
for t in threads:
    t.start()
for t in threads:
    t.join()
for spec in sys.argv[1:]:
    print(spec, out.get(spec, "no result"))
`

// TestTransparentBypass applies the gateway form as docs/transparent.md has it, from the
// broker's config (transparent.interfaces) through `broker transparent rules --apply`, and
// attacks it from inside the sandbox: IPv6 TCP with only the IPv4 range named, UDP with a
// forged source in raw IPv4 and IPv6 packets, TCP and UDP from addresses added inside the
// sandbox. The outside's listeners get nothing, and each attempt is audited: dropped for its
// source address (naming no agent), or refused by the broker it was redirected to. Without
// the rules, every attack reaches the outside; with them, redirected traffic still works.
func TestTransparentBypass(t *testing.T) {
	sn := newSandboxNet(t)
	outsideNS := gatewayNet(t, sn)
	// The outside answers anything, as the internet would: default routes back through the
	// gateway, which routes a wider range to the sandbox than its /30.
	ipCmd(t, "-n", outsideNS, "route", "add", "default", "via", "10.250.1.1")
	ipCmd(t, "-n", outsideNS, "-6", "route", "add", "default", "via", "fd00:251::1")
	ipCmd(t, "-n", sn.brokerNS, "route", "add", "10.250.9.0/24", "via", agentSideIP)
	ipCmd(t, "-n", sn.agentNS, "addr", "add", addedRoutedIP+"/32", "dev", sn.vethA)
	ipCmd(t, "-n", sn.agentNS, "addr", "add", addedIP+"/32", "dev", sn.vethA)
	ipCmd(t, "-n", sn.agentNS, "-6", "addr", "add", addedIP6+"/128", "dev", sn.vethA, "nodad")

	outTCP := serveTCP(t, outsideNS, ":0") // both families, every address of the outside
	outUDP := serveUDP(t, outsideNS, ":0", "")
	const outside6 = "fd00:251::2"

	// The API the sandbox may reach, through the broker only: on the broker side's loopback.
	canary := "sk-canary-" + randHex(12)
	pki := newUpstreamPKI(t)
	var apiHits atomic.Int64
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		apiHits.Add(1)
		fmt.Fprintf(w, "host=%s path=%s auth=%s\n", r.Host, r.URL.Path, r.Header.Get("Authorization"))
	})}
	ln := sn.listenInBroker(t, "127.0.0.1:443")
	up.TLSConfig = &tls.Config{Certificates: []tls.Certificate{pki.Server(t, time.Now().Add(time.Hour), transparentAPI)}}
	go func() { _ = up.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = up.Close() })
	hostsFile(t, sn.brokerNS, "127.0.0.1 "+transparentAPI)
	sn.resolvConf(t, "nameserver "+brokerSideIP, "options attempts:1 timeout:3")

	b := startBroker(t, brokerOpts{
		netns:  sn.brokerNS,
		listen: transparentProxy,
		policy: transparentPolicy,
		mode:   "enforce",
		config: fmt.Sprintf(`upstream:
  ca_file: %q
  allow_private: ["127.0.0.1/32"]
agents:
  - {id: %s, addresses: ["%s/32", "%s/128"]}
credentials:
  - name: canary
    hosts: [%q]
    source: {env: CANARY_SECRET}
    inject: {header: Authorization, value: "Bearer {{secret}}"}
transparent:
  listen: "[::]:%s"
  log_group: %d
  interfaces: [%s]
  dns: {listen: %q}
`, pki.File, agentID, agentSideIP, agentSideIP6, transparentAPI, transparentPort, transparentLog, sn.vethB, transparentDNS),
		env: []string{"CANARY_SECRET=" + canary},
	})
	b.logs.wait(t, `"message":"resolver listening"`)
	brokerYAML := filepath.Join(b.dir, "broker.yaml")

	attack := func(specs ...string) map[string]string {
		t.Helper()
		cmd := exec.Command("ip", append([]string{"netns", "exec", sn.agentNS, "python3", "-c", bypassAttack}, specs...)...)
		cmd.Env = []string{"PATH=" + agentPath}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("attack: %v\n%s", err, out)
		}
		got := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			spec, result, _ := strings.Cut(l, " ")
			got[spec] = result
		}
		return got
	}
	// The attacks of one round, each its own flow (source ports differ between rounds).
	type attackSpec struct {
		name, spec string
		tcp        bool
		src, dst   string
	}
	attacks := func(round int) []attackSpec {
		tcpPort, udpPort := fmt.Sprint(outTCP.port()), fmt.Sprint(outUDP.port())
		sport := fmt.Sprint(40000 + round)
		return []attackSpec{
			{"IPv6 TCP, only the IPv4 range named", "tcp|-|" + outside6 + "|" + tcpPort + "|0", true, agentSideIP6, outside6},
			{"UDP with a forged IPv4 source", "raw|" + forgedIP + "|" + outsideIP + "|" + udpPort + "|" + sport, false, forgedIP, outsideIP},
			{"UDP with a forged IPv6 source", "raw|" + forgedIP6 + "|" + outside6 + "|" + udpPort + "|" + sport, false, forgedIP6, outside6},
			{"TCP from an added address the gateway routes", "tcp|" + addedRoutedIP + "|" + outsideIP + "|" + tcpPort + "|0", true, addedRoutedIP, outsideIP},
			{"UDP from an added address", "udp|" + addedIP + "|" + outsideIP + "|" + udpPort + "|0", false, addedIP, outsideIP},
			{"UDP from an added IPv6 address", "udp|" + addedIP6 + "|" + outside6 + "|" + udpPort + "|0", false, addedIP6, outside6},
		}
	}
	specs := func(as []attackSpec) (out []string) {
		for _, a := range as {
			out = append(out, a.spec)
		}
		return out
	}

	t.Run("without the rules, every attack reaches the outside", func(t *testing.T) {
		tcpBefore, udpBefore := outTCP.accepted.Load(), outUDP.got.Load()
		as := attacks(0)
		got := attack(specs(as)...)
		for _, a := range as {
			if want := map[bool]string{true: "connected", false: "sent"}[a.tcp]; got[a.spec] != want {
				t.Errorf("%s: %q, want %q", a.name, got[a.spec], want)
			}
		}
		// TCP: the two connections accepted. UDP: three datagrams of each of the four
		// attacks; counted as they arrive, so wait for them (the outside echoes each, which
		// the attacker never reads).
		eventually(t, "the outside's twelve datagrams", func() bool { return outUDP.got.Load()-udpBefore >= 12 })
		if n := outTCP.accepted.Load() - tcpBefore; n != 2 {
			t.Errorf("the outside accepted %d connections, want 2", n)
		}
		if n := outUDP.got.Load() - udpBefore; n != 12 {
			t.Errorf("the outside received %d datagrams, want 12", n)
		}
		if t.Failed() {
			t.Fatal("the topology does not carry the attacks: the checks below would prove nothing")
		}
	})

	isSourceDrop := func(a attackSpec) func(auditEvent) bool {
		return func(ev auditEvent) bool {
			proto := map[bool]string{true: "tcp", false: "udp"}[a.tcp]
			return ev["scheme"] == proto && ev["host"] == a.dst && ev["source_ip"] == a.src && ev["decision"] == "deny" &&
				ev["mode"] == "transparent" && (ev["agent"] == nil || ev["agent"] == "") &&
				ev["reason"] == "source address not the sandbox's (forged, or added inside the sandbox): dropped"
		}
	}
	// refusedBy is a redirected connection's refusal by the broker: decided, audited.
	refusedBy := func(a attackSpec, reason string) func(auditEvent) bool {
		return func(ev auditEvent) bool {
			return ev["scheme"] == "tcp" && ev["host"] == a.dst && ev["source_ip"] == a.src && ev["decision"] == "deny" &&
				ev["mode"] == "transparent" && strings.Contains(fmt.Sprint(ev["reason"]), reason)
		}
	}
	// The API through the broker: the name from the broker's resolver, the connection
	// redirected, the credential injected, and scrubbed from what the agent reads.
	reachAPI := func(t *testing.T, extra ...string) {
		t.Helper()
		env := sn.agentEnv(t, "http://unused.invalid", b.caFile)
		var clean []string
		for _, kv := range env {
			if !strings.Contains(strings.ToLower(kv), "proxy") {
				clean = append(clean, kv)
			}
		}
		before := apiHits.Load()
		argv := append(append([]string{"curl"}, extra...), "--noproxy", "*", "-sS", "--max-time", "20", "https://"+transparentAPI+"/api/ok")
		out, err := sn.agent(t, clean, argv...)
		if want := "host=" + transparentAPI + " path=/api/ok auth=Bearer [REDACTED]\n"; err != nil || out != want {
			t.Fatalf("curl through the redirect: %v\n%q, want %q\nbroker log:\n%s", err, out, want, b.logs.String())
		}
		if n := apiHits.Load() - before; n != 1 {
			t.Fatalf("the API received %d requests, want 1", n)
		}
	}
	// round runs the attacks and checks each against its expected audit event; dropped
	// ones must also have gone unanswered (a TCP connect times out). Nothing reaches the
	// outside.
	type verdict struct {
		audit   func(attackSpec) func(auditEvent) bool
		dropped bool
	}
	dropped := verdict{isSourceDrop, true}
	round := func(t *testing.T, n int, want map[string]verdict) {
		t.Helper()
		tcpBefore, udpBefore := outTCP.accepted.Load(), outUDP.got.Load()
		as := attacks(n)
		got := attack(specs(as)...)
		for _, a := range as {
			t.Run(a.name, func(t *testing.T) {
				v, ok := want[a.name]
				if !ok {
					t.Fatal("no expectation")
				}
				if a.tcp && v.dropped && got[a.spec] != "timeout" {
					t.Errorf("connect: %q, want a timeout (the SYN dropped, unanswered)", got[a.spec])
				}
				b.waitAuditWhere(t, 1, "the audit event of "+a.name, v.audit(a))
			})
		}
		// Every attempt has been audited where it was stopped: nothing went on.
		if n := outTCP.accepted.Load() - tcpBefore; n != 0 {
			t.Errorf("the outside accepted %d connections", n)
		}
		if n := outUDP.got.Load() - udpBefore; n != 0 {
			t.Errorf("the outside received %d datagrams", n)
		}
	}

	t.Run("interfaces and the IPv4 range: every attack dropped for its source, audited", func(t *testing.T) {
		out := sn.transparentRules(t, "--config", brokerYAML, "--sandbox-cidr", agentSideIP+"/32", "--apply")
		if !strings.Contains(out, "the sandbox is what arrives on "+sn.vethB) {
			t.Fatalf("--apply said:\n%s", out)
		}
		all := map[string]verdict{}
		for _, a := range attacks(1) {
			all[a.name] = dropped
		}
		round(t, 1, all)
		// IPv6 is not the sandbox's here: the API over IPv4.
		reachAPI(t, "-4")
	})

	t.Run("interfaces alone: forged sources dropped, the rest decided by the broker", func(t *testing.T) {
		sn.transparentRules(t, "--config", brokerYAML, "--apply")
		round(t, 2, map[string]verdict{
			// Redirected to the broker: the agent's own IPv6 address, to a port not served.
			"IPv6 TCP, only the IPv4 range named": {audit: func(a attackSpec) func(auditEvent) bool {
				return refusedBy(a, "is not served (transparent.ports)")
			}},
			"UDP with a forged IPv4 source": dropped,
			"UDP with a forged IPv6 source": dropped,
			// Redirected to the broker, which knows no agent there.
			"TCP from an added address the gateway routes": {audit: func(a attackSpec) func(auditEvent) bool {
				return refusedBy(a, "no agent is configured with source address "+addedRoutedIP)
			}},
			// Not routed back through the sandbox's interface: the reverse path drops them.
			"UDP from an added address":      dropped,
			"UDP from an added IPv6 address": dropped,
		})
		reachAPI(t)
	})

	if text := strings.Join(b.auditLog.snapshot(), "\n") + b.logs.String(); strings.Contains(text, canary) {
		t.Error("the canary is in the broker's logs")
	}
	if t.Failed() {
		t.Logf("broker log:\n%s\nruleset:\n%s", b.logs.String(), ipCmd(t, "netns", "exec", sn.brokerNS, "nft", "list", "ruleset"))
	}
}

// TestTransparentAdminRefused: in transparent mode, `broker run` and `broker check-config`
// refuse an admin listener without authentication that an agent reaches (loopback, when the
// agent shares the broker's network namespace), naming admin.listen; the shipped compose
// variant's config passes that check only because it sets a token.
func TestTransparentAdminRefused(t *testing.T) {
	dir := t.TempDir()
	if out, code := run(t, dir, "ca", "init", "--out", "ca"); code != 0 {
		t.Fatal(out)
	}
	if err := os.MkdirAll(filepath.Join(dir, "policies"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "policies", "broker.rego"), []byte(transparentPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "admin.token"), []byte(randHex(32)), 0o600); err != nil {
		t.Fatal(err)
	}
	const base = `proxy: {listen: "127.0.0.1:0"}
ca: {cert_file: ca/ca.crt, key_file: ca/ca.key}
policy: {dir: policies}
`
	for name, c := range map[string]struct {
		cfg    string
		refuse string // "" = starts
	}{
		"pod form, tokenless": {`admin: {listen: "127.0.0.1:0"}
agents: [{id: a, addresses: ["0.0.0.0/0", "::/0"]}]
transparent: {listen: "127.0.0.1:0", dns: {listen: "127.0.0.1:0"}}
`, `transparent.listen "127.0.0.1:0" is on loopback`},
		"agent known by a loopback address, tokenless": {`admin: {listen: "[::1]:0"}
agents: [{id: a, addresses: ["10.250.0.2", "127.0.0.0/8"]}]
transparent: {listen: "0.0.0.0:0"}
`, "agents[0] (a) is known by an address on loopback"},
		"pod form, with a token": {`admin: {listen: "127.0.0.1:0", token_file: admin.token}
agents: [{id: a, addresses: ["0.0.0.0/0", "::/0"]}]
transparent: {listen: "127.0.0.1:0", dns: {listen: "127.0.0.1:0"}}
`, ""},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := filepath.Join(dir, strings.ReplaceAll(name, " ", "_")+".yaml")
			if err := os.WriteFile(cfg, []byte(base+c.cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			out, code := run(t, dir, "check-config", "--config", cfg)
			if c.refuse == "" {
				if code != 0 {
					t.Fatalf("check-config: exit %d\n%s", code, out)
				}
				return
			}
			if code != 1 || !strings.Contains(out, "admin.listen:") || !strings.Contains(out, "an agent reaches it") || !strings.Contains(out, c.refuse) {
				t.Fatalf("check-config: exit %d, want 1 naming admin.listen and %q:\n%s", code, c.refuse, out)
			}
			// The broker itself refuses to start: it exits at once, saying the same.
			out, code = run(t, dir, "run", "--config", cfg)
			if code == 0 || !strings.Contains(out, "admin.listen:") || !strings.Contains(out, c.refuse) || strings.Contains(out, `"message":"listening"`) {
				t.Fatalf("run: exit %d, want a refusal naming admin.listen:\n%s", code, out)
			}
		})
	}

	// The shipped compose variant: its token is what lets it start.
	raw, err := os.ReadFile(demoTransparentConfig)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	delete(m["admin"].(map[string]any), "token_file")
	stripped, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	for file, refused := range map[string]bool{demoTransparentConfig: false, filepath.Join(dir, "tokenless.yaml"): true} {
		if refused {
			if err := os.WriteFile(file, stripped, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		abs, _ := filepath.Abs(file)
		out, _ := run(t, dir, "check-config", "--config", abs)
		if strings.Contains(out, "an agent reaches it") != refused {
			t.Errorf("%s: refused for its admin listener = %v, want %v:\n%s", file, !refused, refused, out)
		}
	}
}

// TestTransparentPodAdminPort: in the pod form, the agent shares the broker's loopback; the
// rules keep every user but the broker's off the admin listener's port (--admin-port), so a
// token is not the only thing between the agent and the approvals API.
func TestTransparentPodAdminPort(t *testing.T) {
	sn := newSandboxNet(t)
	requireNft(t)
	const brokerUID = "4243"
	pod := sn.agentNS
	admin := serveTCP(t, pod, "127.0.0.1:0") // the admin listener's stand-in
	out, err := exec.Command("ip", "netns", "exec", pod, brokerBin, "transparent", "rules", "--hook", "output",
		"--broker-uid", brokerUID, "--transparent-port", "15001", "--dns-port", "0", "--admin-port", fmt.Sprint(admin.port()), "--apply").CombinedOutput()
	if err != nil {
		t.Fatalf("broker transparent rules --hook output --apply: %v\n%s", err, out)
	}
	probeAs := func(uid string, targets ...string) map[string]string {
		t.Helper()
		cmd := exec.Command("ip", append([]string{"netns", "exec", pod, "setpriv", "--reuid", uid, "--regid", uid, "--clear-groups",
			"python3", "-c", packetProbe}, targets...)...)
		cmd.Env = []string{"PATH=" + agentPath}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("probe as %s: %v\n%s", uid, err, out)
		}
		got := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			target, result, _ := strings.Cut(l, " ")
			got[target] = result
		}
		return got
	}
	targets := []string{fmt.Sprintf("tcp:127.0.0.1:%d", admin.port()), fmt.Sprintf("tcp:[::1]:%d", admin.port())}
	got := probeAs(agentUID, targets...)
	for _, target := range targets {
		if got[target] != "ECONNREFUSED" && got[target] != "EPERM" {
			t.Errorf("the agent's %s: %q, want refused", target, got[target])
		}
	}
	if n := admin.accepted.Load(); n != 0 {
		t.Errorf("the admin listener accepted %d of the agent's connections", n)
	}
	if got := probeAs(brokerUID, targets[0]); got[targets[0]] != "connected" || admin.accepted.Load() != 1 {
		t.Errorf("the broker's user should reach its admin listener: %v", got)
	}
}

// TestTransparentRulesRefuseUplink: the reverse path holds a source to what is routed through
// the sandbox's interface; through the interface of the default route, every address is. The
// rules refuse to be applied on one, IPv4's or IPv6's, and leave the packet filter alone.
func TestTransparentRulesRefuseUplink(t *testing.T) {
	sn := newSandboxNet(t)
	requireNft(t)
	for _, family := range []string{"-4", "-6"} {
		t.Run(family, func(t *testing.T) {
			via := map[string]string{"-4": agentSideIP, "-6": "fd00:250::2"}[family]
			if family == "-6" {
				ipCmd(t, "-n", sn.brokerNS, "-6", "addr", "add", "fd00:250::1/64", "dev", sn.vethB, "nodad")
			}
			ipCmd(t, "-n", sn.brokerNS, family, "route", "add", "default", "via", via)
			defer ipCmd(t, "-n", sn.brokerNS, family, "route", "del", "default")
			for _, iface := range []string{sn.vethB, sn.vethB[:4] + "*"} {
				cmd := exec.Command("ip", "netns", "exec", sn.brokerNS, brokerBin, "transparent", "rules",
					"--sandbox-iface", iface, "--transparent-port", "15001", "--log-group", "7", "--apply")
				out, err := cmd.CombinedOutput()
				if err == nil || !strings.Contains(string(out), "carries this namespace's default route") {
					t.Fatalf("--sandbox-iface %s: %v\n%s", iface, err, out)
				}
				if tables := ipCmd(t, "netns", "exec", sn.brokerNS, "nft", "list", "tables"); strings.Contains(tables, "capbroker") {
					t.Fatalf("the rules were applied:\n%s", tables)
				}
			}
		})
	}
}
