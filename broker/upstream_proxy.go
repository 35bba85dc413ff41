package broker

import (
	"context"
	"fmt"
	"net/url"
	"os"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/upstream"
)

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
