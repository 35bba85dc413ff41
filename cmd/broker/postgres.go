package main

import (
	"context"
	"fmt"
	"net"

	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker/approvals"
	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/certs"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/identity"
	"github.com/capbroker/capbroker/broker/inject"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/broker/postgres"
	"github.com/prometheus/client_golang/prometheus"
)

// postgresDeps is what the Postgres front door is wired from.
type postgresDeps struct {
	engine  *policy.Engine
	creds   *credentialSet
	queue   *approvals.Queue
	ca      *certs.CA
	audit   *audit.Logger
	known   *inject.Known
	metrics prometheus.Registerer
	log     zerolog.Logger
}

// startPostgres listens on postgres.listen and serves the front door until ctx ends; the
// returned wait blocks until every connection has closed and revoked its lease.
func startPostgres(ctx context.Context, cfg *config.Config, d postgresDeps) (wait func(), err error) {
	if cfg.Postgres.Listen == "" {
		return func() {}, nil
	}
	ids, err := identity.NewWith(cfg.Agents, identity.Options{SCRAM: true})
	if err != nil {
		return nil, err
	}
	var holder postgres.Holder
	if d.queue != nil {
		holder = d.queue
	}
	var vault postgres.Vault
	if d.creds.vault != nil {
		vault = d.creds.vault
	}
	srv, err := postgres.New(cfg.Postgres, postgres.Deps{
		Identity: ids, Policy: d.engine, Vault: vault, Approvals: holder,
		Certs: certs.NewCache(d.ca, 0), Audit: d.audit, Known: d.known,
		Dial:    ownDial(cfg),
		Metrics: postgres.NewMetrics(d.metrics), Log: d.log.With().Str("component", "postgres").Logger(),
		PolicyMode: cfg.Policy.Mode, IncludeInput: cfg.Audit.IncludeInput,
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Postgres.Listen)
	if err != nil {
		return nil, fmt.Errorf("postgres.listen: %w", err)
	}
	d.log.Info().Str("postgres", ln.Addr().String()).Msg("listening for Postgres clients")
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ctx, ln); err != nil {
			d.log.Error().Err(err).Msg("postgres listener stopped")
		}
	}()
	return func() { <-done }, nil
}
