package telemetry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	grpccreds "google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/internal/svcdial"
)

// conn is the way to the collector that every exporter shares: one gRPC connection, or one
// HTTP client, both dialled through Deps.Dial (upstream.Dialer.DialService), with the
// configured headers read from the credential store at each export (a rotated token is
// used at once, and never written anywhere), and with each answer watched for a refusal of
// the credentials (Problem).
type conn struct {
	endpoint *url.URL
	headers  []header
	secret   func(ctx context.Context, name string) (string, error)
	grpc     *grpc.ClientConn // protocol grpc
	http     *http.Client     // protocol http
	problem  atomic.Pointer[string]
}

type header struct {
	name, value string // value "{{secret}}" is replaced by the secret
	secret      string // the secret's name in the store, or ""
}

func newConn(cfg *config.Telemetry, dial svcdial.Func, secret func(context.Context, string) (string, error)) (*conn, error) {
	u, err := url.Parse(cfg.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("telemetry.endpoint: %w", err)
	}
	c := &conn{endpoint: u, secret: secret}
	for i, h := range cfg.Headers {
		hd := header{name: h.Name, value: h.Value}
		if h.Secret != nil {
			hd.secret = config.TelemetryCredentialName(i)
			if hd.value == "" {
				hd.value = "{{secret}}"
			}
		}
		c.headers = append(c.headers, hd)
	}
	var tlsConf *tls.Config
	if u.Scheme == "https" {
		if tlsConf, err = clientTLS(cfg.CAFile); err != nil {
			return nil, err
		}
	}
	if cfg.Protocol == "http" {
		base := svcdial.Transport(dial, tlsConf, cfg.ExportTimeout)
		base.WriteBufferSize = exportWriteBuffer // as over gRPC
		c.http = &http.Client{Transport: &headerTransport{c: c, base: base}}
		return c, nil
	}
	tc := insecure.NewCredentials()
	if tlsConf != nil {
		tc = grpccreds.NewTLS(tlsConf)
	}
	if dial == nil {
		dial = func(context.Context, string, string) (net.Conn, error) { return nil, svcdial.ErrNoDialer }
	}
	c.grpc, err = grpc.NewClient("passthrough:///"+u.Host,
		grpc.WithTransportCredentials(tc),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return dial(ctx, "tcp", addr) }),
		grpc.WithPerRPCCredentials(rpcHeaders{c}),
		grpc.WithUnaryInterceptor(c.watch),
		grpc.WithWriteBufferSize(exportWriteBuffer),
		// A collector back after an outage is reconnected to within seconds, not grpc's
		// default of up to two minutes.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 250 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 3 * time.Second}, MinConnectTimeout: 5 * time.Second}),
	)
	if err != nil {
		return nil, fmt.Errorf("telemetry.endpoint: %w", err)
	}
	return c, nil
}

func clientTLS(caFile string) (*tls.Config, error) {
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile == "" {
		return conf, nil
	}
	roots, err := x509.SystemCertPool()
	if err != nil {
		roots = x509.NewCertPool()
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("telemetry.ca_file: %w", err)
	}
	if !roots.AppendCertsFromPEM(pem) {
		return nil, errors.New("telemetry.ca_file: no PEM certificate in it")
	}
	conf.RootCAs = roots
	return conf, nil
}

// values returns the headers to send now.
func (c *conn) values(ctx context.Context) (map[string]string, error) {
	out := make(map[string]string, len(c.headers))
	for _, h := range c.headers {
		v := h.value
		if h.secret != "" {
			s, err := c.secret(ctx, h.secret)
			if err != nil {
				// The error names the credential (telemetry.headers[i]), never its value.
				return nil, fmt.Errorf("reading the secret of %s: %w", h.secret, err)
			}
			v = strings.Replace(v, "{{secret}}", s, 1)
		}
		out[h.name] = v
	}
	return out, nil
}

// refused records that the collector refused the credentials, or (ok) that it took an export.
func (c *conn) refused(ok bool, detail string) {
	if ok {
		c.problem.Store(nil)
		return
	}
	msg := fmt.Sprintf("the collector at %s refused the export's credentials (%s): check telemetry.headers", c.endpoint.Host, detail)
	c.problem.Store(&msg)
}

// Problem is why exports are refused by the collector ("" when the last answer was not a
// refusal of the credentials).
func (c *conn) Problem() string {
	if p := c.problem.Load(); p != nil {
		return *p
	}
	return ""
}

// watch is the gRPC interceptor that records refusals of the credentials.
func (c *conn) watch(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	switch code := status.Code(err); code {
	case codes.OK:
		c.refused(true, "")
	case codes.Unauthenticated, codes.PermissionDenied:
		c.refused(false, "gRPC "+code.String())
	}
	return err
}

// rpcHeaders sends the headers as gRPC metadata on every call.
type rpcHeaders struct{ c *conn }

func (r rpcHeaders) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	h, err := r.c.values(ctx)
	if err != nil {
		return nil, err
	}
	md := make(map[string]string, len(h))
	for k, v := range h {
		md[strings.ToLower(k)] = v
	}
	return md, nil
}

// RequireTransportSecurity is false: an http:// endpoint is the operator's choice (a
// collector on the same host or pod).
func (rpcHeaders) RequireTransportSecurity() bool { return false }

// headerTransport sends the headers with every OTLP/HTTP request and records refusals.
type headerTransport struct {
	c    *conn
	base http.RoundTripper
}

func (t *headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	h, err := t.c.values(r.Context())
	if err != nil {
		if r.Body != nil {
			_ = r.Body.Close()
		}
		return nil, err
	}
	r = r.Clone(r.Context())
	for k, v := range h {
		r.Header.Set(k, v)
	}
	resp, err := t.base.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		t.c.refused(false, "HTTP "+resp.Status)
	case resp.StatusCode < 300:
		t.c.refused(true, "")
	}
	return resp, nil
}

// probe sends one empty logs export, to learn at start whether the collector takes the
// credentials. An empty request is valid OTLP and exports nothing.
func (c *conn) probe(ctx context.Context) error {
	if c.grpc != nil {
		err := c.grpc.Invoke(ctx, "/opentelemetry.proto.collector.logs.v1.LogsService/Export", &collogs.ExportLogsServiceRequest{}, &collogs.ExportLogsServiceResponse{})
		if code := status.Code(err); code == codes.Unimplemented {
			return nil // a collector without a logs pipeline answered: it took the credentials
		}
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url("/v1/logs"), http.NoBody)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode != http.StatusNotFound {
		return fmt.Errorf("the collector answered %s", resp.Status)
	}
	return nil
}

// url is the OTLP/HTTP URL of a signal's path.
func (c *conn) url(path string) string {
	return c.endpoint.Scheme + "://" + c.endpoint.Host + path
}

func (c *conn) close() {
	if c.grpc != nil {
		_ = c.grpc.Close()
	}
	if c.http != nil {
		c.http.CloseIdleConnections()
	}
}

// exportWriteBuffer is how much of an export is written at once. Exports are batches of up to
// a MiB or so: written in 256 KiB rather than gRPC's 32 KiB (or net/http's 4 KiB), they cost
// an eighth of the system calls or fewer.
const exportWriteBuffer = 256 << 10
