package telemetry

import (
	"context"
	"encoding/hex"
	"net"
	"syscall"
	"testing"
	"time"

	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/scrub"
)

// BenchmarkExport is the telemetry of one traced request, end to end in this process: the six
// spans of the bench's request (root with the decision's attributes, identity, policy,
// credentials, upstream, scrub) and its audit record, recorded, queued, scrubbed and encoded
// (spanwire.go, logwire.go), and sent over gRPC to a receiver of the official OTLP
// services that discards each export undecoded. cpu-µs/op is the process's CPU time (rusage) per
// request, every goroutine included (the export's and the receiver's): steadier than ns/op on
// a shared machine.
func BenchmarkExport(b *testing.B) {
	addr := benchReceiver(b)
	cfg := &config.Telemetry{Endpoint: "http://" + addr, Signals: []string{config.SignalLogs, config.SignalTraces},
		ServiceName: "capbroker", Instance: "bench", QueueSize: 1 << 16, BatchSize: config.DefaultTelemetryBatch,
		BatchTimeout: time.Second, ExportTimeout: 10 * time.Second}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	r := scrub.New("sk-bench-0123456789abcdef0123456789abcdef", "[REDACTED]")
	reg := prometheus.NewRegistry()
	tel, err := New(cfg, Deps{Dial: dial, Scrubber: func() *scrub.Replacer { return r }, Registerer: reg})
	if err != nil {
		b.Fatal(err)
	}
	tr := tel.Tracer()
	line := []byte(`{"level":"info","request_id":"2f7a54d1103ac3f57c6795e9","agent":"bench-agent","source_ip":"127.0.0.1","phase":"request","method":"POST","scheme":"https","host":"127.0.0.1","port":40103,"path":"/v1/chat/completions","decision":"allow","reason":"LLM API","credentials":["openai"],"status":200,"bytes_in":88,"bytes_out":120,"duration_ms":1.574,"policy_revision":"9fb101edb710","decision_id":"e628a3ec-0776-4c93-bc6b-4c09c71ae80c","mode":"explicit","policy_mode":"enforce","instance":"vm","msg":"decision","time":"2026-12-06T02:01:25Z"}` + "\n")
	ev := audit.Event{RequestID: "2f7a54d1103ac3f57c6795e9", Agent: "bench-agent", Phase: "request", Decision: "allow",
		Reason: "LLM API", Credentials: []string{"openai"}, PolicyRevision: "9fb101edb710",
		DecisionID: "e628a3ec-0776-4c93-bc6b-4c09c71ae80c", Mode: "explicit", Method: "POST", Host: "127.0.0.1",
		Port: 40103, Path: "/v1/chat/completions", Status: 200}
	b.ReportAllocs()
	cpu0 := cpuTime()
	n := 0
	for b.Loop() {
		if n++; n%256 == 0 { // the export keeps up, as it does behind a broker's requests
			_ = tel.tracer.q.Flush(context.Background())
			_ = tel.logs.Flush(context.Background())
		}
		x := tr.Start()
		x.Root.Name, x.Root.Start = "capbroker.request", time.Now()
		for _, step := range []string{"identity", "policy", "credentials"} {
			x.Step(step).Finish()
		}
		x.Upstream = Span{ID: NewSpanID(), Name: "upstream", Start: time.Now()}
		x.Scrub = Span{ID: NewSpanID(), Name: "scrub", Start: time.Now()}
		x.Upstream.End, x.Scrub.End, x.Root.End = time.Now(), time.Now(), time.Now()
		e := ev
		e.TraceID, e.SpanID = hex.EncodeToString(x.TraceID[:]), hex.EncodeToString(x.Root.ID[:])
		x.Event = e
		tr.End(x)
		tel.Audit(&e, line)
	}
	if err := tel.Shutdown(context.Background()); err != nil { // what is queued is exported
		b.Fatal(err)
	}
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == "capbroker_telemetry_dropped_total" && m.GetCounter().GetValue() > 0 {
				b.Fatalf("dropped: %v", m)
			}
		}
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchReceiver serves the official OTLP trace and logs services on a loopback port, and
// discards each export without decoding it: the benchmark is of the broker's side.
func benchReceiver(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ForceServerCodec(discardCodec{}))
	coltrace.RegisterTraceServiceServer(srv, discardTraces{})
	collogs.RegisterLogsServiceServer(srv, discardLogs{})
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(srv.Stop)
	return ln.Addr().String()
}

type discardTraces struct {
	coltrace.UnimplementedTraceServiceServer
}

func (discardTraces) Export(context.Context, *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	return &coltrace.ExportTraceServiceResponse{}, nil
}

type discardLogs struct {
	collogs.UnimplementedLogsServiceServer
}

func (discardLogs) Export(context.Context, *collogs.ExportLogsServiceRequest) (*collogs.ExportLogsServiceResponse, error) {
	return &collogs.ExportLogsServiceResponse{}, nil
}

// discardCodec reads no request (the handlers get empty ones) and encodes the replies.
type discardCodec struct{}

func (discardCodec) Marshal(v any) ([]byte, error) { return proto.Marshal(v.(proto.Message)) }
func (discardCodec) Unmarshal([]byte, any) error   { return nil }
func (discardCodec) Name() string                  { return "proto" }
