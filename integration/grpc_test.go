package integration

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// grpcPolicy is the test policy plus: the gRPC health service is allowed, with the canary.
const grpcPolicy = testPolicy + `
decision := {"allow": true, "credentials": ["canary"]} if {
	input.phase == "request"
	startswith(input.request.path, "/grpc.health.v1.Health/")
}
`

// echoHealth is a gRPC health service that echoes the Authorization metadata it received in
// a response header and a trailer, which the broker must scrub.
type echoHealth struct {
	grpc_health_v1.UnimplementedHealthServer
	mu    sync.Mutex
	auths []string
}

func (h *echoHealth) seen(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	auth := ""
	if v := md.Get("authorization"); len(v) == 1 {
		auth = v[0]
	}
	h.mu.Lock()
	h.auths = append(h.auths, auth)
	h.mu.Unlock()
	return auth
}

func (h *echoHealth) Check(ctx context.Context, req *grpc_health_v1.HealthCheckRequest) (*grpc_health_v1.HealthCheckResponse, error) {
	auth := h.seen(ctx)
	if req.Service == "missing" {
		// Nothing sent yet: a "trailers-only" response, the status in the one HEADERS frame.
		return nil, status.Error(codes.NotFound, "unknown service: missing")
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs("x-echo-auth", auth))
	_ = grpc.SetTrailer(ctx, metadata.Pairs("x-echo-auth-trailer", auth))
	return &grpc_health_v1.HealthCheckResponse{Status: grpc_health_v1.HealthCheckResponse_SERVING}, nil
}

// Watch sends two statuses, then ends with an error: the status travels in trailers after data.
func (h *echoHealth) Watch(req *grpc_health_v1.HealthCheckRequest, stream grpc.ServerStreamingServer[grpc_health_v1.HealthCheckResponse]) error {
	auth := h.seen(stream.Context())
	_ = stream.SetHeader(metadata.Pairs("x-echo-auth", auth))
	stream.SetTrailer(metadata.Pairs("x-echo-auth-trailer", auth))
	for _, s := range []grpc_health_v1.HealthCheckResponse_ServingStatus{grpc_health_v1.HealthCheckResponse_SERVING, grpc_health_v1.HealthCheckResponse_NOT_SERVING} {
		if err := stream.Send(&grpc_health_v1.HealthCheckResponse{Status: s}); err != nil {
			return err
		}
	}
	return status.Error(codes.NotFound, "watch ended: "+req.Service)
}

// TestGRPCThroughBroker: a gRPC client goes through the broker (CONNECT, TLS trusting the
// broker's CA, HTTP/2) to a TLS gRPC upstream with its own CA. Each call is decided, gets the
// credential, has the echoed secret scrubbed from headers and trailers, keeps its gRPC status,
// and is audited once.
func TestGRPCThroughBroker(t *testing.T) {
	e := newEnv(t, envOpts{policy: grpcPolicy})
	svc := &echoHealth{}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{e.pki.Leaf}})))
	grpc_health_v1.RegisterHealthServer(srv, svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)

	cc, err := grpc.NewClient("passthrough:///"+ln.Addr().String(),
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: e.broker.caPool(t)})),
		grpc.WithContextDialer(e.connectDialer()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	client := grpc_health_v1.NewHealthClient(cc)
	ctx := t.Context()
	var ids []string
	requestID := func(mds ...metadata.MD) string {
		for _, md := range mds {
			if v := md.Get("x-broker-request-id"); len(v) == 1 {
				ids = append(ids, v[0])
				return v[0]
			}
		}
		t.Fatalf("no x-broker-request-id in %v", mds)
		return ""
	}
	scrubbed := func(what string, md metadata.MD, key string) {
		t.Helper()
		if v := md.Get(key); len(v) != 1 || v[0] != "Bearer [REDACTED]" {
			t.Errorf("%s %s = %q, want the echoed credential scrubbed", what, key, v)
		}
	}

	// Unary, allowed.
	var hdr, trl metadata.MD
	resp, err := client.Check(ctx, &grpc_health_v1.HealthCheckRequest{}, grpc.Header(&hdr), grpc.Trailer(&trl))
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	if resp.Status != grpc_health_v1.HealthCheckResponse_SERVING {
		t.Errorf("Check status %v", resp.Status)
	}
	scrubbed("Check header", hdr, "x-echo-auth")
	scrubbed("Check trailer", trl, "x-echo-auth-trailer")
	requestID(hdr, trl)

	// Unary, a gRPC error in a trailers-only response.
	hdr, trl = nil, nil
	_, err = client.Check(ctx, &grpc_health_v1.HealthCheckRequest{Service: "missing"}, grpc.Header(&hdr), grpc.Trailer(&trl))
	if st, _ := status.FromError(err); st.Code() != codes.NotFound || st.Message() != "unknown service: missing" {
		t.Errorf("Check(missing) = %v, want NotFound with its message", err)
	}
	requestID(hdr, trl)

	// Server streaming: two messages, then an error status in the trailers.
	stream, err := client.Watch(ctx, &grpc_health_v1.HealthCheckRequest{Service: "svc"})
	if err != nil {
		t.Fatal(err)
	}
	var got []grpc_health_v1.HealthCheckResponse_ServingStatus
	for {
		m, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				t.Fatal("Watch ended without its error status")
			}
			if st, _ := status.FromError(err); st.Code() != codes.NotFound || st.Message() != "watch ended: svc" {
				t.Errorf("Watch ended with %v, want NotFound with its message", err)
			}
			break
		}
		got = append(got, m.Status)
	}
	if len(got) != 2 || got[0] != grpc_health_v1.HealthCheckResponse_SERVING || got[1] != grpc_health_v1.HealthCheckResponse_NOT_SERVING {
		t.Errorf("Watch messages %v", got)
	}
	whdr, _ := stream.Header()
	scrubbed("Watch header", whdr, "x-echo-auth")
	scrubbed("Watch trailer", stream.Trailer(), "x-echo-auth-trailer")
	requestID(whdr, stream.Trailer())

	svc.mu.Lock()
	auths := append([]string(nil), svc.auths...)
	svc.mu.Unlock()
	if len(auths) != 3 {
		t.Fatalf("upstream saw %d calls, want 3", len(auths))
	}
	for _, a := range auths {
		if a != "Bearer "+e.canary {
			t.Errorf("upstream did not receive the injected credential (got %d bytes)", len(a))
		}
	}
	for i, id := range ids {
		ev := e.broker.waitAudit(t, id)
		if ev["decision"] != "allow" || ev["status"] != float64(200) || ev["phase"] != "request" {
			t.Errorf("call %d audit event: %v", i, ev)
		}
		if creds, _ := ev["credentials"].([]any); len(creds) != 1 || creds[0] != "canary" {
			t.Errorf("call %d audit credentials: %v", i, ev["credentials"])
		}
	}
	if n := countPhase(e.broker.audit(t), "request"); n != 3 {
		t.Errorf("%d request events, want one per call (3)", n)
	}
	if n := countPhase(e.broker.audit(t), "connect"); n != 1 {
		t.Errorf("%d connect events: the client should use one tunnel", n)
	}
}
