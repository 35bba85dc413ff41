package main

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker"
	"github.com/capbroker/capbroker/broker/budget"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/policy"
)

// buildBudgets makes the budgets the broker checks requests against, from the policy's data,
// with their counters in memory or in budgets.store.redis (returned too, nil without it, for
// the approvals grants and to close).
func buildBudgets(cfg *config.Config, engine *policy.Engine, metrics *broker.Metrics, log zerolog.Logger) (*budget.Budgets, *budget.Redis, error) {
	o := budget.Options{Data: engine.Data, OnStoreError: cfg.Budgets.OnStoreError, Metrics: metrics.Registry(), Log: log}
	var rs *budget.Redis
	if r := cfg.Budgets.Store.Redis; r != nil {
		ro := budget.RedisOptions{Address: r.Address, TLS: r.TLS, KeyPrefix: r.KeyPrefix, Dial: ownDial(cfg)}
		if r.PasswordEnv != "" {
			ro.Password = os.Getenv(r.PasswordEnv)
			if ro.Password == "" {
				return nil, nil, fmt.Errorf("budgets.store.redis.password_env: %s is not set or empty", r.PasswordEnv)
			}
		}
		rs = budget.NewRedis(ro)
		o.Store = rs
		for _, kind := range []string{"request", "background"} {
			metrics.Registry().MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "capbroker_store_round_trips_total", Help: "Round trips to the shared store (Redis), made for a request or in the background.",
				ConstLabels: prometheus.Labels{"kind": kind},
			}, func() float64 {
				req, bg := rs.RoundTrips().Counts()
				if kind == "request" {
					return float64(req)
				}
				return float64(bg)
			}))
		}
	}
	return budget.New(o), rs, nil
}

// agentLabels are the configured agents' labels by ID, for the usage summary.
func agentLabels(cfg *config.Config) map[string]map[string]string {
	m := make(map[string]map[string]string, len(cfg.Agents))
	for _, a := range cfg.Agents {
		m[a.ID] = a.Labels
	}
	return m
}

// redisAddrs are the addresses of budgets.store.redis: like Vault's, never dialled for an
// agent (an agent that could reach the store could reset its budgets or write grants).
func redisAddrs(cfg *config.Config) []netip.AddrPort {
	r := cfg.Budgets.Store.Redis
	if r == nil {
		return nil
	}
	host, port, err := net.SplitHostPort(r.Address)
	if err != nil {
		return nil
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil
	}
	ips, err := net.LookupIP(host)
	if err != nil {
		return nil
	}
	var out []netip.AddrPort
	for _, ip := range ips {
		if a, ok := netip.AddrFromSlice(ip); ok {
			out = append(out, netip.AddrPortFrom(a.Unmap(), uint16(p)))
		}
	}
	return out
}
