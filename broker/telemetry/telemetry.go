// Package telemetry exports what the broker does over OpenTelemetry (OTLP, gRPC or HTTP) with
// the official Go SDK: each audit event as a log record whose body is the audit line as
// written (whatever audit.format), a span tree per request (the broker makes the spans; this
// package provides the tracer), and the Prometheus families as OTLP metrics. Export never
// holds a request: records and spans go into bounded queues, and what does not fit, or
// cannot be delivered, is dropped and counted (capbroker_telemetry_dropped_total). Every
// exported string is scrubbed of every secret the broker knows (scrub.go).
package telemetry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	promBridge "go.opentelemetry.io/contrib/bridges/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploggrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otellog "go.opentelemetry.io/otel/log"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/prometheus/client_golang/prometheus"

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
	tracer   trace.Tracer
	tp       *sdktrace.TracerProvider
	lp       *sdklog.LoggerProvider
	mp       *sdkmetric.MeterProvider
	logger   otellog.Logger
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
		var exp sdklog.Exporter
		var err error
		if grpcOn {
			exp, err = otlploggrpc.New(ctx, otlploggrpc.WithGRPCConn(c.grpc), otlploggrpc.WithTimeout(cfg.ExportTimeout),
				otlploggrpc.WithRetry(otlploggrpc.RetryConfig{Enabled: true, InitialInterval: 200 * time.Millisecond, MaxInterval: time.Second, MaxElapsedTime: retryWithin}))
		} else {
			exp, err = otlploghttp.New(ctx, otlploghttp.WithEndpointURL(c.url("/v1/logs")), otlploghttp.WithHTTPClient(c.http), otlploghttp.WithTimeout(cfg.ExportTimeout),
				otlploghttp.WithRetry(otlploghttp.RetryConfig{Enabled: true, InitialInterval: 200 * time.Millisecond, MaxInterval: time.Second, MaxElapsedTime: retryWithin}))
		}
		if err != nil {
			return fmt.Errorf("telemetry: logs exporter: %w", err)
		}
		q := newQueue(cfg.QueueSize, cfg.BatchSize, cfg.BatchTimeout, cfg.ExportTimeout, func(ctx context.Context, recs []sdklog.Record) error {
			scrubRecords(t.scrubber(), recs)
			err := exp.Export(ctx, recs)
			if err == nil {
				t.exported.WithLabelValues(config.SignalLogs).Add(float64(len(recs)))
			}
			return err
		}, t.drop(config.SignalLogs))
		t.lp = sdklog.NewLoggerProvider(sdklog.WithResource(res), sdklog.WithProcessor(logQueue{q}))
		t.logger = t.lp.Logger("github.com/capbroker/capbroker/broker/audit")
	}
	if cfg.Enabled(config.SignalTraces) {
		var exp sdktrace.SpanExporter
		var err error
		if grpcOn {
			exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithGRPCConn(c.grpc), otlptracegrpc.WithTimeout(cfg.ExportTimeout),
				otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: true, InitialInterval: 200 * time.Millisecond, MaxInterval: time.Second, MaxElapsedTime: retryWithin}))
		} else {
			exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(c.url("/v1/traces")), otlptracehttp.WithHTTPClient(c.http), otlptracehttp.WithTimeout(cfg.ExportTimeout),
				otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: true, InitialInterval: 200 * time.Millisecond, MaxInterval: time.Second, MaxElapsedTime: retryWithin}))
		}
		if err != nil {
			return fmt.Errorf("telemetry: traces exporter: %w", err)
		}
		q := newQueue(cfg.QueueSize, cfg.BatchSize, cfg.BatchTimeout, cfg.ExportTimeout, func(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
			err := exp.ExportSpans(ctx, scrubSpans(t.scrubber(), spans))
			if err == nil {
				t.exported.WithLabelValues(config.SignalTraces).Add(float64(len(spans)))
			}
			return err
		}, t.drop(config.SignalTraces))
		t.tp = sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithSampler(sampler),
			sdktrace.WithSpanProcessor(spanQueue{q}))
		t.tracer = sampled(t.tp.Tracer("github.com/capbroker/capbroker/broker"), cfg.TraceRatio)
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
func (t *Telemetry) Tracer() trace.Tracer {
	if t == nil || t.tracer == nil {
		return nil
	}
	return t.tracer
}

// Audit is the audit Logger's export hook: the event's line as written becomes one log
// record (body: the line without its newline), with the agent, request id and decision as
// attributes and, when the request was traced, its trace and span. e is nil for an
// approval event. It never blocks: the record is queued or dropped.
func (t *Telemetry) Audit(e *audit.Event, line []byte) {
	if t == nil || t.logger == nil {
		return
	}
	var r otellog.Record
	now := time.Now()
	r.SetTimestamp(now)
	r.SetObservedTimestamp(now)
	r.SetSeverity(otellog.SeverityInfo)
	r.SetSeverityText("INFO")
	r.SetBody(attribute.StringValue(string(bytes.TrimRight(line, "\n"))))
	ctx := context.Background()
	if e == nil {
		r.SetEventName("capbroker.approval")
	} else {
		r.SetEventName("capbroker.decision")
		r.AddAttributes(
			attribute.String("capbroker.agent", e.Agent),
			attribute.String("capbroker.request_id", e.RequestID),
			attribute.String("capbroker.decision", e.Decision),
		)
		if sc := spanContext(e); sc.IsValid() {
			ctx = trace.ContextWithSpanContext(ctx, sc)
		}
	}
	t.logger.Emit(ctx, r)
}

// spanContext is the span of a traced event's request.
func spanContext(e *audit.Event) trace.SpanContext {
	if e.TraceID == "" {
		return trace.SpanContext{}
	}
	tid, err1 := trace.TraceIDFromHex(e.TraceID)
	sid, err2 := trace.SpanIDFromHex(e.SpanID)
	if err1 != nil || err2 != nil {
		return trace.SpanContext{}
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
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
	if t.tp != nil {
		errs = append(errs, t.tp.Shutdown(ctx))
	}
	if t.lp != nil {
		errs = append(errs, t.lp.Shutdown(ctx))
	}
	if t.mp != nil {
		errs = append(errs, t.mp.Shutdown(ctx))
	}
	t.conn.close()
	return errors.Join(errs...)
}

// The broker, not the agent, decides which requests are traced: an agent must not be able to
// keep its requests out of the traces, nor pick which are traced (its traceparent's sampled
// flag is not obeyed, and its trace id, which it chooses, is not what the choice is made on).
// With trace_ratio below 1 the draw is made before any span work (sampledTracer): a request
// not drawn costs one random number, no ids, context or span. What reaches the SDK is traced
// (sampler): a root whatever its remote parent says, a step as its root.
var sampler = sdktrace.ParentBased(sdktrace.AlwaysSample(),
	sdktrace.WithRemoteParentSampled(sdktrace.AlwaysSample()), sdktrace.WithRemoteParentNotSampled(sdktrace.AlwaysSample()))

// sampled is tr, tracing a root at random with probability ratio (nil or 1: always).
func sampled(tr trace.Tracer, ratio *float64) trace.Tracer {
	if ratio == nil || *ratio >= 1 {
		return tr
	}
	return sampledTracer{tr, *ratio}
}

// sampledTracer draws whether a root span is made; a span under a recording one always is.
type sampledTracer struct {
	trace.Tracer
	p float64
}

func (t sampledTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if parent := trace.SpanFromContext(ctx); !parent.IsRecording() && rand.Float64() >= t.p {
		return ctx, noSpan // not recording: the broker makes no trace of the request
	}
	return t.Tracer.Start(ctx, name, opts...)
}

// noSpan is the span of a request not traced: one that records nothing.
var noSpan = trace.SpanFromContext(context.Background())
