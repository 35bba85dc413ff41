package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	colmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/capbroker/capbroker/internal/harness"
)

// The minimal OTLP sink: the bench's binary run with -otlp-sink ADDR, a gRPC server of the
// official OTLP collector services (go.opentelemetry.io/proto/otlp) that accepts each export
// and discards it. It decodes nothing: its codec counts an export's spans or log records by
// walking the wire format, so that it takes as little as it can of the cores it shares with
// the broker. Paired against the broker exporting to it, the broker's own cost of telemetry
// shows apart from a collector's (which decodes into its own model and encodes again). It
// prints its totals after every export ("otlp-sink: N spans, M records"), which the bench
// reads.

// serveOTLPSink serves the sink on addr until SIGTERM.
func serveOTLPSink(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	// A read buffer of 512 KiB, as the Collector's gRPC receivers have by default (configgrpc).
	srv := grpc.NewServer(grpc.ForceServerCodec(countingCodec{&otlpSink{}}), grpc.ReadBufferSize(512<<10))
	coltrace.RegisterTraceServiceServer(srv, sinkTraces{})
	collogs.RegisterLogsServiceServer(srv, sinkLogs{})
	colmetrics.RegisterMetricsServiceServer(srv, sinkMetrics{})
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-sig; srv.Stop() }()
	return srv.Serve(ln)
}

type otlpSink struct {
	mu             sync.Mutex // orders the printed totals
	spans, records int64
}

func (s *otlpSink) add(spans, records int) {
	s.mu.Lock()
	s.spans += int64(spans)
	s.records += int64(records)
	fmt.Printf("otlp-sink: %d spans, %d records\n", s.spans, s.records)
	s.mu.Unlock()
}

// countingCodec is the sink's codec. An export request is not decoded: its items are counted
// (ExportTraceServiceRequest and ExportLogsServiceRequest have the same shape: field 1 the
// resource's, its field 2 a scope's, its field 2 a span or a log record) and the handler gets
// an empty request. Answers are encoded as usual.
type countingCodec struct{ s *otlpSink }

func (c countingCodec) Unmarshal(b []byte, v any) error {
	n, err := countNested(b, 1, 2, 2)
	if err != nil {
		return err
	}
	switch v.(type) {
	case *coltrace.ExportTraceServiceRequest:
		c.s.add(n, 0)
	case *collogs.ExportLogsServiceRequest:
		c.s.add(0, n)
	}
	return nil
}

func (countingCodec) Marshal(v any) ([]byte, error) { return proto.Marshal(v.(proto.Message)) }
func (countingCodec) Name() string                  { return "proto" }

// countNested counts the length-delimited fields at path in the message b.
func countNested(b []byte, path ...protowire.Number) (int, error) {
	n := 0
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return 0, protowire.ParseError(l)
		}
		b = b[l:]
		if typ != protowire.BytesType || num != path[0] {
			if l = protowire.ConsumeFieldValue(num, typ, b); l < 0 {
				return 0, protowire.ParseError(l)
			}
			b = b[l:]
			continue
		}
		v, l := protowire.ConsumeBytes(b)
		if l < 0 {
			return 0, protowire.ParseError(l)
		}
		b = b[l:]
		if len(path) == 1 {
			n++
			continue
		}
		m, err := countNested(v, path[1:]...)
		if err != nil {
			return 0, err
		}
		n += m
	}
	return n, nil
}

type sinkTraces struct {
	coltrace.UnimplementedTraceServiceServer
}

func (sinkTraces) Export(context.Context, *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	return &coltrace.ExportTraceServiceResponse{}, nil
}

type sinkLogs struct {
	collogs.UnimplementedLogsServiceServer
}

func (sinkLogs) Export(context.Context, *collogs.ExportLogsServiceRequest) (*collogs.ExportLogsServiceResponse, error) {
	return &collogs.ExportLogsServiceResponse{}, nil
}

type sinkMetrics struct {
	colmetrics.UnimplementedMetricsServiceServer
}

func (sinkMetrics) Export(context.Context, *colmetrics.ExportMetricsServiceRequest) (*colmetrics.ExportMetricsServiceResponse, error) {
	return &colmetrics.ExportMetricsServiceResponse{}, nil
}

// sinkProcess is the sink as the bench runs it, with the totals it last printed.
type sinkProcess struct {
	*process
	spans, records atomic.Int64
}

var sinkLine = regexp.MustCompile(`^otlp-sink: (\d+) spans, (\d+) records$`)

// startOTLPSink runs this binary as the sink on a free loopback port, with GOMAXPROCS=1 as the
// collector, and GOGC=400: its garbage is the exports it drops, and the collections it would
// run at the default would take from the cores the broker uses what a collector elsewhere
// would not. Its CPU per event is printed apart.
func startOTLPSink() (*sinkProcess, string, error) {
	bin, err := os.Executable()
	if err != nil {
		return nil, "", err
	}
	addr, err := harness.FreeAddr()
	if err != nil {
		return nil, "", err
	}
	sp := &sinkProcess{}
	cmd := exec.Command(bin, "-otlp-sink", addr)
	cmd.Env = append(harness.Env(), "GOMAXPROCS=1", "GOGC=400")
	proc, err := startProcess(cmd, func(line string) {
		if m := sinkLine.FindStringSubmatch(line); m != nil {
			n, _ := strconv.ParseInt(m[1], 10, 64)
			r, _ := strconv.ParseInt(m[2], 10, 64)
			sp.spans.Store(n)
			sp.records.Store(r)
		}
	})
	if err != nil {
		return nil, "", err
	}
	if err := proc.waitListening(addr, 30*time.Second); err != nil {
		proc.stop()
		return nil, "", err
	}
	sp.process = proc
	return sp, addr, nil
}

// received is what the sink took since the totals spans0 and records0, read once they have
// stopped moving (its last lines may still be in the pipe when the broker has stopped).
func (s *sinkProcess) received(spans0, records0 int64) (spans, records int64) {
	spans, records = -1, -1
	for range 20 {
		n, r := s.spans.Load(), s.records.Load()
		if n == spans && r == records {
			break
		}
		spans, records = n, r
		time.Sleep(100 * time.Millisecond)
	}
	return spans - spans0, records - records0
}
