package certs

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// fakePKI signs CSRs as Vault's PKI engine would, with a root of its own, or misbehaves as
// told. Its clock is the test's.
type fakePKI struct {
	root    *x509.Certificate
	rootKey *ecdsa.PrivateKey
	pool    *x509.CertPool

	mu      sync.Mutex
	now     time.Time
	fail    error                            // returned instead of signing
	tamper  func(tmpl *x509.Certificate) any // may change the template; returns another public key to sign, or nil
	chain   func(root, cert string) []string // the chain returned; nil: [root]
	lastReq IntermediateRequest              // the last request
}

func newFakePKI(t testing.TB) *fakePKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fake vault root"},
		NotBefore: now.Add(-24 * time.Hour), NotAfter: now.AddDate(10, 0, 0),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(root)
	return &fakePKI{root: root, rootKey: key, pool: pool, now: now}
}

func (f *fakePKI) clock() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakePKI) advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

func (f *fakePKI) set(fn func(f *fakePKI)) {
	f.mu.Lock()
	fn(f)
	f.mu.Unlock()
}

func (f *fakePKI) SignIntermediate(_ context.Context, req IntermediateRequest) (string, []string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastReq = req
	if f.fail != nil {
		return "", nil, f.fail
	}
	b, _ := pem.Decode(req.CSR)
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return "", nil, err
	}
	if err := csr.CheckSignature(); err != nil {
		return "", nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(), Subject: pkix.Name{CommonName: req.CommonName},
		NotBefore: f.now.Add(-30 * time.Second), NotAfter: f.now.Add(req.TTL),
		IsCA: true, BasicConstraintsValid: true, MaxPathLen: 0, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	pub := csr.PublicKey
	if f.tamper != nil {
		if other := f.tamper(tmpl); other != nil {
			pub = other
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, f.root, pub, f.rootKey)
	if err != nil {
		return "", nil, err
	}
	certPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	rootPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.root.Raw}))
	if f.chain != nil {
		return certPEM, f.chain(rootPEM, certPEM), nil
	}
	return certPEM, []string{rootPEM}, nil
}

// newFakeVaultCA is a vault_pki CA on f's clock, with its first intermediate signed.
func newFakeVaultCA(t testing.TB, f *fakePKI, ttl time.Duration) (*CA, *vaultPKI) {
	t.Helper()
	p := &vaultPKI{opts: VaultPKIOptions{Signer: f, Path: "pki/root/sign-intermediate", CommonName: "capbroker test", TTL: ttl},
		log: zerolog.Nop(), now: f.clock}
	ca := &CA{pki: p}
	if !p.renew(context.Background(), ca) {
		t.Fatalf("first intermediate: %s", p.lastError())
	}
	return ca, p
}

// verifyAt checks cert's chain against f's root alone, at now, for host.
func verifyAt(t *testing.T, f *fakePKI, cert *tls.Certificate, host string, now time.Time) {
	t.Helper()
	inter := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		inter.AddCert(c)
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: f.pool, Intermediates: inter, CurrentTime: now}); err != nil {
		t.Fatalf("leaf for %s does not verify against the root: %v", host, err)
	}
}

func issuerOf(t *testing.T, cert *tls.Certificate) *x509.Certificate {
	t.Helper()
	if len(cert.Certificate) != 2 {
		t.Fatalf("chain of %d certificates, want leaf and intermediate", len(cert.Certificate))
	}
	c, err := x509.ParseCertificate(cert.Certificate[1])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestVaultPKIRenewalKeepsCachedLeaves: after a renewal, a cached leaf is still served with
// the chain of the intermediate that signed it (and verifies), a new host gets the new
// intermediate, and the cached leaf is issued again from the new one at its refresh time.
func TestVaultPKIRenewalKeepsCachedLeaves(t *testing.T) {
	f := newFakePKI(t)
	const ttl = time.Hour
	ca, p := newFakeVaultCA(t, f, ttl)
	if got := f.lastReq; got.Path != "pki/root/sign-intermediate" || got.TTL != ttl || got.CommonName != "capbroker test" {
		t.Fatalf("request %+v", got)
	}
	c := NewCache(ca, 10)
	c.now = f.clock
	old := mustGet(t, c, "a.example")
	inter1 := issuerOf(t, old)
	if !inter1.Equal(ca.Certificate()) {
		t.Fatal("leaf not signed by the current intermediate")
	}
	verifyAt(t, f, old, "a.example", f.clock())
	if want := p.now().Add(ttl / 2); p.renewAt.Sub(want).Abs() > time.Second { // NotAfter has whole seconds
		t.Fatalf("renew at %v, want half life %v", p.renewAt, want)
	}

	f.advance(ttl / 2)
	if !p.renew(context.Background(), ca) {
		t.Fatal(p.lastError())
	}
	if ca.Certificate().Equal(inter1) {
		t.Fatal("renewal kept the old intermediate")
	}
	if got := mustGet(t, c, "a.example"); got != old {
		t.Fatal("cached leaf of the old intermediate not served after the renewal")
	}
	verifyAt(t, f, old, "a.example", f.clock())
	fresh := mustGet(t, c, "b.example")
	if !issuerOf(t, fresh).Equal(ca.Certificate()) {
		t.Fatal("a new host's leaf is not signed by the new intermediate")
	}
	verifyAt(t, f, fresh, "b.example", f.clock())

	// The old leaf lives until the old intermediate's NotAfter; it is issued again a quarter
	// of its life before that.
	f.advance(ttl/4 + time.Second)
	again := mustGet(t, c, "a.example")
	if again == old || !issuerOf(t, again).Equal(ca.Certificate()) {
		t.Fatal("leaf of the old intermediate not issued again from the new one at its refresh time")
	}
	if st := ca.Status(); st.Source != "vault_pki" || st.Renewals != 2 || st.Error != "" {
		t.Fatalf("status %+v", st)
	}
}

// TestVaultPKILapses: with Vault failing, the current intermediate signs until a tenth of its
// life is left; then nothing is issued or served, Ready says why, and a later renewal brings
// the CA back.
func TestVaultPKILapses(t *testing.T) {
	f := newFakePKI(t)
	const ttl = 100 * time.Second
	ca, p := newFakeVaultCA(t, f, ttl)
	c := NewCache(ca, 10)
	c.now = f.clock
	mustGet(t, c, "cached.example")
	f.set(func(f *fakePKI) { f.fail = errors.New("vault answered 503: sealed") })
	f.advance(ttl / 2)
	if p.renew(context.Background(), ca) {
		t.Fatal("renewal succeeded with vault failing")
	}
	f.advance(ttl*4/10 - time.Second) // 1s before the intermediate stops signing
	if err := c.Ready(); err != nil {
		t.Fatalf("not ready with the intermediate still signing: %v", err)
	}
	mustGet(t, c, "late.example")
	f.advance(time.Second)
	err := c.Ready()
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "sealed") {
		t.Fatalf("Ready past the intermediate's life = %v", err)
	}
	for _, host := range []string{"cached.example", "late.example", "new.example"} {
		if _, err := c.Get(host); !errors.Is(err, ErrUnavailable) {
			t.Errorf("Get(%s) past the intermediate's life = %v, want ErrUnavailable", host, err)
		}
	}
	if st := ca.Status(); st.Error == "" || st.RenewFailed == "" {
		t.Fatalf("status %+v", st)
	}
	f.set(func(f *fakePKI) { f.fail = nil })
	if !p.renew(context.Background(), ca) {
		t.Fatal(p.lastError())
	}
	if err := c.Ready(); err != nil {
		t.Fatalf("not ready after a renewal: %v", err)
	}
	verifyAt(t, f, mustGet(t, c, "cached.example"), "cached.example", f.clock())
}

// TestVaultPKIRefusesBadCertificates: what a hostile or misconfigured Vault returns is never
// made the CA.
func TestVaultPKIRefusesBadCertificates(t *testing.T) {
	otherKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	stranger := newFakePKI(t)
	strangerPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: stranger.root.Raw}))
	tests := map[string]struct {
		setup func(f *fakePKI)
		want  string
	}{
		"another key": {func(f *fakePKI) {
			f.tamper = func(*x509.Certificate) any { return otherKey.Public() }
		}, "not for the key"},
		"not a CA": {func(f *fakePKI) {
			f.tamper = func(c *x509.Certificate) any {
				c.IsCA, c.MaxPathLenZero, c.KeyUsage = false, false, x509.KeyUsageDigitalSignature
				return nil
			}
		}, "not a CA certificate"},
		"expired": {func(f *fakePKI) {
			f.tamper = func(c *x509.Certificate) any { c.NotAfter = f.now.Add(-time.Second); return nil }
		}, "valid only"},
		"chain of another root": {func(f *fakePKI) {
			f.chain = func(string, string) []string { return []string{strangerPEM} }
		}, "not signed by any certificate"},
		"no chain": {func(f *fakePKI) {
			f.chain = func(string, string) []string { return nil }
		}, "not signed by any certificate"},
		"chain of garbage": {func(f *fakePKI) {
			f.chain = func(string, string) []string { return []string{"not pem"} }
		}, "not a PEM certificate"},
		"vault fails": {func(f *fakePKI) { f.fail = errors.New("permission denied") }, "permission denied"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFakePKI(t)
			tc.setup(f)
			p := &vaultPKI{opts: VaultPKIOptions{Signer: f, Path: "pki/root/sign-intermediate", TTL: time.Hour}, log: zerolog.Nop(), now: f.clock}
			ca := &CA{pki: p}
			if p.renew(context.Background(), ca) {
				t.Fatal("renewal accepted")
			}
			err := ca.Ready()
			if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Ready = %v, want %q", err, tc.want)
			}
			if ca.Certificate() != nil {
				t.Fatal("a refused certificate became the CA")
			}
		})
	}
}

// TestVaultPKIChainOrder: the chain sent is built by issuer whatever order Vault lists it in,
// the new certificate itself left out, down to the root, which is left out too.
func TestVaultPKIChainOrder(t *testing.T) {
	f := newFakePKI(t)
	f.chain = func(root, cert string) []string { return []string{cert, root} }
	ca, _ := newFakeVaultCA(t, f, time.Hour)
	c := NewCache(ca, 10)
	c.now = f.clock
	leaf := mustGet(t, c, "a.example")
	issuerOf(t, leaf) // leaf and intermediate only
	verifyAt(t, f, leaf, "a.example", f.clock())
}

// TestStartVaultPKI: the background loop retries a failed first signing and renews at half
// life, on the real clock.
func TestStartVaultPKI(t *testing.T) {
	f := newFakePKI(t)
	f.fail = errors.New("vault is sealed")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ca, err := StartVaultPKI(ctx, VaultPKIOptions{Signer: realTime{f}, Path: "pki/root/sign-intermediate", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Ready(); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "sealed") {
		t.Fatalf("Ready with vault sealed = %v", err)
	}
	f.set(func(f *fakePKI) { f.fail = nil })
	deadline := time.Now().Add(20 * time.Second)
	for ca.Status().Renewals < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("no renewals: %+v", ca.Status())
		}
		time.Sleep(20 * time.Millisecond) // a poll interval, not a synchronisation
	}
	if err := ca.Ready(); err != nil {
		t.Fatal(err)
	}
	if _, err := StartVaultPKI(ctx, VaultPKIOptions{Path: "x", TTL: time.Second}); err == nil {
		t.Fatal("StartVaultPKI without a signer")
	}
}

// realTime is a fakePKI on the real clock.
type realTime struct{ f *fakePKI }

func (r realTime) SignIntermediate(ctx context.Context, req IntermediateRequest) (string, []string, error) {
	r.f.set(func(f *fakePKI) { f.now = time.Now() })
	return r.f.SignIntermediate(ctx, req)
}

func TestRoots(t *testing.T) {
	f := newFakePKI(t)
	ca, _ := newFakeVaultCA(t, f, time.Hour)
	rootPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.root.Raw})
	interPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Certificate().Raw})
	got, err := Roots(append(append(append([]byte{}, interPEM...), rootPEM...), rootPEM...))
	if err != nil || string(got) != string(rootPEM) {
		t.Fatalf("Roots = %q, %v; want the root once", got, err)
	}
	if _, err := Roots(interPEM); err == nil {
		t.Fatal("Roots of an intermediate alone succeeded")
	}
}

// BenchmarkLeafIssue: the cost of a leaf (a cache miss) from a file CA and from a
// Vault-signed intermediate; the broker signs both with an in-memory P-256 key.
func BenchmarkLeafIssue(b *testing.B) {
	fileCA := testCA(b)
	vaultCA, _ := newFakeVaultCA(b, newFakePKI(b), time.Hour)
	for name, ca := range map[string]*CA{"file": fileCA, "vault_pki": vaultCA} {
		b.Run(name, func(b *testing.B) {
			c := NewCache(ca, 10)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.issue("bench.example", netip.Addr{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAgentHandshake: an agent's TLS handshake with a cached leaf, verifying it against
// its one root: the file CA's leaf is one signature from the root, the vault_pki leaf two (and
// one more certificate on the wire).
func BenchmarkAgentHandshake(b *testing.B) {
	fileCA := testCA(b)
	f := newFakePKI(b)
	vaultCA, _ := newFakeVaultCA(b, f, time.Hour)
	filePool := x509.NewCertPool()
	filePool.AddCert(fileCA.Certificate())
	for _, tc := range []struct {
		name  string
		ca    *CA
		roots *x509.CertPool
	}{{"file", fileCA, filePool}, {"vault_pki", vaultCA, f.pool}} {
		b.Run(tc.name, func(b *testing.B) {
			c := NewCache(tc.ca, 10)
			leaf := mustGet(b, c, "bench.example")
			srvConf := &tls.Config{Certificates: []tls.Certificate{*leaf}}
			cliConf := &tls.Config{ServerName: "bench.example", RootCAs: tc.roots}
			b.ReportAllocs()
			for b.Loop() {
				cc, sc := net.Pipe()
				done := make(chan error, 1)
				go func() { done <- tls.Server(sc, srvConf).Handshake() }()
				if err := tls.Client(cc, cliConf).Handshake(); err != nil {
					b.Fatal(err)
				}
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				cc.Close()
				sc.Close()
			}
		})
	}
}

// BenchmarkVaultPKIRenew: the broker's part of a renewal (key, CSR, checking what comes back,
// building the chain) against an in-process signer; Vault's round trip comes on top
// (TestVaultPKI logs a real one).
func BenchmarkVaultPKIRenew(b *testing.B) {
	f := newFakePKI(b)
	ca, p := newFakeVaultCA(b, f, time.Hour)
	b.ReportAllocs()
	for b.Loop() {
		if !p.renew(context.Background(), ca) {
			b.Fatal(p.lastError())
		}
	}
}
