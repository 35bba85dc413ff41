package policy

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"github.com/capbroker/capbroker/internal/svcdial/svcdialtest"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
)

// bundleServer serves one bundle at a time on 127.0.0.1, with an ETag, and can be told to fail.
type bundleServer struct {
	*httptest.Server
	mu          sync.Mutex
	body        []byte
	etag        string
	down        bool
	requests    int
	notModified int
}

func newBundleServer(t *testing.T) *bundleServer {
	s := &bundleServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.requests++
		switch {
		case s.down:
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
		case s.etag != "" && r.Header.Get("If-None-Match") == s.etag:
			s.notModified++
			w.WriteHeader(http.StatusNotModified)
		default:
			w.Header().Set("ETag", s.etag)
			w.Header().Set("Content-Type", "application/gzip")
			_, _ = w.Write(s.body)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *bundleServer) serve(body []byte, etag string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.body, s.etag, s.down = body, etag, false
}

func (s *bundleServer) setDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
}

func (s *bundleServer) counts() (requests, notModified int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests, s.notModified
}

// buildBundle writes a bundle as `opa build` does: modules, data.json, .manifest and, with
// a signing key, .signatures.json.
func buildBundle(t *testing.T, revision string, modules map[string]string, data map[string]any, sign *bundle.SigningConfig) []byte {
	t.Helper()
	b := bundle.Bundle{Manifest: bundle.Manifest{Revision: revision}, Data: data}
	if b.Data == nil {
		b.Data = map[string]any{}
	}
	for name, src := range modules {
		b.Modules = append(b.Modules, bundle.ModuleFile{URL: name, Path: name, Raw: []byte(src), Parsed: ast.MustParseModule(src)})
	}
	if sign != nil {
		if err := b.GenerateSignature(sign, "", false); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if err := bundle.NewWriter(&buf).Write(b); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// allowPolicy allows requests to the hosts in data.allowed, and says which bundle decided.
func allowPolicy(name string) map[string]string {
	return map[string]string{"/broker/broker.rego": fmt.Sprintf(`package broker

default allowed := []

allowed := data.allowed

decision := {"allow": input.request.host in allowed, "reason": %q}
`, name)}
}

func decide(t *testing.T, e *Engine) Decision {
	t.Helper()
	d, err := e.Decide(context.Background(), req())
	if err != nil {
		t.Fatalf("decide: %v", err)
	}
	return d
}

func TestBundlePollSwapsAndKeepsLastGood(t *testing.T) {
	srv := newBundleServer(t)
	ctx := context.Background()
	srv.serve(buildBundle(t, "v1", allowPolicy("one"), map[string]any{"allowed": []any{"api.example.com"}}, nil), `"v1"`)
	e := new(Engine)
	p, err := NewBundlePoller(e, BundleOptions{Dial: testDial.Dial, URL: srv.URL + "/bundles/broker.tar.gz"})
	if err != nil {
		t.Fatal(err)
	}
	before := testDial.Count()
	if changed, err := p.Poll(ctx); !changed || err != nil {
		t.Fatalf("first poll: %v %v", changed, err)
	}
	if testDial.Count() == before {
		t.Fatal("the bundle download did not dial through BundleOptions.Dial")
	}
	if d := decide(t, e); !d.Allow || d.Reason != "one" || d.Revision != "v1" || e.Revision() != "v1" {
		t.Fatalf("v1: %+v", d)
	}

	// Unchanged: the server answers 304 to If-None-Match, nothing reloads.
	if changed, err := p.Poll(ctx); changed || err != nil {
		t.Fatalf("unchanged poll: %v %v", changed, err)
	}
	if _, nm := srv.counts(); nm != 1 {
		t.Fatalf("want one 304, got %d", nm)
	}

	// A new revision swaps in, data and all.
	srv.serve(buildBundle(t, "v2", allowPolicy("two"), map[string]any{"allowed": []any{}}, nil), `"v2"`)
	if changed, err := p.Poll(ctx); !changed || err != nil {
		t.Fatalf("v2 poll: %v %v", changed, err)
	}
	if d := decide(t, e); d.Allow || d.Reason != "two" || d.Revision != "v2" {
		t.Fatalf("v2: %+v", d)
	}

	// Server down: an error, and v2 keeps serving.
	srv.setDown(true)
	if _, err := p.Poll(ctx); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("down: %v", err)
	}
	if d := decide(t, e); d.Revision != "v2" {
		t.Fatalf("after server failure: %+v", d)
	}

	// A bundle that does not compile, or is not a bundle: errors, and v2 keeps serving.
	srv.serve(buildBundle(t, "v3", map[string]string{"/broker/broker.rego": "package broker\n\ndecision := {\"allow\": http.send({})}\n"}, nil, nil), `"v3"`)
	if _, err := p.Poll(ctx); err == nil || !strings.Contains(err.Error(), "broker/broker.rego:3") {
		t.Fatalf("uncompilable bundle: %v", err)
	}
	srv.serve([]byte("<html>not a bundle</html>"), `"v4"`)
	if _, err := p.Poll(ctx); err == nil {
		t.Fatal("garbage loaded")
	}
	if d := decide(t, e); d.Revision != "v2" {
		t.Fatalf("after bad bundles: %+v", d)
	}
}

func TestBundleRevisionIsContentHashWithoutManifest(t *testing.T) {
	srv := newBundleServer(t)
	srv.serve(buildBundle(t, "", allowPolicy("x"), nil, nil), "") // no ETag either
	e := new(Engine)
	p, err := NewBundlePoller(e, BundleOptions{Dial: testDial.Dial, URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := p.Poll(context.Background()); !changed || err != nil {
		t.Fatalf("%v %v", changed, err)
	}
	if len(e.Revision()) != 12 {
		t.Fatalf("revision %q, want a 12-digit content hash", e.Revision())
	}
	// The same bytes again, without ETags: no reload.
	if changed, err := p.Poll(context.Background()); changed || err != nil {
		t.Fatalf("same bytes: %v %v", changed, err)
	}
}

func TestBundleTestFilesAreNotLoaded(t *testing.T) {
	srv := newBundleServer(t)
	mods := allowPolicy("x")
	mods["/broker/broker_test.rego"] = "package broker\n\ndecision := {\"allow\": false}\n" // would conflict
	srv.serve(buildBundle(t, "v1", mods, nil, nil), `"1"`)
	e := new(Engine)
	p, _ := NewBundlePoller(e, BundleOptions{Dial: testDial.Dial, URL: srv.URL})
	if _, err := p.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := decide(t, e); d.Reason != "x" {
		t.Fatalf("%+v", d)
	}
}

func pemKeys(t *testing.T, priv any) (privPEM, pubPEM string) {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	var pub any
	switch k := priv.(type) {
	case *rsa.PrivateKey:
		pub = &k.PublicKey
	case *ecdsa.PrivateKey:
		pub = &k.PublicKey
	}
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}))
}

func TestBundleSignatures(t *testing.T) {
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	otherKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rsaPriv, rsaPub := pemKeys(t, rsaKey)
	otherPriv, _ := pemKeys(t, otherKey)
	ecPriv, ecPub := pemKeys(t, ecKey)

	tampered := func() []byte {
		// Signed for one policy, carrying another: the file hashes do not match.
		good := bundle.Bundle{Manifest: bundle.Manifest{Revision: "v1"}, Data: map[string]any{}}
		for name, src := range allowPolicy("signed") {
			good.Modules = append(good.Modules, bundle.ModuleFile{URL: name, Path: name, Raw: []byte(src), Parsed: ast.MustParseModule(src)})
		}
		if err := good.GenerateSignature(bundle.NewSigningConfig(rsaPriv, "RS256", ""), "", false); err != nil {
			t.Fatal(err)
		}
		evil := allowPolicy("evil")["/broker/broker.rego"]
		good.Modules[0].Raw = []byte(evil)
		var buf bytes.Buffer
		if err := bundle.NewWriter(&buf).Write(good); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}

	cases := map[string]struct {
		body    []byte
		pub     string
		alg     string
		wantErr string
	}{
		"RS256 signed, verified":       {body: buildBundle(t, "v1", allowPolicy("x"), nil, bundle.NewSigningConfig(rsaPriv, "RS256", "")), pub: rsaPub},
		"ES256 signed, verified":       {body: buildBundle(t, "v1", allowPolicy("x"), nil, bundle.NewSigningConfig(ecPriv, "ES256", "")), pub: ecPub},
		"PS256 by configuration":       {body: buildBundle(t, "v1", allowPolicy("x"), nil, bundle.NewSigningConfig(rsaPriv, "PS256", "")), pub: rsaPub, alg: "PS256"},
		"signed with another key":      {body: buildBundle(t, "v1", allowPolicy("x"), nil, bundle.NewSigningConfig(otherPriv, "RS256", "")), pub: rsaPub, wantErr: "verify"},
		"unsigned when a key is set":   {body: buildBundle(t, "v1", allowPolicy("x"), nil, nil), pub: rsaPub, wantErr: "missing .signatures.json"},
		"tampered after signing":       {body: tampered(), pub: rsaPub, wantErr: "digest mismatch"},
		"signed, no key: not verified": {body: buildBundle(t, "v1", allowPolicy("x"), nil, bundle.NewSigningConfig(otherPriv, "RS256", ""))},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			srv := newBundleServer(t)
			srv.serve(c.body, `"1"`)
			e := new(Engine)
			p, err := NewBundlePoller(e, BundleOptions{Dial: testDial.Dial, URL: srv.URL, PublicKey: []byte(c.pub), Algorithm: c.alg})
			if err != nil {
				t.Fatal(err)
			}
			_, err = p.Poll(context.Background())
			if c.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if e.Revision() != "v1" {
					t.Fatalf("revision %q", e.Revision())
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("got %v, want an error containing %q", err, c.wantErr)
			}
			if _, err := e.Decide(context.Background(), req()); !errors.Is(err, ErrEvaluation) {
				t.Fatal("a bundle that does not verify was loaded")
			}
		})
	}
}

func TestBundleOptionsChecked(t *testing.T) {
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	_, ecPub := pemKeys(t, ecKey)
	cases := map[string]struct {
		o    BundleOptions
		want string
	}{
		"not http":                {o: BundleOptions{URL: "file:///etc/passwd"}, want: "must start with http"},
		"not PEM":                 {o: BundleOptions{URL: "http://x", PublicKey: []byte("hello")}, want: "no PEM block"},
		"algorithm mismatch":      {o: BundleOptions{URL: "http://x", PublicKey: []byte(ecPub), Algorithm: "RS256"}, want: "does not suit the key"},
		"private key, not public": {o: BundleOptions{URL: "http://x", PublicKey: []byte("-----BEGIN PRIVATE KEY-----\nAA==\n-----END PRIVATE KEY-----\n")}, want: "not a public key"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := NewBundlePoller(new(Engine), c.o); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %q", err, c.want)
			}
		})
	}
}

// TestPollBundleServerDownAtStart: the broker starts while the bundle server is down. Every
// decision is a policy error (never an allow) until the bundle arrives, then the poller loads it.
func TestPollBundleServerDownAtStart(t *testing.T) {
	srv := newBundleServer(t)
	srv.setDown(true)
	e := new(Engine)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reloads := make(chan error, 100)
	done := make(chan error, 1)
	go func() {
		done <- e.PollBundle(ctx, BundleOptions{Dial: testDial.Dial, URL: srv.URL, PollInterval: time.Second}, func(_ string, err error) { reloads <- err })
	}()
	if err := <-reloads; err == nil {
		t.Fatal("want a download error while the server is down")
	}
	if d, err := e.Decide(context.Background(), req()); !errors.Is(err, ErrEvaluation) || d.Allow {
		t.Fatalf("without a bundle: %+v %v", d, err)
	}
	srv.serve(buildBundle(t, "v1", allowPolicy("late"), map[string]any{"allowed": []any{"api.example.com"}}, nil), `"1"`)
	for err := range reloads {
		if err == nil {
			break
		}
	}
	if d := decide(t, e); !d.Allow || d.Revision != "v1" {
		t.Fatalf("after the bundle arrived: %+v", d)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// testDial is the bundle tests' injected dial: counted, to show the download used it.
var testDial svcdialtest.Recorder
