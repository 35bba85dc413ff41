package broker

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/broker/upstream"
	"github.com/capbroker/capbroker/credentials"
)

// setTransport makes the broker's current generation send upstream through t. Tests only,
// before serving: it changes the generation in place.
func (b *Broker) setTransport(t upstreamClient) {
	b.gen.Load().transport = t
}

// fixedSecrets gives every credential one value.
type fixedSecrets struct{ val string }

func (s *fixedSecrets) Get(context.Context, string) (credentials.Secret, error) {
	return credentials.NewSecret(s.val), nil
}

// gatedDecider holds the first request-phase decision until release is closed: the exchange
// has begun, and has not yet read a credential.
type gatedDecider struct {
	Decider
	first            atomic.Bool
	entered, release chan struct{}
}

func (d *gatedDecider) Decide(ctx context.Context, in *policy.Input) (policy.Decision, error) {
	if d.first.CompareAndSwap(false, true) {
		close(d.entered)
		<-d.release
	}
	return d.Decider.Decide(ctx, in)
}

func (s *fixedSecrets) Known(string) []credentials.Secret {
	return []credentials.Secret{credentials.NewSecret(s.val)}
}

// authRecorder is an upstream that records the Authorization header of every request.
type authRecorder struct {
	memoryUpstream
	mu   sync.Mutex
	seen []string
}

func (u *authRecorder) RoundTrip(r *http.Request, pool upstream.Pool) (*http.Response, error) {
	u.mu.Lock()
	u.seen = append(u.seen, r.Header.Get("Authorization"))
	u.mu.Unlock()
	return u.memoryUpstream.RoundTrip(r, pool)
}

func reloadConfig(t *testing.T, token, mode string) *config.Config {
	t.Helper()
	cfg := config.Dev()
	cfg.Policy.Mode = mode
	cfg.Agents[0].TokenFile = filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(cfg.Agents[0].TokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestReloadGenerations: a request that began before a reload finishes with the credential
// store it began with; requests after it get the new store and mode; a tunnel opened with a
// token the reload replaced serves no more requests; a config whose agents cannot be built is
// refused and the running one stays.
func TestReloadGenerations(t *testing.T) {
	br, tun := benchBroker(t, true)
	tun.proxyAuth = "Basic " + base64.StdEncoding.EncodeToString([]byte("dev-agent:bench-token"))
	oldSecrets := &fixedSecrets{val: "sk-old-0123456789"}
	gate := &gatedDecider{Decider: br.policy, entered: make(chan struct{}), release: make(chan struct{})}
	br.policy = gate
	if err := br.Reload(reloadConfig(t, "bench-token", config.ModeEnforce), oldSecrets); err != nil {
		t.Fatal(err)
	}
	tun.gen = br.gen.Load() // as if the CONNECT came now
	up := &authRecorder{}
	br.setTransport(up)

	// A request in flight: it has begun, and is being decided.
	inflight := make(chan int)
	go func() {
		w := httptest.NewRecorder()
		br.serveTunnel(w, chatRequest(), tun)
		inflight <- w.Code
	}()
	<-gate.entered

	newSecrets := &fixedSecrets{val: "sk-new-0123456789"}
	if err := br.Reload(reloadConfig(t, "bench-token", config.ModeMonitor), newSecrets); err != nil {
		t.Fatal(err)
	}
	if g := br.gen.Load(); g.mode != config.ModeMonitor || g.secrets != Secrets(newSecrets) || g.transport != upstreamClient(up) {
		t.Fatalf("after reload: mode %q, secrets %T, transport kept %v", g.mode, g.secrets, g.transport == upstreamClient(up))
	}
	w := httptest.NewRecorder()
	br.serveTunnel(w, chatRequest(), tun) // same token: the open tunnel keeps working
	if w.Code != http.StatusOK {
		t.Fatalf("request after reload: %d %s", w.Code, w.Body)
	}
	close(gate.release)
	if code := <-inflight; code != http.StatusOK {
		t.Fatalf("request in flight: %d", code)
	}
	up.mu.Lock()
	seen := strings.Join(up.seen, ",")
	up.mu.Unlock()
	if seen != "Bearer sk-new-0123456789,Bearer sk-old-0123456789" {
		t.Fatalf("credentials sent upstream, in order: %s", seen)
	}

	// A config whose agent token cannot be read is refused; the running one stays.
	bad := reloadConfig(t, "x", config.ModeEnforce)
	bad.Agents[0].TokenFile = filepath.Join(t.TempDir(), "missing")
	before := br.gen.Load()
	if err := br.Reload(bad, newSecrets); err == nil || !strings.Contains(err.Error(), "agents[0].token_file") {
		t.Fatalf("bad config: %v", err)
	}
	if br.gen.Load() != before {
		t.Fatal("a refused config replaced the running one")
	}

	// The agent's token changes: the tunnel opened with the old one is refused.
	if err := br.Reload(reloadConfig(t, "rotated-token", config.ModeEnforce), newSecrets); err != nil {
		t.Fatal(err)
	}
	w = httptest.NewRecorder()
	br.serveTunnel(w, chatRequest(), tun)
	if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "connect again") {
		t.Fatalf("old tunnel after the token changed: %d %s", w.Code, w.Body)
	}
}

// TestReloadLimits: new per-agent request limits apply at once.
func TestReloadLimits(t *testing.T) {
	br, _ := benchBroker(t, false)
	cfg := reloadConfig(t, "bench-token", config.ModeEnforce)
	cfg.Proxy.MaxRequestsPerAgent = 1
	if err := br.Reload(cfg, &fixedSecrets{val: "v-0123456789"}); err != nil {
		t.Fatal(err)
	}
	if err := br.admission.request("a"); err != nil {
		t.Fatal(err)
	}
	if err := br.admission.request("a"); err == nil {
		t.Fatal("second request admitted over a limit of 1")
	}
}
