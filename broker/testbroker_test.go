package broker

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/certs"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/identity"
)

// testConfig is the embedded dev config, its agent's token in a file of the test's.
func testConfig(t testing.TB) *config.Config {
	t.Helper()
	cfg := config.Dev()
	cfg.Agents[0].TokenFile = filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(cfg.Agents[0].TokenFile, []byte("test-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// testBroker builds a broker from cfg (defaulted and validated here) and deps, with a
// throwaway CA and an audit log to nowhere where deps has none, and up as its upstream (deps.Log
// zero is a logger that writes nowhere). It returns the broker and a tunnel of the dev agent to https://host.
func testBroker(t testing.TB, cfg *config.Config, deps Deps, up upstreamClient, host string) (*Broker, *tunnel) {
	t.Helper()
	cfg.SetDefaults()
	if errs := cfg.Validate(); len(errs) > 0 {
		t.Fatal(errs)
	}
	if deps.CA == nil {
		deps.CA, _ = testCA(t)
	}
	if deps.Audit == nil {
		deps.Audit = audit.New(io.Discard)
		t.Cleanup(deps.Audit.Close)
	}
	br, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	br.setTransport(up)
	agent := identity.Agent{ID: "dev-agent", Labels: map[string]string{"env": "dev"}}
	return br, &tunnel{agent: agent, target: newTarget("https", host, 443), gen: br.gen.Load()}
}

// testCA is a throwaway CA, and the file of its certificate.
func testCA(t testing.TB) (*certs.CA, string) {
	t.Helper()
	dir := t.TempDir()
	if err := certs.WriteCA(dir, false); err != nil {
		t.Fatal(err)
	}
	ca, err := certs.LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	return ca, filepath.Join(dir, "ca.crt")
}
