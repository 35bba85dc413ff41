package main

import (
	"context"
	"errors"
	"time"

	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker"
	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/inject"
	"github.com/capbroker/capbroker/broker/telemetry"
)

// probeTimeout bounds the start-up check of the collector.
const probeTimeout = 5 * time.Second

// runningTelemetry is the telemetry export while the broker runs (nil *telemetry.Telemetry
// when the config has no telemetry section).
type runningTelemetry struct {
	*telemetry.Telemetry
	audit *audit.Logger
	log   zerolog.Logger
}

// startTelemetry starts the OpenTelemetry export of telemetry: the audit events as log
// records (the Logger's export hook), the tracer of the request spans, the metrics. It asks
// the collector once whether it takes the credentials: a refusal is logged as an error and
// shown in /readyz (degraded), and the broker serves on; an unreachable collector is a
// warning (export keeps trying, drops are counted).
func startTelemetry(ctx context.Context, cfg *config.Config, known *inject.Known, metrics *broker.Metrics, auditLog *audit.Logger, log zerolog.Logger) (*runningTelemetry, error) {
	rt := &runningTelemetry{audit: auditLog, log: log}
	if cfg.Telemetry == nil {
		return rt, nil
	}
	t, err := telemetry.New(cfg.Telemetry, telemetry.Deps{
		Dial: ownDial(cfg),
		Secret: func(ctx context.Context, name string) (string, error) {
			s := own.store.Load()
			if s == nil {
				return "", errors.New("the credentials are not loaded yet")
			}
			sec, err := s.Get(ctx, name)
			if err != nil {
				return "", err
			}
			return sec.Reveal(), nil
		},
		Scrubber:   known.Everything,
		Gatherer:   metrics.Registry(),
		Registerer: metrics.Registry(),
		Version:    version,
	})
	if err != nil {
		return nil, err
	}
	rt.Telemetry = t
	auditLog.SetExport(t.Audit)
	metrics.SetTelemetryProblem(t.Problem)
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if err := t.Probe(pctx); err != nil {
		if t.Problem() != "" {
			log.Error().Str("telemetry", cfg.Telemetry.Endpoint).Msg("telemetry: " + err.Error())
		} else {
			log.Warn().Str("telemetry", cfg.Telemetry.Endpoint).Msg("telemetry: " + err.Error())
		}
	} else {
		log.Info().Str("telemetry", cfg.Telemetry.Endpoint).Strs("signals", cfg.Telemetry.Signals).Msg("telemetry: exporting to the collector")
	}
	return rt, nil
}

// close writes the last audit events (they are exported too), then exports what is queued,
// for at most 5 seconds.
func (rt *runningTelemetry) close() {
	if rt.Telemetry == nil {
		return
	}
	rt.audit.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rt.Shutdown(ctx); err != nil {
		rt.log.Warn().Err(err).Msg("telemetry: not everything queued was exported")
	}
}
