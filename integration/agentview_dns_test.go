//go:build linux

package integration

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestAgentViewSandboxOwnNamesQuiet: the sandbox's lookups of its own host name (which it
// shares with the broker's machine in a network namespace), of a single-label name and of
// localhost names through the resolver are NXDOMAIN and leave no audit event, where a denied
// name is refused and audited.
func TestAgentViewSandboxOwnNamesQuiet(t *testing.T) {
	host, err := os.Hostname()
	if err != nil || host == "" {
		t.Skip("no host name")
	}
	sn := newSandboxNet(t)
	sn.resolvConf(t, "nameserver "+brokerSideIP, "options attempts:1 timeout:3")
	b := startBroker(t, brokerOpts{
		netns:  sn.brokerNS,
		listen: brokerSideIP + ":0",
		policy: dnsPolicy,
		config: `agents:
  - {id: sandbox-agent, addresses: ["` + agentSideIP + `/32"]}
transparent:
  dns: {listen: "` + brokerSideIP + `:53"}
`,
	})
	b.logs.wait(t, `"message":"resolver listening"`)
	env := []string{"PATH=" + agentPath, "HOME=" + sn.agentDir, "LANG=C.UTF-8"}
	own := []string{strings.ToLower(host), "sandbox-" + randHex(4), "db.localhost"}
	for _, name := range own {
		for _, qtype := range []string{"A", "AAAA"} {
			out, err := sn.agent(t, env, "python3", "-c", dnsQueryProbe, "ask", name, qtype)
			var r dnsReply
			if err != nil || json.Unmarshal([]byte(out), &r) != nil || !r.IDOK || r.Rcode != float64(3) || r.Answers != 0 || r.EDE != "" {
				t.Errorf("%s %s: %v %s", name, qtype, err, out)
			}
		}
	}
	// The sandbox's own lookups through its stub resolver, as hostname -f and sudo make them.
	if out, err := sn.agent(t, env, "getent", "ahosts", own[0]); err == nil && strings.Contains(out, "198.1") {
		t.Errorf("getent ahosts %s resolved to a pool address:\n%s", own[0], out)
	}
	denied := "exfil-" + randHex(4) + ".example.invalid"
	if out, err := sn.agent(t, env, "python3", "-c", dnsQueryProbe, "ask", denied, "A"); err != nil || !strings.Contains(out, `"rcode": 5`) {
		t.Fatalf("a denied name: %v %s", err, out)
	}
	// Events are written in order: once the denied name's is there, any of the others would be.
	b.waitAuditWhere(t, 1, "the denied name's event", func(ev auditEvent) bool { return ev["host"] == denied && ev["decision"] == "deny" })
	for _, ev := range b.audit(t) {
		for _, name := range own {
			if ev["phase"] == "dns" && ev["host"] == name {
				t.Errorf("the sandbox's own name was audited: %v", ev)
			}
		}
	}
}
