package main

import (
	"context"
	"errors"
	"net"
	"sync/atomic"

	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/upstream"
	"github.com/capbroker/capbroker/credentials"
	"github.com/capbroker/capbroker/internal/svcdial"
)

// own is how the broker's own clients (Vault, token endpoints, the approvals webhook, policy
// bundles, Redis) connect: through the one service Dialer of the running config's
// upstream.proxy, looked up at each connection, so that a reload that changes upstream.proxy
// applies to their next connections.
var own ownDialing

type ownDialing struct {
	// store is the credential store the proxies' passwords are read from: the running
	// config's, nil before the first is built.
	store   atomic.Pointer[credentials.Store]
	dialer  atomic.Pointer[ownDialer]
	metrics atomic.Pointer[broker.Metrics] // nil: not counted (before serve has its metrics, check)
	log     atomic.Pointer[zerolog.Logger] // nil: not logged
}

// ownDialer is the service Dialer of one config, or why there is none.
type ownDialer struct {
	d   *upstream.Dialer
	err error
}

// use makes cfg's upstream.proxy the one the next connections follow, and returns the one it
// replaces (nil: none), for restore.
func (o *ownDialing) use(cfg *config.Config) *ownDialer { return o.dialer.Swap(o.build(cfg)) }

func (o *ownDialing) build(cfg *config.Config) *ownDialer {
	d, err := broker.ServiceDialer(cfg.Upstream.Proxy, func() broker.Secrets {
		if s := o.store.Load(); s != nil {
			return s
		}
		return nil
	}, 0, o.observe)
	return &ownDialer{d: d, err: err}
}

// restore puts back what use replaced (a refused reload), with the store it read from.
func (o *ownDialing) restore(prev *ownDialer, store *credentials.Store) {
	if prev != nil {
		o.dialer.Store(prev)
	}
	o.store.Store(store)
}

// observe counts a connection of the own clients through via (upstream.ProxyOptions.Observe).
func (o *ownDialing) observe(via string, failed bool) {
	if m := o.metrics.Load(); m != nil {
		m.ServiceProxyUsed(via, failed)
	}
}

// dial connects through the current service Dialer, and logs how it left.
func (o *ownDialing) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	cur := o.dialer.Load()
	if cur.err != nil {
		return nil, cur.err
	}
	conn, err := cur.d.DialService(ctx, network, addr)
	if log := o.log.Load(); log != nil && cur.d.Chains() {
		if err != nil {
			ev := log.Warn().Str("service", addr).Err(err)
			var refused *upstream.ProxyRefusedError
			if errors.As(err, &refused) {
				ev = ev.Str("via", refused.Proxy)
			}
			ev.Msg("the broker's own connection failed")
		} else {
			log.Debug().Str("service", addr).Str("via", upstream.Via(conn)).Msg("the broker's own connection")
		}
	}
	return conn, err
}

// ownDial is the dial function of the broker's own clients. The config is the one used when
// no running config has set the service Dialer yet (check-config, tests); serve sets it
// (own.use) before it builds any client, and again at each reload.
func ownDial(cfg *config.Config) svcdial.Func {
	if own.dialer.Load() == nil {
		own.dialer.CompareAndSwap(nil, own.build(cfg))
	}
	return own.dial
}
