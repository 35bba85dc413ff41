package broker

import (
	"encoding/json"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/internal/testkit"
	"net/netip"
	"strings"
	"testing"
)

func TestRefuseFlowAudit(t *testing.T) {
	var logs testkit.Buffer
	al := audit.New(&logs)
	b, _ := testBroker(t, testConfig(t), Deps{Policy: allowAll{}, Secrets: benchSecrets{}, Audit: al}, memoryUpstream{}, "example.com")
	b.RefuseFlow(Flow{
		Proto:  "udp",
		Source: netip.MustParseAddrPort("127.0.0.1:40000"),
		Dest:   netip.MustParseAddrPort("[::ffff:198.51.100.7]:443"),
	}, "UDP is not carried: QUIC clients fall back to TCP")
	al.Close() // flushes
	var ev map[string]any
	line := strings.TrimSpace(logs.String())
	if err := json.Unmarshal([]byte(line[strings.LastIndex(line, "\n")+1:]), &ev); err != nil {
		t.Fatalf("audit line: %v\n%s", err, line)
	}
	for k, want := range map[string]any{"decision": "deny", "mode": "transparent", "method": "UDP", "scheme": "udp",
		"host": "198.51.100.7", "port": float64(443), "source_ip": "127.0.0.1", "phase": "connect"} {
		if ev[k] != want {
			t.Errorf("%s = %v, want %v", k, ev[k], want)
		}
	}
}
