//go:build linux

package integration

import (
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// dnsPolicy lets the agent reach api.allowed.test and any name under cdn.allowed.test, and
// only through a redirected connection.
const dnsPolicy = `package broker

default decision := {"allow": false, "reason": "not on the resolver test's allow-list"}

decision := {"allow": true, "intercept": true} if {
	input.phase == "connect"
	input.source.mode == "transparent"
	input.request.host == "api.allowed.test"
}

decision := {"allow": true, "intercept": true} if {
	input.phase == "connect"
	input.source.mode == "transparent"
	endswith(input.request.host, ".cdn.allowed.test")
}
`

// dnsQueryProbe sends DNS queries over UDP to the first name server of /etc/resolv.conf, as
// a tunnelling client would (a standard library resolver cannot send TXT queries):
//
//	burst N DOMAIN TYPE  N queries, each for a name of three random 60-character labels under
//	                     DOMAIN, one after another; prints one JSON line per query:
//	                     {"rcode", "answers", "ede"}
//	ask NAME TYPE [SERVER]  one query for NAME (to SERVER, a hard-coded name server, if
//	                     given), printed the same way, with "addrs": the A/AAAA answers
//
// Every query carries an EDNS OPT record, so refusals come with their EDE text.
const dnsQueryProbe = `import json, os, random, socket, string, struct, sys
server = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
if sys.argv[1] == "ask" and len(sys.argv) > 4:
    server = sys.argv[4]
TYPES = {"A": 1, "NULL": 10, "TXT": 16, "AAAA": 28}
def query(name, qtype):
    qid = random.randrange(65536)
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 1)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    q += b"\x00" + struct.pack(">HH", TYPES[qtype], 1)
    q += b"\x00" + struct.pack(">HHIH", 41, 1232, 0, 0)  # OPT
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    try:
        s.sendto(q, (server, 53))
        r = s.recv(4096)
    except socket.timeout:
        return {"rcode": "timeout"}
    finally:
        s.close()
    rid, flags, qd, an, ns, ar = struct.unpack(">HHHHHH", r[:12])
    out = {"id_ok": rid == qid, "rcode": flags & 0xF, "answers": an + ns, "ede": None, "addrs": []}
    off = 12
    def skip_name(off):
        while True:
            n = r[off]
            if n == 0: return off + 1
            if n >= 0xC0: return off + 2
            off += 1 + n
    for _ in range(qd):
        off = skip_name(off) + 4
    for _ in range(an + ns + ar):
        off = skip_name(off)
        rtype, _, _, rdlen = struct.unpack(">HHIH", r[off:off+10])
        off += 10
        if rtype in (1, 28):
            out["addrs"].append(socket.inet_ntop(socket.AF_INET if rtype == 1 else socket.AF_INET6, r[off:off+rdlen]))
        if rtype == 41:
            o = off
            while o < off + rdlen:
                code, olen = struct.unpack(">HH", r[o:o+4])
                if code == 15:
                    out["ede"] = r[o+6:o+4+olen].decode()
                o += 4 + olen
        off += rdlen
    return out
def label():
    return "".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(60))
if sys.argv[1] == "burst":
    for _ in range(int(sys.argv[2])):
        print(json.dumps(query(".".join([label(), label(), label(), sys.argv[3]]), sys.argv[4])))
else:
    print(json.dumps(query(sys.argv[2], sys.argv[3])))
`

type dnsReply struct {
	IDOK    bool     `json:"id_ok"`
	Rcode   any      `json:"rcode"` // a number, or "timeout"
	Answers int      `json:"answers"`
	EDE     string   `json:"ede"`
	Addrs   []string `json:"addrs"`
}

// TestTransparentDNS runs the broker's resolver in the sandbox topology, the agent's
// resolv.conf naming it: an allowed name resolves to a pool address, a denied one fails and
// is audited, and a DNS tunnel's burst of unique long names is refused, audited, and bounded
// by the rate. The broker's own namespace has a name server of its own, which must never
// hear a query: the resolver forwards nothing.
func TestTransparentDNS(t *testing.T) {
	sn := newSandboxNet(t)
	sn.resolvConf(t, "nameserver "+brokerSideIP, "options attempts:1 timeout:3")
	// The broker's namespace gets a resolv.conf naming a name server in it that counts what
	// it hears.
	brokerEtc := filepath.Join("/etc/netns", sn.brokerNS)
	if err := os.MkdirAll(brokerEtc, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(brokerEtc) })
	if err := os.WriteFile(filepath.Join(brokerEtc, "resolv.conf"), []byte("nameserver 127.0.0.53\noptions attempts:1 timeout:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var forwarded atomic.Int64
	heard := make(chan struct{}, 100)
	spy := listenUDPInNetns(t, sn.brokerNS, "127.0.0.53:53")
	go func() {
		buf := make([]byte, 65536)
		for {
			if _, _, err := spy.ReadFrom(buf); err != nil {
				return
			}
			forwarded.Add(1)
			select {
			case heard <- struct{}{}:
			default:
			}
		}
	}()

	const qps = 5 // bursts of 10
	b := startBroker(t, brokerOpts{
		netns:  sn.brokerNS,
		listen: brokerSideIP + ":0",
		policy: dnsPolicy,
		mode:   "enforce",
		config: `agents:
  - {id: sandbox-agent, addresses: ["` + agentSideIP + `/32"]}
transparent:
  dns: {listen: "` + brokerSideIP + `:53", queries_per_second: ` + strconv.Itoa(qps) + `}
`,
	})
	b.logs.wait(t, `"message":"resolver listening"`)
	env := []string{"PATH=" + agentPath, "HOME=" + sn.agentDir, "LANG=C.UTF-8"} // no proxy settings at all
	pools := []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("fd00:cb::/64")}
	inPool := func(s string) bool {
		a, err := netip.ParseAddr(s)
		return err == nil && (pools[0].Contains(a) || pools[1].Contains(a))
	}

	t.Run("an allowed name resolves to pool addresses", func(t *testing.T) {
		out, err := sn.agent(t, env, "getent", "ahostsv4", "api.allowed.test")
		if err != nil {
			t.Fatalf("getent: %v\n%s", err, out)
		}
		fields := strings.Fields(out)
		if len(fields) == 0 || !inPool(fields[0]) || !pools[0].Contains(netip.MustParseAddr(fields[0])) {
			t.Fatalf("getent ahostsv4 api.allowed.test:\n%s", out)
		}
		out, err = sn.agent(t, env, "python3", "-c", `import socket, sys
print(" ".join(sorted({a[4][0] for a in socket.getaddrinfo(sys.argv[1], 443, proto=socket.IPPROTO_TCP)})))`, "api.allowed.test")
		if err != nil {
			t.Fatalf("getaddrinfo: %v\n%s", err, out)
		}
		addrs := strings.Fields(out)
		if len(addrs) != 2 || !inPool(addrs[0]) || !inPool(addrs[1]) || addrs[0] == addrs[1] {
			t.Fatalf("getaddrinfo api.allowed.test gave %q, want one pool address of each family", out)
		}
		if !strings.Contains(strings.Join(addrs, " "), fields[0]) {
			t.Fatalf("getent and getaddrinfo disagree: %s vs %s", fields[0], out)
		}
		evs := b.waitAuditWhere(t, 1, "the answer's audit event", func(ev auditEvent) bool {
			return ev["phase"] == "dns" && ev["host"] == "api.allowed.test"
		})
		ev := evs[0]
		if ev["decision"] != "allow" || ev["agent"] != "sandbox-agent" || ev["mode"] != "transparent" || ev["scheme"] != "dns" ||
			ev["port"] != float64(53) || ev["source_ip"] != agentSideIP || ev["policy_mode"] != "enforce" {
			t.Fatalf("audit event %v", ev)
		}
	})

	t.Run("a denied name fails and is audited", func(t *testing.T) {
		name := "exfil-" + randHex(4) + ".example.invalid"
		if out, err := sn.agent(t, env, "getent", "ahosts", name); err == nil {
			t.Fatalf("getent resolved a denied name:\n%s", out)
		}
		out, err := sn.agent(t, env, "python3", "-c", dnsQueryProbe, "ask", name, "A")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		var r dnsReply
		if err := json.Unmarshal([]byte(out), &r); err != nil || !r.IDOK || r.Rcode != float64(5) || r.Answers != 0 ||
			r.EDE != "not on the resolver test's allow-list" {
			t.Fatalf("a denied name over UDP with EDNS: %s", out)
		}
		evs := b.waitAuditWhere(t, 2, "the refusals of "+name, func(ev auditEvent) bool {
			return ev["phase"] == "dns" && ev["host"] == name
		})
		for _, ev := range evs {
			if ev["decision"] != "deny" || ev["agent"] != "sandbox-agent" || ev["reason"] != "not on the resolver test's allow-list" ||
				ev["mode"] != "transparent" || ev["port"] != float64(53) {
				t.Fatalf("audit event %v", ev)
			}
		}
	})

	var rateRefused int
	t.Run("a tunnel's burst of unique names is refused and bounded", func(t *testing.T) {
		const n = 100
		for i, c := range []struct{ domain, qtype string }{{"t.exfil.example.invalid", "TXT"}, {"cdn.allowed.test", "NULL"}} {
			out, err := sn.agent(t, env, "python3", "-c", dnsQueryProbe, "burst", strconv.Itoa(n), c.domain, c.qtype)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != n {
				t.Fatalf("%d replies to %d queries:\n%s", len(lines), n, out)
			}
			var policyRefused, overRate, noData int
			for _, line := range lines {
				var r dnsReply
				if err := json.Unmarshal([]byte(line), &r); err != nil || !r.IDOK || r.Answers != 0 {
					t.Fatalf("reply %s", line)
				}
				switch {
				case r.Rcode == float64(5) && strings.Contains(r.EDE, "rate bound of 5 queries per second"):
					overRate++
				case r.Rcode == float64(5) && r.EDE == "not on the resolver test's allow-list":
					policyRefused++
				case r.Rcode == float64(0) && r.EDE == "": // an allowed name: NOERROR, and no data
					noData++
				default:
					t.Fatalf("reply %s", line)
				}
			}
			// The burst took at most a few seconds: the policy saw no more than the burst
			// allowance and the refill, everything else was refused by the rate bound. The
			// first burst starts with a full bucket, so some of it reaches the policy; the
			// second may find the bucket still empty (how much refilled depends on how long
			// the first took), so only the kind of its answers is checked.
			rateRefused += overRate
			allowedDomain := strings.HasSuffix(c.domain, ".allowed.test")
			first := i == 0
			if overRate < n/2 || (allowedDomain && policyRefused > 0) || (!allowedDomain && noData > 0) ||
				(first && policyRefused+noData == 0) {
				t.Fatalf("%s: %d over the rate, %d refused by the policy, %d no data", c.domain, overRate, policyRefused, noData)
			}
			t.Logf("%s %s: %d refused over the rate, %d by the policy, %d no data", c.domain, c.qtype, overRate, policyRefused, noData)
		}
	})

	// Stopping the broker audits the summaries still pending; then the log is complete.
	if err := b.stop(t); err != nil {
		t.Fatalf("broker exit: %v\n%s", err, b.logs.String())
	}
	countRe := regexp.MustCompile(`: (\d+) quer(y|ies) refused$`)
	summarised := 0
	for _, ev := range b.audit(t) {
		reason, _ := ev["reason"].(string)
		if ev["phase"] != "dns" || !strings.Contains(reason, "rate bound") {
			continue
		}
		m := countRe.FindStringSubmatch(reason)
		if m == nil || ev["decision"] != "deny" || ev["agent"] != "sandbox-agent" || ev["mode"] != "transparent" {
			t.Fatalf("summary event %v", ev)
		}
		k, _ := strconv.Atoi(m[1])
		summarised += k
	}
	if summarised != rateRefused || rateRefused == 0 {
		t.Fatalf("the audit log summarises %d over-rate refusals, the agent saw %d", summarised, rateRefused)
	}
	if got := forwarded.Load(); got != 0 {
		t.Fatalf("the broker's namespace name server heard %d queries: the resolver forwarded", got)
	}
	// The spy does hear a lookup made in the broker's namespace.
	_ = exec.Command("ip", "netns", "exec", sn.brokerNS, "getent", "hosts", "spy-check.example.invalid").Run()
	select {
	case <-heard:
	case <-time.After(waitTimeout):
		t.Fatal("the broker namespace's name server heard nothing of a lookup made there: the check above proves nothing")
	}
}

// listenUDPInNetns opens a UDP socket inside namespace ns (see listenInBroker).
func listenUDPInNetns(t *testing.T, ns, addr string) net.PacketConn {
	t.Helper()
	var (
		pc  net.PacketConn
		err error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		f, openErr := os.Open(filepath.Join("/run/netns", ns))
		if openErr != nil {
			err = openErr
			return
		}
		defer f.Close()
		if err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			return
		}
		pc, err = net.ListenPacket("udp", addr)
	}()
	<-done
	if err != nil {
		t.Fatalf("listening in %s: %v", ns, err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc
}
