package main

import (
	"context"
	"encoding/json"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker"
	"github.com/capbroker/capbroker/broker/approvals"
	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/budget"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/policy/learn"
	"github.com/capbroker/capbroker/broker/rpc"
)

// fleetSetup is what serve needs to run as one replica of a fleet (fleet: in the config;
// docs/fleet.md): the shared approvals queue, the shared MCP sessions, and the drain.
type fleetSetup struct {
	cfg      *config.Fleet
	instance string
	shared   *approvals.RedisShared
	sessions *rpc.SharedSessions
	caps     *budget.Caps    // nil without a cap
	learn    *learn.Recorder // nil without fleet.learn
	draining atomic.Bool
	log      zerolog.Logger
}

// buildFleet returns nil without a fleet section (validated to come with budgets.store.redis).
func buildFleet(cfg *config.Config, store *budget.Redis, reg prometheus.Registerer, log zerolog.Logger) *fleetSetup {
	f := cfg.Fleet
	if f == nil || store == nil {
		return nil
	}
	name := auditOptions(cfg.Audit).Instance // the replica's name in its events and in Redis
	ttl := f.MCPSessionTTL
	if ttl == 0 {
		ttl = config.DefaultMCPSessionTTL
	}
	fs := &fleetSetup{
		cfg: f, instance: name, log: log,
		shared: &approvals.RedisShared{Client: store.Client(), Prefix: store.Prefix(), Instance: name, Background: budget.Background},
		sessions: &rpc.SharedSessions{Local: rpc.NewSessions(1 << 16), Client: store.Client(), Prefix: store.Prefix(),
			TTL: ttl, FailClosed: f.OnStoreError != "local"},
	}
	if f.AgentRequestsPerSecond > 0 || f.AgentConnections > 0 {
		fs.caps = budget.NewCaps(budget.CapsOptions{Store: store, Instance: name, RequestsPerSecond: f.AgentRequestsPerSecond,
			Connections: f.AgentConnections, FailClosed: f.OnStoreError != "local"})
	}
	if f.Learn {
		fs.learn = &learn.Recorder{Client: store.Client(), Key: store.Prefix() + "learn", Background: budget.Background}
		rec := fs.learn
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "capbroker_fleet_learn_dropped_total",
			Help: "Decision events not sent to the fleet's learn stream: Redis did not take them and the buffer was full.",
		}, func() float64 { return float64(rec.Dropped.Load()) }))
	}
	return fs
}

// run keeps the fleet's shared parts going until ctx ends (after the drain).
func (f *fleetSetup) run(ctx context.Context, q *approvals.Queue, auditLog *audit.Logger) {
	f.shared.Lost = q.ReportLost
	go f.shared.Run(ctx, q)
	if f.learn != nil {
		auditLog.SetTap(func(line []byte) { q.Events.AuditTap(line); f.learn.Tap(line) })
		go f.learn.Run(ctx)
	}
	if f.caps != nil {
		go f.caps.Run(ctx)
	}
}

func (f *fleetSetup) drainDelay() time.Duration {
	if f.cfg.DrainDelay == 0 {
		return config.DefaultDrainDelay
	}
	return f.cfg.DrainDelay
}

func (f *fleetSetup) drainHold() time.Duration {
	if f.cfg.DrainHold == 0 {
		return config.DefaultDrainHold
	}
	return f.cfg.DrainHold
}

// serveUntil returns a context that ends drainDelay after ctx (SIGTERM): in between, the
// replica reports not ready (readiness) while it goes on serving, so that the load balancer
// stops sending it connections before its listener closes.
func (f *fleetSetup) serveUntil(ctx context.Context) context.Context {
	out, cancel := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		<-ctx.Done()
		f.draining.Store(true)
		f.log.Info().Dur("drain_delay", f.drainDelay()).Msg("draining: not ready; serving on until the load balancer has noticed")
		t := time.NewTimer(f.drainDelay())
		defer t.Stop()
		<-t.C
		cancel()
	}()
	return out
}

// readiness answers /readyz 503 while the replica drains; everything else goes to next.
func (f *fleetSetup) readiness(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" && f.draining.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(map[string]string{"status": "draining", "instance": f.instance})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// brokerDeps adds the fleet's parts to the broker's collaborators.
func (f *fleetSetup) brokerDeps(d *broker.Deps) {
	if f == nil {
		return
	}
	d.MCPSessions = f.sessions
	d.DrainHold = f.drainHold()
	d.Caps = f.caps
}
