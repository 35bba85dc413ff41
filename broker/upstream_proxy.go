package broker

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/upstream"
	"github.com/capbroker/capbroker/broker/upstream/egress"
	"github.com/capbroker/capbroker/credentials"
)

// checkProxies dials each configured upstream proxy (TCP only, 2s each, in parallel) and
// returns those that cannot be connected to, with the error: for /readyz.
func (b *Broker) checkProxies(ctx context.Context) map[string]string {
	d := b.gen.Load().dialer
	if d == nil || !d.Chains() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	down := map[string]string{}
	for _, p := range d.Proxies() {
		wg.Add(1)
		go func(name, addr string) {
			defer wg.Done()
			if err := d.CheckProxy(ctx, name); err != nil {
				mu.Lock()
				down[name] = fmt.Sprintf("%s: cannot connect: %v", addr, err)
				mu.Unlock()
			}
		}(p[0], p[1])
	}
	wg.Wait()
	return down
}

// proxyOptions turns upstream.proxy into the Dialer's chaining options; nil when none is
// configured. A proxy's password is read from secrets, where it is kept under
// config.ProxyCredentialName (and scrubbed like every secret), at every connection.
func proxyOptions(p *config.UpstreamProxy, secrets Secrets) (*upstream.ProxyOptions, error) {
	if p == nil || len(p.Proxies) == 0 {
		return nil, nil
	}
	opts := &upstream.ProxyOptions{NoProxy: p.NoProxy, ConnectByName: p.ConnectBy == config.ConnectByName,
		InspectionCAFile: p.TLSInspectionCA}
	if f := p.TLSInspectionCA; f != "" {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("upstream.proxy.tls_inspection_ca: %w", err)
		}
	}
	for i, s := range p.Proxies {
		u, err := url.Parse(s.URL)
		if err != nil {
			return nil, fmt.Errorf("upstream.proxy.proxies[%d].url: %w", i, err)
		}
		ps := upstream.ProxyServer{Name: s.Name, URL: u, Username: s.Username}
		if s.CAFile != "" {
			cfg, err := upstream.ProxyTLS(s.CAFile)
			if err != nil {
				return nil, fmt.Errorf("upstream.proxy.proxies[%d].ca_file: %w", i, err)
			}
			ps.TLS = cfg
		}
		if s.Password != nil {
			name := config.ProxyCredentialName(s.Name)
			ps.Password = func(ctx context.Context) (string, error) {
				sec, err := secrets.Get(ctx, name)
				if err != nil {
					return "", err
				}
				return sec.Reveal(), nil
			}
		}
		opts.Proxies = append(opts.Proxies, ps)
	}
	return opts, nil
}

// pacFetchTimeout bounds fetching an https:// PAC file.
const pacFetchTimeout = 10 * time.Second

// loadPAC reads upstream.proxy.pac (at start and on every reload) and gives it to d, which
// has its proxies configured and serves no request yet. An https:// PAC file is fetched
// through d itself: the proxies list (or no_proxy), with the destination checked as any
// other, before the PAC is in place.
func loadPAC(p *config.UpstreamProxy, caFile string, d *upstream.Dialer) error {
	if p == nil || p.PAC == "" {
		return nil
	}
	client, err := d.PACClient(caFile, pacFetchTimeout)
	if err != nil {
		return fmt.Errorf("upstream.proxy.pac: %w", err)
	}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), pacFetchTimeout)
	defer cancel()
	script, err := egress.LoadPAC(ctx, p.PAC, client)
	if err != nil {
		return fmt.Errorf("upstream.proxy.pac: %w", err)
	}
	if err := d.ConfigurePAC(script, p.PACTimeout, p.PACFallback); err != nil {
		return fmt.Errorf("upstream.proxy.pac: %w", err)
	}
	return nil
}

// ServiceDialer returns the Dialer of the broker's own connections (Vault, token endpoints,
// the approvals webhook, policy bundles, Redis): its DialService follows upstream.proxy and
// no_proxy exactly as the request path's Dialer does, built by the same code from the same
// configuration, with the proxies' passwords read from secrets (called at each connection;
// nil until the credentials exist is an error at that connection). observe, when not nil, is
// told of every connection attempt through a proxy, and of every direct one while proxies are
// configured (upstream.ProxyOptions.Observe). timeout <= 0 means 10s.
func ServiceDialer(p *config.UpstreamProxy, secrets func() Secrets, timeout time.Duration, observe func(via string, failed bool)) (*upstream.Dialer, error) {
	d := upstream.NewDialer(nil, timeout)
	opts, err := proxyOptions(p, lateSecrets(secrets))
	if err != nil || opts == nil {
		return d, err
	}
	opts.Observe = observe
	return d, d.ConfigureProxies(*opts)
}

// lateSecrets reads through the Secrets the function returns at each call.
type lateSecrets func() Secrets

func (f lateSecrets) Get(ctx context.Context, name string) (credentials.Secret, error) {
	s := f()
	if s == nil {
		return credentials.Secret{}, fmt.Errorf("credential %q: the credentials are not loaded yet", name)
	}
	return s.Get(ctx, name)
}

func (f lateSecrets) Known(name string) []credentials.Secret {
	if s := f(); s != nil {
		return s.Known(name)
	}
	return nil
}
