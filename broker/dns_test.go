package broker

import (
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/policy"
	sandboxdns "github.com/capbroker/capbroker/broker/transparent/dns"
	"github.com/capbroker/capbroker/internal/testkit"
)

// portPolicy allows CONNECTs to web.example on port 80 only, and asks about ask.example; it
// records its inputs.
type portPolicy struct {
	mu     sync.Mutex
	inputs []policy.Input
}

func (p *portPolicy) Decide(_ context.Context, in *policy.Input) (policy.Decision, error) {
	p.mu.Lock()
	p.inputs = append(p.inputs, *in)
	p.mu.Unlock()
	switch {
	case in.Host == "web.example" && in.Port == 80:
		return policy.Decision{Allow: true, Intercept: true, ID: "dec-web", Revision: "r1"}, nil
	case in.Host == "ask.example":
		return policy.Decision{Ask: &policy.Ask{Reason: "ask"}, ID: "dec-ask", Revision: "r1"}, nil
	}
	return policy.Decision{Reason: "not for " + in.Host, ID: "dec-deny", Revision: "r1"}, nil
}

func TestResolverPolicy(t *testing.T) {
	var logs testkit.Buffer
	al := audit.New(&logs)
	cfg := testConfig(t)
	cfg.Agents = append(cfg.Agents, config.Agent{ID: "sidecar", Addresses: []string{"10.250.0.2/32"}, Labels: map[string]string{"team": "x"}})
	cfg.Transparent.DNS.Listen = "127.0.0.1:0"
	adminToken(cfg)
	pol := &portPolicy{}
	b, _ := testBroker(t, cfg, Deps{Policy: pol, Secrets: benchSecrets{}, Audit: al}, memoryUpstream{}, "example.com")
	rp := resolverPolicy{b: b}
	agentAddr := netip.MustParseAddr("10.250.0.2")

	v := rp.Decide(context.Background(), sandboxdns.Query{Source: agentAddr, Name: "web.example", Type: "A"})
	if !v.Allow || v.Agent != "sidecar" || v.DecisionID != "dec-web" {
		t.Fatalf("web.example: %+v", v)
	}
	// Port 80 is the first of transparent.ports' defaults: one decision was enough.
	if len(pol.inputs) != 1 {
		t.Fatalf("%d decisions", len(pol.inputs))
	}
	in := pol.inputs[0]
	if in.Phase != policy.PhaseConnect || in.Mode != audit.ModeTransparent || in.Method != "CONNECT" || in.Port != 80 ||
		in.AgentID != "sidecar" || in.Labels["team"] != "x" || in.SourceIP != "10.250.0.2" {
		t.Fatalf("policy input %+v", in)
	}
	if v := rp.Decide(context.Background(), sandboxdns.Query{Source: agentAddr, Name: "ask.example", Type: "AAAA"}); !v.Allow {
		t.Fatalf("an ask should be answered: %+v", v)
	}
	pol.inputs = nil
	v = rp.Decide(context.Background(), sandboxdns.Query{Source: agentAddr, Name: "evil.example", Type: "TXT"})
	if v.Allow || v.Reason != "not for evil.example" || len(pol.inputs) != 2 || pol.inputs[1].Port != 443 {
		t.Fatalf("evil.example: %+v after %d decisions", v, len(pol.inputs))
	}
	if v := rp.Decide(context.Background(), sandboxdns.Query{Source: netip.MustParseAddr("10.250.0.9"), Name: "web.example"}); v.Allow || v.Agent != "" || v.Reason != ReasonNoAgentAddress {
		t.Fatalf("unknown source: %+v", v)
	}

	// Monitor mode answers a denied name and marks it.
	cfg2 := *cfg
	cfg2.Policy.Mode = config.ModeMonitor
	if err := b.Reload(&cfg2, benchSecrets{}); err != nil {
		t.Fatal(err)
	}
	if v := rp.Decide(context.Background(), sandboxdns.Query{Source: agentAddr, Name: "evil.example"}); !v.Allow || !v.WouldDeny {
		t.Fatalf("monitor mode: %+v", v)
	}

	rp.Audit(sandboxdns.Event{Query: sandboxdns.Query{Source: agentAddr, Name: "evil.example", Type: "TXT", Proto: "udp"},
		Verdict: sandboxdns.Verdict{Reason: "over the rate: 7 queries refused"}, Count: 7})
	al.Close()
	var ev map[string]any
	line := strings.TrimSpace(logs.String())
	if err := json.Unmarshal([]byte(line[strings.LastIndex(line, "\n")+1:]), &ev); err != nil {
		t.Fatalf("audit line: %v\n%s", err, line)
	}
	for k, want := range map[string]any{"decision": "deny", "mode": "transparent", "method": "TXT", "scheme": "dns",
		"host": "evil.example", "port": float64(53), "source_ip": "10.250.0.2", "phase": "dns", "agent": "sidecar",
		"reason": "over the rate: 7 queries refused", "policy_mode": "monitor"} {
		if ev[k] != want {
			t.Errorf("%s = %v, want %v", k, ev[k], want)
		}
	}
}

// BenchmarkResolverDecide is the broker's side of one query with a real Rego policy: an
// allowed name (decided on the first port) and a denied one (decided on each port).
func BenchmarkResolverDecide(b *testing.B) {
	e, err := policy.New(context.Background(), fstest.MapFS{"p.rego": {Data: []byte(`package broker

default decision := {"allow": false, "reason": "not on the allow-list"}

decision := {"allow": true} if {
	input.phase == "connect"
	input.source.mode == "transparent"
	input.request.host in {"api.example.com", "registry.npmjs.org"}
}
`)}})
	if err != nil {
		b.Fatal(err)
	}
	cfg := testConfig(b)
	cfg.Agents = append(cfg.Agents, config.Agent{ID: "sidecar", Addresses: []string{"10.250.0.2/32"}})
	cfg.Transparent.DNS.Listen = "127.0.0.1:0"
	adminToken(cfg)
	br, _ := testBroker(b, cfg, Deps{Policy: e, Secrets: benchSecrets{}}, memoryUpstream{}, "example.com")
	rp := resolverPolicy{b: br}
	for name, want := range map[string]bool{"api.example.com": true, "evil.example": false} {
		b.Run(map[bool]string{true: "allowed", false: "denied"}[want], func(b *testing.B) {
			q := sandboxdns.Query{Source: netip.MustParseAddr("10.250.0.2"), Name: name, Type: "A"}
			for b.Loop() {
				if v := rp.Decide(context.Background(), q); v.Allow != want {
					b.Fatalf("%+v", v)
				}
			}
		})
	}
}
