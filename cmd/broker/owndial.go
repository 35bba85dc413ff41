package main

import (
	"context"
	"net"
	"sync/atomic"

	"github.com/capbroker/capbroker/broker"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/credentials"
	"github.com/capbroker/capbroker/internal/svcdial"
)

// ownStore is the credential store the proxies' passwords of the broker's own connections are
// read from: the last one built (buildCredentialsWith), nil before.
var ownStore atomic.Pointer[credentials.Store]

// ownDial is how the broker's own clients (Vault, token endpoints, the approvals webhook,
// policy bundles, Redis) connect: upstream.Dialer.DialService under cfg's upstream.proxy, so
// they go through the operator's proxies, or directly for no_proxy, never around them.
func ownDial(cfg *config.Config) svcdial.Func {
	d, err := broker.ServiceDialer(cfg.Upstream.Proxy, func() broker.Secrets {
		if s := ownStore.Load(); s != nil {
			return s
		}
		return nil
	}, 0)
	if err != nil {
		return func(context.Context, string, string) (net.Conn, error) { return nil, err }
	}
	return d.DialService
}
