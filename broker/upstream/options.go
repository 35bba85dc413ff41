package upstream

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"time"
)

// Options configures the upstream transport. Zero (or negative) durations and counts take the
// defaults noted.
type Options struct {
	CAFile                string // extra PEM roots added to the system pool; "" = system roots only
	AllowPrivate          []netip.Prefix
	DialTimeout           time.Duration // default 10s
	TLSHandshakeTimeout   time.Duration // default 10s
	ResponseHeaderTimeout time.Duration // default 60s
	IdleConnTimeout       time.Duration // default 90s
	// MaxIdleConnsPerHost is the HTTP/1.1 keep-alive pool per Pool and upstream host (default
	// 256). Below the number of requests one Pool (an agent and credential set) runs at once
	// to one host, every request over it pays a new TCP and TLS handshake upstream: size it to
	// that concurrency.
	MaxIdleConnsPerHost int // default 256
	MaxIdleConns        int // idle connections, HTTP/1.1 and HTTP/2, of all pools and hosts; default 4096
	// Deny lists the broker's own services, never dialled (see NewDialer).
	Deny []netip.AddrPort
	// Proxy, when set, chains every connection through the upstream proxies (proxy.go).
	Proxy *ProxyOptions
}

// New returns the client the broker forwards through, and the checked Dialer it uses, for the
// broker's opaque tunnels. Its safety properties:
//   - No proxy: HTTP(S)_PROXY/NO_PROXY in the broker's own environment are ignored, so an
//     environment variable cannot route traffic (and injected credentials) somewhere else.
//   - Every connection goes through the checked Dialer.
//   - TLS is always verified against the system roots plus CAFile, TLS 1.2 minimum.
//   - HTTP/2 when the upstream offers it in ALPN, HTTP/1.1 otherwise (always HTTP/1.1 for a
//     request marked WithHTTP1); a WebSocket upgrade always gets a connection of its own that
//     offers only http/1.1. Plain-HTTP upstreams get HTTP/1.1 (no h2c).
//   - The broker must see response bodies as sent in order to scrub them, so it never asks
//     for gzip on the agent's behalf.
//   - Redirects are returned to the caller as they are, never followed.
func New(opts Options) (*Client, *Dialer, error) {
	roots, err := rootPool(opts.CAFile)
	if err != nil {
		return nil, nil, err
	}
	d := NewDialer(opts.AllowPrivate, opts.DialTimeout, opts.Deny...)
	var inspect *tls.Config
	var inspectRoots []*x509.Certificate
	if opts.Proxy != nil {
		if err := d.ConfigureProxies(*opts.Proxy); err != nil {
			return nil, nil, err
		}
		if f := opts.Proxy.InspectionCAFile; f != "" {
			iroots, err := rootPool(opts.CAFile)
			if err != nil {
				return nil, nil, err
			}
			certs, err := readPEM(f)
			if err != nil {
				return nil, nil, err
			}
			for _, cert := range certs {
				iroots.AddCert(cert)
			}
			inspect = &tls.Config{RootCAs: iroots, MinVersion: tls.VersionTLS12}
			inspectRoots = certs
		}
	}
	c := &Client{
		inspectTLS:       inspect,
		inspectRoots:     inspectRoots,
		dial:             d.DialContext,
		tls:              &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		handshakeTimeout: orDefault(opts.TLSHandshakeTimeout, 10*time.Second),
		headerTimeout:    orDefault(opts.ResponseHeaderTimeout, 60*time.Second),
		idleTimeout:      orDefault(opts.IdleConnTimeout, 90*time.Second),
		maxIdlePerHost:   orDefault(opts.MaxIdleConnsPerHost, 256),
		maxIdle:          orDefault(opts.MaxIdleConns, 4096),
		idle:             map[connKey][]*conn{},
		h2conns:          map[connKey]*h2Conns{},
	}
	if opts.Proxy != nil && len(opts.Proxy.Proxies) > 0 {
		c.forward = d.dialForward
	}
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetHTTP2(true)
	c.h2 = &http.Transport{
		Proxy:          nil,
		DialContext:    d.DialContext,
		DialTLSContext: c.dialH2,
		// A copy: the Transport adds "h2" to its config's NextProtos on first use, while
		// c.tls is cloned for every handshake. Its dials are dialH2's anyway.
		TLSClientConfig:       c.tls.Clone(),
		TLSHandshakeTimeout:   c.handshakeTimeout,
		ResponseHeaderTimeout: c.headerTimeout,
		IdleConnTimeout:       c.idleTimeout,
		MaxIdleConns:          c.maxIdle,
		MaxIdleConnsPerHost:   c.maxIdlePerHost,
		DisableCompression:    true,
		// No HTTP/2 health-check PINGs (HTTP2.SendPingTimeout): gRPC servers take frequent
		// PINGs on a quiet connection for abuse and end it (GOAWAY ENHANCE_YOUR_CALM), with
		// its long, quiet streams. Dead connections are found by TCP keep-alive (net.Dialer's
		// default), as for HTTP/1.1.
		Protocols: &protocols,
	}
	return c, d, nil
}

// rootPool returns the system roots plus every certificate in caFile. A CA file that cannot be
// read, holds a malformed certificate or holds none at all is an error: silently trusting
// fewer roots than configured would only show up later as confusing verification failures.
func rootPool(caFile string) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if caFile == "" {
		return pool, nil
	}
	if err := addPEM(pool, caFile); err != nil {
		return nil, err
	}
	return pool, nil
}

// addPEM adds every certificate in caFile to pool; none is an error.
func addPEM(pool *x509.CertPool, caFile string) error {
	certs, err := readPEM(caFile)
	for _, cert := range certs {
		pool.AddCert(cert)
	}
	return err
}

// readPEM returns every certificate in caFile; none is an error.
func readPEM(caFile string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("upstream CA file %q: %w", caFile, err)
	}
	var certs []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("upstream CA file %q: certificate %d: %w", caFile, len(certs)+1, err)
		}
		certs = append(certs, cert)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("upstream CA file %q: no PEM certificate found", caFile)
	}
	return certs, nil
}

// orDefault treats negative values like zero: a negative timeout is never what was meant.
func orDefault[T time.Duration | int](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// ProxyTLS is the TLS configuration for an https:// upstream proxy whose certificate is
// verified against the system roots plus caFile.
func ProxyTLS(caFile string) (*tls.Config, error) {
	roots, err := rootPool(caFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, nil
}
