package policy

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"github.com/capbroker/capbroker/internal/svcdial"
	"io"
	"net/http"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/keys"
)

// Bundle defaults.
const (
	DefaultPollInterval = 30 * time.Second
	// MaxBundleSize bounds a bundle download, compressed and each file uncompressed.
	MaxBundleSize = 64 << 20
	// minRetry is the first retry delay while no bundle has loaded yet; it doubles up to
	// the poll interval.
	minRetry = 500 * time.Millisecond
)

// BundleOptions say where a bundle comes from and how it is verified.
type BundleOptions struct {
	// Dial makes the connections of the default Client (cmd/broker: DialService); without
	// Client and Dial nothing is downloaded.
	Dial svcdial.Func
	// URL of the bundle, a tar.gz as `opa build` writes it.
	URL string
	// PollInterval between downloads once a bundle has loaded (DefaultPollInterval if zero).
	PollInterval time.Duration
	// PublicKey, when set (PEM: a public key or a certificate), makes a signature required:
	// the bundle must carry .signatures.json (as `opa build --signing-key` writes it) whose
	// JWT verifies with this key and lists the hash of every file in the bundle.
	PublicKey []byte
	// KeyID names the key (default "default"). The bundle's signature is checked against
	// PublicKey whatever key id its JWT names.
	KeyID string
	// Algorithm of the signature: RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384 or
	// ES512. If empty it follows from the key: RS256 for RSA, ES256/384/512 for ECDSA by curve.
	Algorithm string
	// Client makes the requests (a client that ignores proxy settings if nil).
	Client *http.Client
}

// BundlePoller downloads a bundle and makes it the Engine's policy when it changes.
// A download that fails, a bundle that does not verify or does not compile leaves the
// last good policy in place.
type BundlePoller struct {
	e      *Engine
	o      BundleOptions
	verify *bundle.VerificationConfig
	etag   string // of the bundle in use
	hash   string // sha256 of the bundle in use
}

// NewBundlePoller checks the options (the URL, the key and its algorithm).
func NewBundlePoller(e *Engine, o BundleOptions) (*BundlePoller, error) {
	if !strings.HasPrefix(o.URL, "http://") && !strings.HasPrefix(o.URL, "https://") {
		return nil, fmt.Errorf("bundle url %q must start with http:// or https://", o.URL)
	}
	if o.PollInterval <= 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.Client == nil {
		o.Client = &http.Client{
			Transport: BundleTransport(o.Dial, nil),
			Timeout:   time.Minute,
		}
	}
	p := &BundlePoller{e: e, o: o}
	if len(o.PublicKey) > 0 {
		alg, err := keyAlgorithm(o.PublicKey, o.Algorithm)
		if err != nil {
			return nil, err
		}
		id := o.KeyID
		if id == "" {
			id = "default"
		}
		p.verify = bundle.NewVerificationConfig(map[string]*keys.Config{
			id: {Key: string(o.PublicKey), Algorithm: alg},
		}, id, "", nil)
	}
	return p, nil
}

// keyAlgorithm checks that the key parses and that alg suits it; an empty alg follows from the key.
func keyAlgorithm(pemBytes []byte, alg string) (string, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		return "", errors.New("bundle public key: no PEM block found")
	}
	var pub any
	var err error
	switch block.Type {
	case "PUBLIC KEY":
		pub, err = x509.ParsePKIXPublicKey(block.Bytes)
	case "RSA PUBLIC KEY":
		pub, err = x509.ParsePKCS1PublicKey(block.Bytes)
	case "CERTIFICATE":
		var c *x509.Certificate
		if c, err = x509.ParseCertificate(block.Bytes); err == nil {
			pub = c.PublicKey
		}
	default:
		return "", fmt.Errorf("bundle public key: PEM block %q is not a public key or certificate", block.Type)
	}
	if err != nil {
		return "", fmt.Errorf("bundle public key: %w", err)
	}
	var want []string
	switch k := pub.(type) {
	case *rsa.PublicKey:
		want = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"}
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			want = []string{"ES256"}
		case elliptic.P384():
			want = []string{"ES384"}
		case elliptic.P521():
			want = []string{"ES512"}
		}
	}
	if len(want) == 0 {
		return "", fmt.Errorf("bundle public key: %T keys are not supported (use RSA or ECDSA P-256/384/521)", pub)
	}
	if alg == "" {
		return want[0], nil
	}
	for _, w := range want {
		if alg == w {
			return alg, nil
		}
	}
	return "", fmt.Errorf("bundle signing algorithm %s does not suit the key (want one of %s)", alg, strings.Join(want, ", "))
}

// Poll downloads the bundle once, with If-None-Match, and loads it if it changed.
// changed is true when a new bundle became the policy.
func (p *BundlePoller) Poll(ctx context.Context) (changed bool, err error) {
	body, etag, notModified, err := p.download(ctx)
	if err != nil || notModified {
		return false, err
	}
	sum := sha256.Sum256(body)
	hash := hex.EncodeToString(sum[:])
	if hash == p.hash && p.e.cur.Load() != nil {
		p.etag = etag
		return false, nil // the same bytes again, from a server without ETags
	}
	src, err := readBundle(body, p.verify)
	if err != nil {
		return false, err
	}
	if src.revision == "" {
		src.revision = hash[:12]
	}
	prep, err := compile(ctx, src)
	if err != nil {
		return false, fmt.Errorf("bundle revision %s: %w", src.revision, err)
	}
	p.e.cur.Store(prep)
	p.etag, p.hash = etag, hash
	return true, nil
}

// download GETs the bundle; with the ETag of the bundle in use, a 304 is notModified.
func (p *BundlePoller) download(ctx context.Context) (body []byte, etag string, notModified bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.o.URL, nil)
	if err != nil {
		return nil, "", false, fmt.Errorf("bundle %s: %w", p.o.URL, err)
	}
	if p.etag != "" && p.e.cur.Load() != nil {
		req.Header.Set("If-None-Match", p.etag)
	}
	resp, err := p.o.Client.Do(req)
	if err != nil {
		return nil, "", false, fmt.Errorf("bundle download: %w", err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotModified && req.Header.Get("If-None-Match") != "":
		return nil, "", true, nil
	case resp.StatusCode != http.StatusOK:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, "", false, fmt.Errorf("bundle download: %s answered %s", p.o.URL, resp.Status)
	}
	body, err = io.ReadAll(io.LimitReader(resp.Body, MaxBundleSize+1))
	if err != nil {
		return nil, "", false, fmt.Errorf("bundle download: %w", err)
	}
	if len(body) > MaxBundleSize {
		return nil, "", false, fmt.Errorf("bundle download: larger than %d bytes", MaxBundleSize)
	}
	return body, resp.Header.Get("ETag"), false, nil
}

// Run polls until ctx ends: at once, then every poll interval; while no policy has loaded
// yet, sooner (from half a second, doubling up to the interval). Each change and each failure
// is reported to onReload with the revision in use afterwards, and so is the first good poll
// after failures (the bundle may be unchanged): a failure is not reported as current forever.
func (p *BundlePoller) Run(ctx context.Context, onReload func(revision string, err error)) {
	retry := minRetry
	failing := false
	for {
		changed, err := p.Poll(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil || changed || failing {
			onReload(p.e.Revision(), err)
		}
		failing = err != nil
		wait := p.o.PollInterval
		if p.e.cur.Load() == nil {
			wait, retry = min(retry, p.o.PollInterval), min(retry*2, p.o.PollInterval)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// PollBundle makes the bundle at o.URL the Engine's policy and keeps it up to date until ctx
// ends (see BundlePoller.Run). It returns at once with an error only if the options are bad.
// Use it on an Engine with no policy (new(Engine)): until the first bundle loads, every
// decision is an ErrEvaluation, so the broker fails closed.
func (e *Engine) PollBundle(ctx context.Context, o BundleOptions, onReload func(revision string, err error)) error {
	p, err := NewBundlePoller(e, o)
	if err != nil {
		return err
	}
	p.Run(ctx, onReload)
	return nil
}

// readBundle reads a bundle tarball, verifying its signature when verify is set. The
// revision is the manifest's ("" if it has none). *_test.rego files are not loaded.
func readBundle(b []byte, verify *bundle.VerificationConfig) (*source, error) {
	r := bundle.NewReader(bytes.NewReader(b)).
		WithCapabilities(Capabilities()).
		WithSizeLimitBytes(MaxBundleSize)
	if verify != nil {
		r = r.WithBundleVerificationConfig(verify)
	} else {
		r = r.WithSkipBundleVerification(true)
	}
	bdl, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	if bdl.Type() != bundle.SnapshotBundleType {
		return nil, errors.New("bundle: delta bundles are not supported")
	}
	if len(bdl.WasmModules) > 0 || len(bdl.PlanModules) > 0 {
		return nil, errors.New("bundle: Wasm and plan bundles are not supported; build it from Rego")
	}
	src := &source{data: bdl.Data, revision: bdl.Manifest.Revision}
	if src.data == nil {
		src.data = map[string]any{}
	}
	for _, m := range bdl.Modules {
		name := strings.TrimPrefix(m.Path, "/")
		if isTest(path.Base(name)) {
			continue
		}
		src.modules = append(src.modules, module{name: name, raw: m.Raw})
	}
	sort.Slice(src.modules, func(i, j int) bool { return src.modules[i].name < src.modules[j].name })
	if len(src.modules) == 0 {
		return nil, errors.New("bundle: no .rego policy files in it")
	}
	return src, nil
}

// BundleTransport is the bundle download's transport, with tlsConf's roots (nil: the system
// roots): every connection through dial (cmd/broker: upstream.Dialer.DialService, which
// follows upstream.proxy); nil dials nothing.
func BundleTransport(dial svcdial.Func, tlsConf *tls.Config) *http.Transport {
	tr := svcdial.Transport(dial, tlsConf, 10*time.Second)
	tr.ResponseHeaderTimeout = 30 * time.Second
	return tr
}
