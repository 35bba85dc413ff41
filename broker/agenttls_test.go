package broker

import (
	"crypto/tls"
	"net"
	"slices"
	"testing"

	"github.com/capbroker/capbroker/broker/config"
)

// TestAgentCurves: tls.agent_curves is the agent-facing handshake's key exchanges: with
// [X25519] a client offering both gets X25519 and one offering only the hybrid post-quantum
// exchange is refused; by default the hybrid is chosen.
func TestAgentCurves(t *testing.T) {
	for _, c := range []struct {
		name   string
		curves []string
		offer  []tls.CurveID
		want   tls.CurveID // 0: the handshake fails
	}{
		{"default, both offered", nil, nil, tls.X25519MLKEM768},
		{"X25519, both offered", []string{"X25519"}, nil, tls.X25519},
		{"X25519, hybrid alone offered", []string{"X25519"}, []tls.CurveID{tls.X25519MLKEM768}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.TLS = config.AgentTLS{AgentCurves: c.curves}
			br, _ := testBroker(t, cfg, Deps{Policy: allowAll{}, Secrets: benchSecrets{}}, memoryUpstream{}, "api.example.com")
			if got := br.mitmTLS.CurvePreferences; !slices.Equal(got, cfg.TLS.Curves()) {
				t.Fatalf("the agent-facing config's curves are %v", got)
			}
			cert, err := br.certs.Get("api.example.com")
			if err != nil {
				t.Fatal(err)
			}
			srvCfg := br.mitmTLS.Clone()
			srvCfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert, nil }
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			srv := tls.Server(a, srvCfg)
			errc := make(chan error, 1)
			go func() { errc <- srv.Handshake(); a.Close() }()
			cl := tls.Client(b, &tls.Config{InsecureSkipVerify: true, CurvePreferences: c.offer, MinVersion: tls.VersionTLS13})
			cerr := cl.Handshake()
			serr := <-errc
			if c.want == 0 {
				if cerr == nil && serr == nil {
					t.Fatalf("handshake succeeded with %v", cl.ConnectionState().CurveID)
				}
				return
			}
			if cerr != nil || serr != nil {
				t.Fatalf("handshake: client %v, server %v", cerr, serr)
			}
			if got := cl.ConnectionState().CurveID; got != c.want {
				t.Fatalf("key exchange %v, want %v", got, c.want)
			}
		})
	}
}
