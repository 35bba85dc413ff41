// Package svcdial builds the HTTP transports of the broker's own clients (Vault, token
// endpoints, the approvals webhook, policy bundles) around a dial function the caller injects:
// cmd/broker passes upstream.Dialer.DialService, so these connections follow upstream.proxy
// (and its no_proxy) like every other. Without a dial function nothing is dialled.
package svcdial

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
	"weak"
)

// Func dials one of the broker's own services.
type Func func(ctx context.Context, network, addr string) (net.Conn, error)

// ErrNoDialer is returned by every dial of a transport built without a dial function.
var ErrNoDialer = errors.New("no dialer given for the broker's own connection (upstream.Dialer.DialService)")

// Transport returns a transport that dials only through dial, never reads a proxy from the
// environment, verifies TLS with tlsConf (nil: system roots, TLS 1.2 at least) and bounds the
// handshake and the response header by timeout (<= 0: 10s).
func Transport(dial Func, tlsConf *tls.Config, timeout time.Duration) *http.Transport {
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	if tlsConf == nil {
		tlsConf = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if dial == nil {
		dial = func(_ context.Context, _, addr string) (net.Conn, error) {
			return nil, fmt.Errorf("dial %s: %w", addr, ErrNoDialer)
		}
	}
	t := &http.Transport{
		Proxy:                 nil, // the broker's own proxy environment is ignored
		DialContext:           dial,
		TLSClientConfig:       tlsConf,
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
		ForceAttemptHTTP2:     true,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
	}
	built.mu.Lock()
	built.list = append(built.list, weak.Make(t))
	built.mu.Unlock()
	return t
}

// built holds every transport Transport made, weakly: a client dropped (a reload's) is
// not kept alive by it.
var built struct {
	mu   sync.Mutex
	list []weak.Pointer[http.Transport]
}

// CloseIdle closes the idle connections of every transport Transport built that is still in
// use: after a reload that changed how the broker's own connections leave (upstream.proxy),
// their next requests dial anew rather than reuse a connection that went the old way.
func CloseIdle() {
	built.mu.Lock()
	defer built.mu.Unlock()
	live := built.list[:0]
	for _, w := range built.list {
		if t := w.Value(); t != nil {
			t.CloseIdleConnections()
			live = append(live, w)
		}
	}
	clear(built.list[len(live):])
	built.list = live
}
