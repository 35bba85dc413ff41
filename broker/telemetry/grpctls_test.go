package telemetry

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpccreds "google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/scrub"
	"github.com/capbroker/capbroker/internal/testpki"
)

// tlsCollector is an OTLP/gRPC logs receiver over TLS that takes one bearer token and
// answers any other with Unauthenticated, as the collector's bearertokenauth does.
type tlsCollector struct {
	collogs.UnimplementedLogsServiceServer
	token string
	mu    sync.Mutex
	seen  []string // the authorization values it was sent
}

func (c *tlsCollector) Export(ctx context.Context, _ *collogs.ExportLogsServiceRequest) (*collogs.ExportLogsServiceResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	got := strings.Join(md.Get("authorization"), ",")
	c.mu.Lock()
	c.seen = append(c.seen, got)
	c.mu.Unlock()
	if got != "Bearer "+c.token {
		return nil, status.Error(codes.Unauthenticated, "invalid token")
	}
	return &collogs.ExportLogsServiceResponse{}, nil
}

// TestGRPCTLSWrongToken: over gRPC with TLS (https:// endpoint, the collector's CA in
// ca_file), a header token the collector refuses is a clear error from Probe that names the
// refusal and the setting to check, never the token, and Problem (the /readyz telemetry
// member) says the same until the collector takes an export again.
func TestGRPCTLSWrongToken(t *testing.T) {
	pki := testpki.New(t, "telemetry grpc tls CA")
	col := &tlsCollector{token: "right-token-5e1"}
	srv := grpc.NewServer(grpc.Creds(grpccreds.NewServerTLSFromCert(&pki.Leaf)))
	collogs.RegisterLogsServiceServer(srv, col)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)

	const wrong = "wrong-token-9c4"
	var token atomic.Value
	token.Store(wrong)
	cfg := &config.Telemetry{Endpoint: "https://" + ln.Addr().String(), Protocol: "grpc", CAFile: pki.File,
		Headers:     []config.TelemetryHeader{{Name: "Authorization", Value: "Bearer {{secret}}", Secret: &config.Source{}}},
		Signals:     []string{config.SignalLogs},
		ServiceName: "capbroker", QueueSize: 16, BatchSize: 8, BatchTimeout: 100 * time.Millisecond,
		ExportTimeout: 2 * time.Second, MetricsInterval: time.Minute}
	var dialer net.Dialer
	tel, err := New(cfg, Deps{
		Dial: dialer.DialContext,
		Secret: func(_ context.Context, name string) (string, error) {
			if name != config.TelemetryCredentialName(0) {
				t.Errorf("secret %q asked for", name)
			}
			return token.Load().(string), nil
		},
		Scrubber: func() *scrub.Replacer { return scrub.New(wrong, "[REDACTED]") },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tel.Shutdown(ctx)
	})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = tel.Probe(ctx)
	if err == nil {
		t.Fatal("Probe took a token the collector refuses")
	}
	const want = "refused the export's credentials (gRPC Unauthenticated): check telemetry.headers"
	if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Errorf("Probe: %v, want it to name the collector and %q", err, want)
	}
	if p := tel.Problem(); p != err.Error() {
		t.Errorf("Problem (the /readyz telemetry member) = %q, want %q", p, err.Error())
	}
	for _, s := range []string{err.Error(), tel.Problem()} {
		if strings.Contains(s, wrong) {
			t.Errorf("the token is in %q", s)
		}
	}
	col.mu.Lock()
	seen := append([]string(nil), col.seen...)
	col.mu.Unlock()
	if len(seen) == 0 || seen[0] != "Bearer "+wrong {
		t.Fatalf("the collector got %q over TLS, want the configured header", seen)
	}

	// The token is rotated in the store: the next export is taken and the problem clears.
	token.Store(col.token)
	if err := tel.Probe(ctx); err != nil {
		t.Fatalf("Probe with the right token: %v", err)
	}
	if p := tel.Problem(); p != "" {
		t.Errorf("Problem after an accepted export: %q", p)
	}
}
