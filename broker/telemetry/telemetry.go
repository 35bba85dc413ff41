// Package telemetry exports what the broker does over OpenTelemetry (OTLP, gRPC or HTTP):
// each audit event as a log record whose body is the audit line as written (whatever
// audit.format), a span tree per request (the broker records it in a Trace; this package
// provides the Tracer), both encoded to OTLP protobuf here on the export goroutines
// (spanwire.go, logwire.go: the SDK's record and span objects cost the request path too much),
// and the Prometheus families as OTLP metrics with the official Go SDK. Export never
// holds a request: records and spans go into bounded queues, and what does not fit, or
// cannot be delivered, is dropped and counted (capbroker_telemetry_dropped_total). Every
// exported string is scrubbed of every secret the broker knows (scrub.go).
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	promBridge "go.opentelemetry.io/contrib/bridges/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/prometheus/client_golang/prometheus"
	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/scrub"
	"github.com/capbroker/capbroker/internal/svcdial"
)

// Deps are what the exporters need from the rest of the broker.
type Deps struct {
	// Dial connects to the collector (upstream.Dialer.DialService: upstream.proxy applies).
	Dial svcdial.Func
	// Secret reads a header's secret from the credential store by its name
	// (config.TelemetryCredentialName).
	Secret func(ctx context.Context, name string) (string, error)
	// Scrubber returns the Replacer of every secret known now (inject.Known.Everything).
	Scrubber func() *scrub.Replacer
	// Gatherer is read for the metrics signal (the broker's Prometheus registry).
	Gatherer prometheus.Gatherer
	// Registerer gets the telemetry's own counters (dropped and exported).
	Registerer prometheus.Registerer
	// Version is the broker's, for service.version.
	Version string
}

// Telemetry is the running export. Its methods are safe for concurrent use, and on a nil
// *Telemetry do nothing.
type Telemetry struct {
	conn     *conn
	tracer   *Tracer
	logs     *queue[encoded]
	mp       *sdkmetric.MeterProvider
	scrubber func() *scrub.Replacer

	dropped  *prometheus.CounterVec
	exported *prometheus.CounterVec
}

// New starts the export cfg describes. Nothing is dialled until the first export (or Probe).
func New(cfg *config.Telemetry, d Deps) (*Telemetry, error) {
	if cfg == nil {
		return nil, nil
	}
	if d.Scrubber == nil {
		return nil, errors.New("telemetry: a scrubber is required")
	}
	if d.Secret == nil {
		d.Secret = func(context.Context, string) (string, error) { return "", errors.New("no credential store") }
	}
	c, err := newConn(cfg, d.Dial, d.Secret)
	if err != nil {
		return nil, err
	}
	t := &Telemetry{conn: c, scrubber: d.Scrubber,
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capbroker_telemetry_dropped_total",
			Help: "Log records, spans and metric exports not delivered to the collector, by signal and reason (queue_full, export_failed).",
		}, []string{"signal", "reason"}),
		exported: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capbroker_telemetry_exported_total",
			Help: "Log records, spans and metric exports the collector accepted, by signal.",
		}, []string{"signal"}),
	}
	for _, s := range []string{config.SignalLogs, config.SignalTraces, config.SignalMetrics} {
		if cfg.Enabled(s) {
			t.exported.WithLabelValues(s)
			t.dropped.WithLabelValues(s, dropQueueFull)
			t.dropped.WithLabelValues(s, dropExportFailed)
		}
	}
	if d.Registerer != nil {
		if err := d.Registerer.Register(t.dropped); err != nil {
			return nil, err
		}
		if err := d.Registerer.Register(t.exported); err != nil {
			return nil, err
		}
	}
	instance := cfg.Instance
	if instance == "" {
		instance, _ = os.Hostname()
	}
	res := resource.NewSchemaless(
		attribute.String("service.name", cfg.ServiceName),
		attribute.String("service.instance.id", instance),
		attribute.String("service.version", d.Version),
	)
	ctx := context.Background()
	if err := t.start(ctx, cfg, res, d.Gatherer); err != nil {
		c.close()
		return nil, err
	}
	return t, nil
}

func (t *Telemetry) start(ctx context.Context, cfg *config.Telemetry, res *resource.Resource, g prometheus.Gatherer) error {
	grpcOn, c := cfg.Protocol != "http", t.conn
	retryWithin := cfg.ExportTimeout
	if cfg.Enabled(config.SignalLogs) {
		snd := c.sender(grpcOn, "/opentelemetry.proto.collector.logs.v1.LogsService/Export", "/v1/logs",
			func() proto.Message { return &collogs.ExportLogsServiceResponse{} })
		exp, err := newExporter(snd.send, res, "github.com/capbroker/capbroker/broker/audit")
		if err != nil {
			return fmt.Errorf("telemetry: logs exporter: %w", err)
		}
		t.logs = t.newQueue(cfg, config.SignalLogs, exp)
	}
	if cfg.Enabled(config.SignalTraces) {
		snd := c.sender(grpcOn, "/opentelemetry.proto.collector.trace.v1.TraceService/Export", "/v1/traces",
			func() proto.Message { return &coltrace.ExportTraceServiceResponse{} })
		exp, err := newExporter(snd.send, res, "github.com/capbroker/capbroker/broker")
		if err != nil {
			return fmt.Errorf("telemetry: traces exporter: %w", err)
		}
		tr := &Tracer{ratio: 1, scrub: t.scrubber, q: t.newQueue(cfg, config.SignalTraces, exp)}
		if cfg.TraceRatio != nil {
			tr.ratio = *cfg.TraceRatio
		}
		t.tracer = tr
	}
	if cfg.Enabled(config.SignalMetrics) {
		var exp sdkmetric.Exporter
		var err error
		if grpcOn {
			exp, err = otlpmetricgrpc.New(ctx, otlpmetricgrpc.WithGRPCConn(c.grpc), otlpmetricgrpc.WithTimeout(cfg.ExportTimeout),
				otlpmetricgrpc.WithRetry(otlpmetricgrpc.RetryConfig{Enabled: true, InitialInterval: 200 * time.Millisecond, MaxInterval: time.Second, MaxElapsedTime: retryWithin}))
		} else {
			exp, err = otlpmetrichttp.New(ctx, otlpmetrichttp.WithEndpointURL(c.url("/v1/metrics")), otlpmetrichttp.WithHTTPClient(c.http), otlpmetrichttp.WithTimeout(cfg.ExportTimeout),
				otlpmetrichttp.WithRetry(otlpmetrichttp.RetryConfig{Enabled: true, InitialInterval: 200 * time.Millisecond, MaxInterval: time.Second, MaxElapsedTime: retryWithin}))
		}
		if err != nil {
			return fmt.Errorf("telemetry: metrics exporter: %w", err)
		}
		if g == nil {
			g = prometheus.NewRegistry()
		}
		reader := sdkmetric.NewPeriodicReader(&metricExporter{Exporter: exp, t: t},
			sdkmetric.WithInterval(cfg.MetricsInterval), sdkmetric.WithTimeout(cfg.ExportTimeout),
			sdkmetric.WithProducer(promBridge.NewMetricProducer(promBridge.WithGatherer(g))))
		t.mp = sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(reader))
	}
	return nil
}

// drop counts n items of signal dropped for reason.
func (t *Telemetry) drop(signal string) func(string, int) {
	return func(reason string, n int) { t.dropped.WithLabelValues(signal, reason).Add(float64(n)) }
}

// metricExporter scrubs each export and counts the ones that fail.
type metricExporter struct {
	sdkmetric.Exporter
	t *Telemetry
}

func (m *metricExporter) Export(ctx context.Context, rm *metricdata.ResourceMetrics) error {
	scrubMetrics(m.t.scrubber(), rm)
	err := m.Exporter.Export(ctx, rm)
	if err != nil {
		m.t.dropped.WithLabelValues(config.SignalMetrics, dropExportFailed).Inc()
	} else {
		m.t.exported.WithLabelValues(config.SignalMetrics).Inc()
	}
	return err
}

// Tracer is the tracer of the request spans, nil when traces are not exported.
func (t *Telemetry) Tracer() *Tracer {
	if t == nil || t.tracer == nil {
		return nil
	}
	return t.tracer
}

// newQueue is a signal's export queue: batches of encoded items, joined and sent by exp, the
// items counted as exported when the collector took them (dropped otherwise, by the queue).
func (t *Telemetry) newQueue(cfg *config.Telemetry, signal string, exp *exporter) *queue[encoded] {
	q := newQueue(cfg.QueueSize, cfg.BatchSize, cfg.BatchTimeout, cfg.ExportTimeout, func(ctx context.Context, batch []encoded) error {
		n := 0
		for _, it := range batch {
			n += it.items
		}
		err := exp.export(ctx, batch)
		if err == nil {
			t.exported.WithLabelValues(signal).Add(float64(n))
		}
		return err
	}, t.drop(signal))
	q.count = func(it encoded) int { return it.items }
	return q
}

// Audit is the audit Logger's export hook: the event's line as written becomes one log
// record (body: the line without its newline), with the agent, request id and decision as
// attributes and, when the request was traced, its trace and span. e is nil for an
// approval event. It never blocks: the record is queued or dropped.
func (t *Telemetry) Audit(e *audit.Event, line []byte) {
	if t == nil || t.logs == nil {
		return
	}
	b := getBuf()
	*b = encodeRecord(*b, t.scrubber(), e, line)
	t.logs.put(encoded{b: b, items: 1})
}

// Probe asks the collector once whether it takes the credentials, with an empty export. The
// error says what went wrong; a refusal of the credentials is also kept for Problem.
func (t *Telemetry) Probe(ctx context.Context) error {
	if t == nil {
		return nil
	}
	if err := t.conn.probe(ctx); err != nil {
		if p := t.conn.Problem(); p != "" {
			return errors.New(p)
		}
		return fmt.Errorf("the collector at %s cannot be reached yet (%v); export goes on trying, and drops are counted", t.conn.endpoint.Host, err)
	}
	return nil
}

// Problem is, for /readyz, why the collector refuses the exports ("" when it does not).
func (t *Telemetry) Problem() string {
	if t == nil {
		return ""
	}
	return t.conn.Problem()
}

// Shutdown exports what is queued and stops, waiting at most until ctx ends.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	var errs []error
	if t.tracer != nil {
		errs = append(errs, t.tracer.q.Close(ctx))
	}
	if t.logs != nil {
		errs = append(errs, t.logs.Close(ctx))
	}
	if t.mp != nil {
		errs = append(errs, t.mp.Shutdown(ctx))
	}
	t.conn.close()
	return errors.Join(errs...)
}
