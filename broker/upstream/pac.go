package upstream

import (
	"net/http"
	"time"
)

// PACClient is the client an https:// PAC file is fetched with (egress.LoadPAC): through d,
// so through the proxies list or no_proxy with the destination checked like any other,
// verified against the system roots plus caFile, following no redirect. Call its
// CloseIdleConnections when done.
func (d *Dialer) PACClient(caFile string, timeout time.Duration) (*http.Client, error) {
	cfg, err := ProxyTLS(caFile)
	if err != nil {
		return nil, err
	}
	return &http.Client{
		Transport: &http.Transport{Proxy: nil, DialContext: d.DialContext, TLSClientConfig: cfg},
		Timeout:   timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}, nil
}
