//go:build linux

package integration

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// The gateway topology of transparent mode (docs/transparent.md): the agent's default
// routes go through the broker's namespace, which routes on to an "outside" namespace
// standing in for the internet (its own address, and the name pool routed to it), so that
// without the rules every packet of the agent's would get there.
//
//	agent                       broker (forwarding on)            outside
//	10.250.0.2  fd00:250::2 --- 10.250.0.1  fd00:250::1
//	                            10.250.1.1  fd00:251::1 ------- 10.250.1.2  fd00:251::2
//	                            198.18.0.0/15, fd00:cb::/64 via    (and a pool address of each, on lo)
const (
	outsideIP  = "10.250.1.2"
	poolAddr4  = "198.18.7.7"
	poolAddr6  = "fd00:cb::7"
	nflogGroup = 7
)

// gatewayNet adds the routes, IPv6 and the outside namespace to a sandboxNet.
func gatewayNet(t *testing.T, sn *sandboxNet) (outsideNS string) {
	t.Helper()
	requireNft(t)
	outsideNS = strings.TrimSuffix(sn.brokerNS, "-b") + "-o"
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", outsideNS).Run() })
	ipCmd(t, "netns", "add", outsideNS)
	id := randHex(3)
	vethB, vethO := "cb"+id+"ob", "cb"+id+"oo"
	ipCmd(t, "link", "add", vethB, "type", "veth", "peer", "name", vethO)
	ipCmd(t, "link", "set", vethB, "netns", sn.brokerNS)
	ipCmd(t, "link", "set", vethO, "netns", outsideNS)
	ipCmd(t, "-n", outsideNS, "link", "set", "lo", "up")
	ipCmd(t, "-n", outsideNS, "link", "set", vethO, "up")
	ipCmd(t, "-n", sn.brokerNS, "link", "set", vethB, "up")
	ipCmd(t, "-n", sn.brokerNS, "addr", "add", "10.250.1.1/30", "dev", vethB)
	ipCmd(t, "-n", outsideNS, "addr", "add", outsideIP+"/30", "dev", vethO)
	ipCmd(t, "-n", sn.brokerNS, "addr", "add", "fd00:251::1/64", "dev", vethB, "nodad")
	ipCmd(t, "-n", outsideNS, "addr", "add", "fd00:251::2/64", "dev", vethO, "nodad")
	// The agent's IPv6 address and both default routes, through the broker; forwarding on.
	sn.gateway(t)
	// The broker routes on to the outside, pool addresses included; the outside routes back.
	ipCmd(t, "-n", sn.brokerNS, "route", "add", "198.18.0.0/15", "via", outsideIP)
	ipCmd(t, "-n", sn.brokerNS, "-6", "route", "add", "fd00:cb::/64", "via", "fd00:251::2")
	ipCmd(t, "-n", outsideNS, "route", "add", "10.250.0.0/30", "via", "10.250.1.1")
	ipCmd(t, "-n", outsideNS, "-6", "route", "add", "fd00:250::/64", "via", "fd00:251::1")
	ipCmd(t, "-n", outsideNS, "addr", "add", poolAddr4+"/32", "dev", "lo")
	ipCmd(t, "-n", outsideNS, "addr", "add", poolAddr6+"/128", "dev", "lo", "nodad")
	return outsideNS
}

// inNetns runs fn on an OS thread switched into namespace ns; sockets made there stay in it.
func inNetns(t *testing.T, ns string, fn func() error) {
	t.Helper()
	done := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		f, err := os.Open(filepath.Join("/run/netns", ns))
		if err == nil {
			err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
			f.Close()
		}
		if err == nil {
			err = fn()
		}
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatalf("in %s: %v", ns, err)
	}
}

// udpService answers every datagram with reply (or, when reply is "", with the datagram
// itself), and counts them.
type udpService struct {
	conn net.PacketConn
	got  atomic.Int64
}

func serveUDP(t *testing.T, ns, addr, reply string) *udpService {
	t.Helper()
	s := &udpService{}
	inNetns(t, ns, func() (err error) {
		s.conn, err = net.ListenPacket("udp", addr)
		return err
	})
	t.Cleanup(func() { s.conn.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := s.conn.ReadFrom(buf)
			if err != nil {
				return
			}
			s.got.Add(1)
			out := buf[:n]
			if reply != "" {
				out = []byte(reply)
			}
			_, _ = s.conn.WriteTo(out, from)
		}
	}()
	return s
}

func (s *udpService) port() int { return s.conn.LocalAddr().(*net.UDPAddr).Port }

// tcpService is an HTTP service that counts its connections.
type tcpService struct {
	srv      *httptest.Server
	accepted atomic.Int64
}

func serveTCP(t *testing.T, ns, addr string) *tcpService {
	t.Helper()
	s := &tcpService{}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "a service the sandbox must not reach")
	}))
	s.srv.Listener.Close()
	inNetns(t, ns, func() (err error) {
		s.srv.Listener, err = net.Listen("tcp", addr)
		return err
	})
	s.srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.accepted.Add(1)
		}
	}
	s.srv.Start()
	t.Cleanup(s.srv.Close)
	return s
}

func (s *tcpService) port() int { return s.srv.Listener.Addr().(*net.TCPAddr).Port }

// packetProbe sends to each udp:HOST:PORT argument three datagrams on one socket and
// an echo request to each icmp:HOST:0 (an unprivileged ICMP socket: ping_group_range), and
// prints what came back ("answered <reply>", "timeout", or the errno: EHOSTUNREACH or EACCES
// is an ICMP refusal), and connects to each tcp:HOST:PORT ("connected" or the errno).
const packetProbe = `import errno, socket, sys
for target in sys.argv[1:]:
    proto, rest = target.split(":", 1)
    host, port = rest.rsplit(":", 1)
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if proto == "icmp":
        s = socket.socket(family, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
    else:
        s = socket.socket(family, socket.SOCK_DGRAM if proto == "udp" else socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, int(port)))
        if proto == "icmp":
            s.send(b"\x08\x00\x00\x00\x00\x00\x00\x01probe")  # an echo request
            print(target, "answered", "echo-reply" if s.recv(512)[0] == 0 else "other")
        elif proto == "udp":
            for i in range(3):
                s.send(b"probe")
            print(target, "answered", s.recv(512).decode())
        else:
            print(target, "connected")
    except socket.timeout:
        print(target, "timeout")
    except OSError as e:
        print(target, errno.errorcode.get(e.errno, str(e)))
    finally:
        s.close()
`

// TestNetnsTransparentRules applies `broker transparent rules --apply` in the broker's
// namespace of the gateway topology and checks, from the agent: UDP (QUIC's transport) to
// the outside and to the name pool goes nowhere and is audited once per flow, as refused
// UDP in transparent mode, and ICMP as not routed; DNS to any server lands at the broker's
// resolver port; no service of the broker's host but the broker's listeners is reachable;
// explicit-proxy clients work unchanged; a second broker cannot take the log group;
// --remove takes it all away again. Before the rules, the same probes get through:
// the topology would carry them.
func TestNetnsTransparentRules(t *testing.T) {
	sn := newSandboxNet(t)
	outsideNS := gatewayNet(t, sn)

	// The outside: UDP that echoes (QUIC's port, on its own address and on pool addresses:
	// bound to each, so that replies come from it), DNS, and TCP.
	outUDP := []*udpService{
		serveUDP(t, outsideNS, outsideIP+":443", ""),
		serveUDP(t, outsideNS, poolAddr4+":443", ""),
		serveUDP(t, outsideNS, "["+poolAddr6+"]:443", ""),
	}
	outUDPGot := func() (n int64) {
		for _, s := range outUDP {
			n += s.got.Load()
		}
		return n
	}
	outDNS := serveUDP(t, outsideNS, ":53", "outside-dns")
	outTCP := serveTCP(t, outsideNS, ":0")
	// The broker's host: a UDP and a TCP service the sandbox must not reach (standing in for
	// Vault, a metrics agent...), and the resolver's port (a stand-in that answers
	// "broker-dns", so the redirect is seen without the resolver).
	hostUDP := serveUDP(t, sn.brokerNS, ":0", "host-udp")
	hostTCP := serveTCP(t, sn.brokerNS, ":0")
	dns := serveUDP(t, sn.brokerNS, brokerSideIP+":0", "broker-dns")

	canary := "sk-canary-" + randHex(12)
	pki := newUpstreamPKI(t)
	var upstreamHits atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamHits.Add(1)
		fmt.Fprintf(w, "path=%s auth=%s\n", r.URL.Path, r.Header.Get("Authorization"))
	}))
	up.Listener.Close()
	up.Listener = sn.listenInBroker(t, "127.0.0.1:0")
	up.TLS = &tls.Config{Certificates: []tls.Certificate{pki.Leaf}}
	up.StartTLS()
	t.Cleanup(up.Close)

	b := startBroker(t, brokerOpts{
		netns:  sn.brokerNS,
		listen: brokerSideIP + ":0",
		policy: netnsPolicy,
		mode:   "enforce",
		config: fmt.Sprintf(`upstream:
  ca_file: %q
  allow_private: ["127.0.0.1/32"]
agents:
  - {id: sandbox, addresses: ["%s/32", "fd00:250::2/128"]}
credentials:
  - name: canary
    hosts: ["127.0.0.1"]
    source: {env: CANARY_SECRET}
    inject: {header: Authorization, value: "Bearer {{secret}}"}
transparent:
  listen: "0.0.0.0:15001"
  log_group: %d
`, pki.File, agentSideIP, nflogGroup),
		env: []string{"CANARY_SECRET=" + canary},
	})
	_, adminPort, _ := net.SplitHostPort(b.adminAddr)

	udpTargets := []string{
		"udp:" + outsideIP + ":443",
		"udp:" + poolAddr4 + ":443",
		"udp:[" + poolAddr6 + "]:443",
		fmt.Sprintf("udp:%s:%d", brokerSideIP, hostUDP.port()),
		"udp:" + outsideIP + ":53",
	}
	probe := func(targets ...string) map[string]string {
		t.Helper()
		out, err := sn.agent(t, []string{"PATH=" + agentPath}, append([]string{"python3", "-c", packetProbe}, targets...)...)
		if err != nil {
			t.Fatalf("probe: %v\n%s", err, out)
		}
		got := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			target, result, _ := strings.Cut(l, " ")
			got[target] = result
		}
		return got
	}
	curl := func(url string) (string, error) {
		return sn.agent(t, []string{"PATH=" + agentPath}, "curl", "--noproxy", "*", "-sS", "--max-time", "5", url)
	}
	tcpOut := fmt.Sprintf("tcp:%s:%d", outsideIP, outTCP.port())
	icmpOut := "icmp:" + outsideIP + ":0"
	if out, err := exec.Command("ip", "netns", "exec", sn.agentNS, "sysctl", "-qw", "net.ipv4.ping_group_range=0 2147483647").CombinedOutput(); err != nil {
		t.Fatalf("ping_group_range: %v %s", err, out)
	}

	t.Run("without the rules, everything gets through", func(t *testing.T) {
		got := probe(append(udpTargets, tcpOut, icmpOut)...)
		if got[icmpOut] != "answered echo-reply" {
			t.Errorf("%s: %q, want the outside's echo reply", icmpOut, got[icmpOut])
		}
		for _, target := range udpTargets[:3] {
			if got[target] != "answered probe" {
				t.Errorf("%s: %q, want the outside's echo", target, got[target])
			}
		}
		if r := got[udpTargets[3]]; r != "answered host-udp" {
			t.Errorf("%s: %q, want the broker host's UDP service", udpTargets[3], r)
		}
		if r := got[udpTargets[4]]; r != "answered outside-dns" {
			t.Errorf("%s: %q, want the outside's DNS", udpTargets[4], r)
		}
		if got[tcpOut] != "connected" {
			t.Errorf("%s: %q", tcpOut, got[tcpOut])
		}
		if out, err := curl(fmt.Sprintf("http://%s:%d/", brokerSideIP, hostTCP.port())); err != nil || !strings.Contains(out, "must not reach") {
			t.Errorf("the broker host's TCP service: %v %s", err, out)
		}
		if t.Failed() {
			t.Fatal("the topology does not carry the agent's packets: the checks below would prove nothing")
		}
	})

	rulesCmd := func(args ...string) string { t.Helper(); return sn.transparentRules(t, args...) }
	apply := []string{"--config", filepath.Join(b.dir, "broker.yaml"),
		"--sandbox-iface", sn.vethB, "--sandbox-cidr", agentSideIP + "/32", "--sandbox-cidr", "fd00:250::2/128",
		"--proxy-addr", b.proxyAddr, "--dns-port", fmt.Sprint(dns.port()), "--apply"}
	out := rulesCmd(apply...)
	if !strings.Contains(out, fmt.Sprintf("TCP to port 15001, DNS to port %d, log group %d", dns.port(), nflogGroup)) {
		t.Fatalf("--apply said:\n%s", out)
	}
	ruleset := ipCmd(t, "netns", "exec", sn.brokerNS, "nft", "list", "ruleset")
	rulesCmd(apply...) // applied again: the table is replaced, not doubled
	if again := ipCmd(t, "netns", "exec", sn.brokerNS, "nft", "list", "ruleset"); again != ruleset {
		t.Fatalf("applying twice changed the ruleset:\n%s\nthen:\n%s", ruleset, again)
	}

	outBefore, outDNSBefore, hostUDPBefore, outTCPBefore, hostTCPBefore := outUDPGot(), outDNS.got.Load(), hostUDP.got.Load(), outTCP.accepted.Load(), hostTCP.accepted.Load()
	t.Run("UDP goes nowhere, refused and audited once per flow", func(t *testing.T) {
		got := probe(udpTargets...)
		for _, target := range udpTargets[:4] {
			// ICMP "administratively prohibited": IPv4's is reported as EHOSTUNREACH, IPv6's
			// as EACCES.
			if got[target] != "EHOSTUNREACH" && got[target] != "EACCES" {
				t.Errorf("%s: %q, want EHOSTUNREACH or EACCES (an ICMP refusal)", target, got[target])
			}
		}
		isRefusedUDP := func(host string, port int) func(auditEvent) bool {
			return func(ev auditEvent) bool {
				return ev["scheme"] == "udp" && ev["mode"] == "transparent" && ev["decision"] == "deny" &&
					ev["host"] == host && ev["port"] == float64(port) && ev["agent"] == "sandbox" &&
					strings.Contains(fmt.Sprint(ev["reason"]), "UDP is not carried by the broker")
			}
		}
		flows := map[string]func(auditEvent) bool{
			outsideIP + ":443": isRefusedUDP(outsideIP, 443),
			poolAddr4 + ":443": isRefusedUDP(poolAddr4, 443),
			poolAddr6 + ":443": isRefusedUDP(poolAddr6, 443),
			fmt.Sprintf("%s:%d", brokerSideIP, hostUDP.port()): isRefusedUDP(brokerSideIP, hostUDP.port()),
		}
		for what, match := range flows {
			b.waitAuditWhere(t, 1, "the refused UDP flow to "+what, match)
		}
		if n := outUDPGot() - outBefore; n != 0 {
			t.Errorf("the outside received %d datagrams", n)
		}
		if n := hostUDP.got.Load() - hostUDPBefore; n != 0 {
			t.Errorf("the broker host's UDP service received %d datagrams", n)
		}
		// Three datagrams a flow, one event.
		for what, match := range flows {
			var n int
			for _, ev := range b.audit(t) {
				if match(ev) {
					n++
					if ev["source_ip"] != agentSideIP && ev["source_ip"] != "fd00:250::2" {
						t.Errorf("%s: source_ip %v", what, ev["source_ip"])
					}
				}
			}
			if n != 1 {
				t.Errorf("the flow to %s has %d audit events, want 1", what, n)
			}
		}
	})

	t.Run("DNS to any server lands at the broker's resolver port", func(t *testing.T) {
		got := probe(udpTargets[4], "udp:"+brokerSideIP+":53")
		if r := got[udpTargets[4]]; r != "answered broker-dns" {
			t.Errorf("%s: %q, want the broker's resolver", udpTargets[4], r)
		}
		if r := got["udp:"+brokerSideIP+":53"]; r != "answered broker-dns" {
			t.Errorf("the broker's own port 53: %q, want the broker's resolver", r)
		}
		if n := outDNS.got.Load() - outDNSBefore; n != 0 {
			t.Errorf("the outside's DNS received %d queries", n)
		}
		if n := dns.got.Load(); n < 2 {
			t.Errorf("the resolver's port received %d queries, want 2 or more", n)
		}
	})

	t.Run("ICMP goes nowhere, refused and audited as not routed", func(t *testing.T) {
		got := probe(icmpOut)
		if got[icmpOut] != "EHOSTUNREACH" {
			t.Errorf("%s: %q, want EHOSTUNREACH (an ICMP refusal)", icmpOut, got[icmpOut])
		}
		b.waitAuditWhere(t, 1, "the refused ICMP echo to "+outsideIP, func(ev auditEvent) bool {
			return ev["scheme"] == "icmp" && ev["method"] == "ICMP" && ev["mode"] == "transparent" && ev["decision"] == "deny" &&
				ev["host"] == outsideIP && ev["agent"] == "sandbox" && ev["reason"] == "not routed: only the broker is reachable"
		})
	})

	t.Run("no TCP service but the broker's is reachable", func(t *testing.T) {
		probe(tcpOut)
		for _, url := range []string{
			fmt.Sprintf("http://%s:%d/", brokerSideIP, hostTCP.port()),
			fmt.Sprintf("http://%s:%d/", outsideIP, outTCP.port()),
			fmt.Sprintf("http://%s:%s/healthz", brokerSideIP, adminPort), // the admin port (on loopback too)
		} {
			if out, err := curl(url); err == nil && !strings.Contains(out, "403") {
				t.Errorf("%s answered the agent:\n%s", url, out)
			}
		}
		if n := outTCP.accepted.Load() - outTCPBefore; n != 0 {
			t.Errorf("the outside accepted %d connections", n)
		}
		if n := hostTCP.accepted.Load() - hostTCPBefore; n != 0 {
			t.Errorf("the broker host's TCP service accepted %d connections", n)
		}
	})

	t.Run("explicit-proxy clients work unchanged", func(t *testing.T) {
		env := sn.agentEnv(t, "http://"+b.proxyAddr, b.caFile)
		target := fmt.Sprintf("https://127.0.0.1:%d/api/explicit", up.Listener.Addr().(*net.TCPAddr).Port)
		before := upstreamHits.Load()
		out, err := sn.agent(t, env, "curl", "-sS", "--max-time", "20", target)
		if err != nil || out != "path=/api/explicit auth=Bearer [REDACTED]\n" {
			t.Fatalf("curl through the explicit proxy: %v\n%s", err, out)
		}
		if n := upstreamHits.Load() - before; n != 1 {
			t.Fatalf("the upstream received %d requests, want 1", n)
		}
	})

	t.Run("a second broker cannot read the same log group, and says so", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		// The same config but for the transparent listener's port, which the first broker
		// holds: the second must get as far as the log group.
		yml, err := os.ReadFile(filepath.Join(b.dir, "broker.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		second := filepath.Join(b.dir, "second.yaml")
		if err := os.WriteFile(second, []byte(strings.Replace(string(yml), `listen: "0.0.0.0:15001"`, `listen: "`+brokerSideIP+`:0"`, 1)), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(ctx, "ip", "netns", "exec", sn.brokerNS, brokerBin, "run", "--config", second)
		cmd.Env = []string{"PATH=" + agentPath, "CANARY_SECRET=" + canary}
		out, err := cmd.CombinedOutput()
		if err == nil || ctx.Err() != nil || !strings.Contains(string(out), "transparent.log_group") || !strings.Contains(string(out), "bound by another process") {
			t.Fatalf("a second broker on log group %d: %v\n%s", nflogGroup, err, out)
		}
	})

	t.Run("--remove takes the rules away", func(t *testing.T) {
		if out := rulesCmd("--remove"); !strings.Contains(out, "removed table inet capbroker") {
			t.Fatalf("--remove said %q", out)
		}
		if rs := ipCmd(t, "netns", "exec", sn.brokerNS, "nft", "list", "tables"); strings.Contains(rs, "capbroker") {
			t.Fatalf("the table is still there:\n%s", rs)
		}
		rulesCmd("--remove") // nothing to remove is not an error
		if got := probe(udpTargets[0]); got[udpTargets[0]] != "answered probe" {
			t.Fatalf("after --remove, %s: %q", udpTargets[0], got[udpTargets[0]])
		}
	})
	if text := strings.Join(b.auditLog.snapshot(), "\n") + b.logs.String(); strings.Contains(text, canary) {
		t.Error("the canary is in the broker's logs")
	}
	if t.Failed() {
		t.Logf("broker log:\n%s", b.logs.String())
	}
}

// TestNetnsTransparentRulesPodForm applies the pod form (--hook output, the Kubernetes init
// container's) in the agent's namespace, standing for a pod the agent shares with the broker,
// and checks: the agent's UDP leaves nowhere; its DNS, to any server and to a resolver on
// loopback (Docker's 127.0.0.11), lands at the broker's resolver port; its TCP lands at the
// transparent listener; the broker's user reaches the outside unchanged.
func TestNetnsTransparentRulesPodForm(t *testing.T) {
	sn := newSandboxNet(t)
	requireNft(t)
	const brokerUID = "4242"
	pod := sn.agentNS
	ipCmd(t, "-n", pod, "route", "add", "default", "via", brokerSideIP)
	// The outside, on the other end of the pod's link.
	outUDP := serveUDP(t, sn.brokerNS, brokerSideIP+":443", "")
	outTCP := serveTCP(t, sn.brokerNS, brokerSideIP+":0")
	// The broker's listeners in the pod, on loopback: its resolver and transparent listener
	// (stand-ins that answer and count).
	dns := serveUDP(t, pod, "127.0.0.1:0", "pod-dns")
	listener := serveTCP(t, pod, "127.0.0.1:0")

	out, err := exec.Command("ip", "netns", "exec", pod, brokerBin, "transparent", "rules", "--hook", "output",
		"--broker-uid", brokerUID, "--transparent-port", fmt.Sprint(listener.port()), "--dns-port", fmt.Sprint(dns.port()), "--apply").CombinedOutput()
	if err != nil {
		t.Fatalf("broker transparent rules --hook output --apply: %v\n%s", err, out)
	}
	probeAs := func(uid string, targets ...string) map[string]string {
		t.Helper()
		argv := append([]string{"netns", "exec", pod, "setpriv", "--reuid", uid, "--regid", uid, "--clear-groups",
			"python3", "-c", packetProbe}, targets...)
		cmd := exec.Command("ip", argv...)
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
	udpOut := "udp:" + brokerSideIP + ":443"
	tcpOut := fmt.Sprintf("tcp:%s:%d", brokerSideIP, outTCP.port())
	got := probeAs(agentUID, udpOut, "udp:"+brokerSideIP+":53", "udp:127.0.0.11:53", "udp:127.0.0.11:5353", tcpOut)
	// A packet refused as it leaves fails the send at once: EPERM.
	want := map[string]string{
		udpOut:                        "EPERM",
		"udp:" + brokerSideIP + ":53": "answered pod-dns",
		"udp:127.0.0.11:53":           "answered pod-dns",
		"udp:127.0.0.11:5353":         "EPERM",
		tcpOut:                        "connected",
	}
	for target, w := range want {
		if got[target] != w {
			t.Errorf("the agent's %s: %q, want %q", target, got[target], w)
		}
	}
	if n := outUDP.got.Load(); n != 0 {
		t.Errorf("the outside received %d of the agent's datagrams", n)
	}
	if n := outTCP.accepted.Load(); n != 0 {
		t.Errorf("the outside accepted %d of the agent's connections", n)
	}
	if n := listener.accepted.Load(); n != 1 {
		t.Errorf("the transparent listener accepted %d connections, want the agent's one", n)
	}

	got = probeAs(brokerUID, udpOut, tcpOut)
	if got[udpOut] != "answered probe" || got[tcpOut] != "connected" || outTCP.accepted.Load() != 1 {
		t.Errorf("the broker's user should reach the outside unchanged: %v (outside accepted %d)", got, outTCP.accepted.Load())
	}
}
