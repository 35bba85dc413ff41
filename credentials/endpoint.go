package credentials

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/capbroker/capbroker/internal/svcdial"
)

// EndpointClient returns a client for the endpoints the broker itself calls to mint
// credentials (GitHub's API, OAuth2 token endpoints): the system roots plus the PEM
// certificates in caFile ("" for none; upstream.ca_file), TLS 1.2 at least, no proxy from the
// environment, bounded timeouts. Every connection is made by dial (cmd/broker:
// upstream.Dialer.DialService, which follows upstream.proxy); nil dials nothing. Callers that
// send a secret must not follow redirects.
func EndpointClient(caFile string, dial svcdial.Func) (*http.Client, error) {
	roots, err := x509.SystemCertPool()
	if err != nil {
		roots = x509.NewCertPool()
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("upstream.ca_file: %w", err)
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("upstream.ca_file %s: no PEM certificates", caFile)
		}
	}
	tr := svcdial.Transport(dial, &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, 10*time.Second)
	tr.ResponseHeaderTimeout = 20 * time.Second
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}, nil
}
