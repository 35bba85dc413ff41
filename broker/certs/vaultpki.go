package certs

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// IntermediateRequest asks Vault's PKI engine to sign a CSR as an intermediate CA.
type IntermediateRequest struct {
	// Path is the sign-intermediate endpoint: <mount>/root/sign-intermediate or
	// <mount>/issuer/<ref>/sign-intermediate.
	Path       string
	CSR        []byte // PEM; the key never leaves the broker
	CommonName string
	TTL        time.Duration
}

// IntermediateSigner signs a CSR as an intermediate CA and returns the certificate and the
// chain above it (PEM, nearest first). cmd/broker adapts *credentials.Vault, whose client
// and token the credentials use too, and whose connections go through the broker's service
// dialer.
type IntermediateSigner interface {
	SignIntermediate(ctx context.Context, req IntermediateRequest) (certPEM string, chainPEM []string, err error)
}

// VaultPKIOptions configure a CA whose signing key lives in memory only and whose
// certificate Vault's PKI engine signs (ca.vault_pki).
type VaultPKIOptions struct {
	Signer     IntermediateSigner
	Path       string
	CommonName string
	// TTL is the life of each intermediate. It is renewed at half life; the old one keeps
	// verifying the leaves it signed, which stay cached until their refresh time.
	TTL time.Duration
	Log zerolog.Logger
}

// Bounds of the renewal schedule.
const (
	maxExpiryMargin = 10 * time.Minute // longest time before NotAfter an intermediate stops signing
	retryMin        = time.Second      // first wait after a failed renewal
	retryMax        = time.Minute      // longest wait between failed renewals
)

// vaultPKI renews a CA's intermediate.
type vaultPKI struct {
	opts VaultPKIOptions
	log  zerolog.Logger
	now  func() time.Time

	mu       sync.Mutex
	lastErr  string        // why the last renewal failed, "" after a good one
	renewAt  time.Time     // when the current intermediate is replaced
	renewals int           // intermediates signed since start
	took     time.Duration // how long the last good renewal took (key, CSR, Vault, checks)
}

// StartVaultPKI has Vault sign a first intermediate, then renews it in the background at half
// life until ctx ends. It returns at once when the first signing fails: the CA cannot sign
// (Ready says why, nothing is intercepted) and signing is retried in the background. The key
// of each intermediate is generated in memory and never written anywhere; there is no fallback
// to a key on disk.
func StartVaultPKI(ctx context.Context, o VaultPKIOptions) (*CA, error) {
	if o.Signer == nil || o.Path == "" || o.TTL <= 0 {
		return nil, errors.New("certs: vault_pki needs a signer, a path and a ttl")
	}
	p := &vaultPKI{opts: o, log: o.Log.With().Str("component", "ca").Logger(), now: time.Now}
	ca := &CA{pki: p}
	ok := p.renew(ctx, ca)
	go p.run(ctx, ca, ok)
	return ca, nil
}

// run renews the intermediate at half life; after a failure it retries with backoff, up to a
// tenth of the TTL between attempts (at least a second, at most a minute), for as long as it
// takes: the CA signs again as soon as one succeeds.
func (p *vaultPKI) run(ctx context.Context, ca *CA, ok bool) {
	retry := retryMin
	retryCap := max(retryMin, min(retryMax, p.opts.TTL/10))
	for {
		wait := retry
		if ok {
			retry = retryMin
			p.mu.Lock()
			wait = p.renewAt.Sub(p.now())
			p.mu.Unlock()
		} else {
			retry = min(2*retry, retryCap)
		}
		t := time.NewTimer(max(wait, 0))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		ok = p.renew(ctx, ca)
	}
}

// renew signs a new intermediate and makes it the CA's current one. The one it replaces is
// dropped from the CA only: each cached leaf holds its own chain.
func (p *vaultPKI) renew(ctx context.Context, ca *CA) bool {
	start := p.now()
	is, err := p.sign(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.lastErr = err.Error()
		until := "none yet"
		if cur := ca.cur.Load(); cur != nil {
			until = cur.until.UTC().Format(time.RFC3339)
		}
		p.log.Error().Err(err).Str("signs_until", until).
			Msg("CA intermediate not renewed; the current one signs until it nears expiry, then nothing is intercepted")
		return false
	}
	ca.cur.Store(is)
	got := p.now()
	p.lastErr, p.took = "", got.Sub(start)
	p.renewAt = got.Add(is.cert.NotAfter.Sub(got) / 2)
	p.renewals++
	p.log.Info().Str("serial", hex.EncodeToString(is.cert.SerialNumber.Bytes())).
		Time("not_after", is.cert.NotAfter).Time("renew_at", p.renewAt).Dur("took", p.took).
		Msg("CA intermediate signed by Vault's PKI engine")
	return true
}

func (p *vaultPKI) lastError() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lastErr == "" {
		return "not signed yet"
	}
	return p.lastErr
}

// sign generates a key in memory, has Vault sign its CSR, and checks what comes back: a CA
// certificate for this key, currently valid, signed by the first certificate of the chain.
func (p *vaultPKI) sign(ctx context.Context) (*issuer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	csrDER, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: p.opts.CommonName, Organization: []string{"capbroker"}},
	}, key)
	if err != nil {
		return nil, err
	}
	certPEM, chainPEM, err := p.opts.Signer.SignIntermediate(ctx, IntermediateRequest{
		Path: p.opts.Path, CSR: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csrDER}),
		CommonName: p.opts.CommonName, TTL: p.opts.TTL,
	})
	if err != nil {
		return nil, err
	}
	cert, err := parseOne(certPEM)
	if err != nil {
		return nil, fmt.Errorf("vault's certificate: %w", err)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(key.Public()) {
		return nil, errors.New("vault's certificate is not for the key the broker sent")
	}
	if !cert.BasicConstraintsValid || !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("vault's certificate is not a CA certificate (use a sign-intermediate endpoint)")
	}
	now := p.now()
	if now.Before(cert.NotBefore) || !now.Before(cert.NotAfter) {
		return nil, fmt.Errorf("vault's certificate is valid only from %s to %s", cert.NotBefore, cert.NotAfter)
	}
	var pool []*x509.Certificate
	for i, c := range chainPEM {
		parsed, err := parseOne(c)
		if err != nil {
			return nil, fmt.Errorf("vault's CA chain, certificate %d: %w", i, err)
		}
		if !parsed.Equal(cert) { // some versions list the new certificate in its own chain
			pool = append(pool, parsed)
		}
	}
	// From the new certificate up, each one's issuer, until a root or the end of what Vault
	// gave; the root is left out (the agents have it).
	issuerIn := func(cur *x509.Certificate) *x509.Certificate {
		for _, c := range pool {
			if bytes.Equal(c.RawSubject, cur.RawIssuer) && cur.CheckSignatureFrom(c) == nil {
				return c
			}
		}
		return nil
	}
	up := issuerIn(cert)
	if up == nil {
		return nil, errors.New("vault's certificate is not signed by any certificate of the chain it returned")
	}
	der := [][]byte{cert.Raw}
	for ; up != nil && !selfSigned(up) && len(der) <= len(pool); up = issuerIn(up) {
		der = append(der, up.Raw)
	}
	life := cert.NotAfter.Sub(now)
	return &issuer{cert: cert, key: key, chain: der, until: cert.NotAfter.Add(-min(maxExpiryMargin, life/10))}, nil
}

func parseOne(s string) (*x509.Certificate, error) {
	b, _ := pem.Decode([]byte(s))
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, errors.New("not a PEM certificate")
	}
	return x509.ParseCertificate(b.Bytes)
}

func selfSigned(c *x509.Certificate) bool {
	return bytes.Equal(c.RawIssuer, c.RawSubject) && c.CheckSignatureFrom(c) == nil
}

// Status is the CA's state, for /readyz.
type Status struct {
	Source   string // "file" or "vault_pki"
	Error    string // why the CA cannot sign now, "" when it can
	Serial   string // of the current signing certificate, hex
	NotAfter time.Time
	// vault_pki only: when the current intermediate is renewed, how many were signed since
	// start, how long the last one took, and why the last renewal failed.
	RenewAt     time.Time
	Renewals    int
	RenewTook   time.Duration
	RenewFailed string
}

// Status reports the CA's state.
func (ca *CA) Status() Status {
	st := Status{Source: "file"}
	if err := ca.Ready(); err != nil {
		st.Error = err.Error()
	}
	if is := ca.cur.Load(); is != nil {
		st.Serial, st.NotAfter = hex.EncodeToString(is.cert.SerialNumber.Bytes()), is.cert.NotAfter
	}
	if p := ca.pki; p != nil {
		p.mu.Lock()
		st.Source, st.RenewAt, st.Renewals, st.RenewTook, st.RenewFailed = "vault_pki", p.renewAt, p.renewals, p.took, p.lastErr
		p.mu.Unlock()
	}
	return st
}

// Roots returns, PEM-encoded, the self-signed CA certificates among chainPEM's: the roots
// agents are to trust. It fails when there is none.
func Roots(chainPEM []byte) ([]byte, error) {
	var out []byte
	for rest := chainPEM; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if b.Type != "CERTIFICATE" || err != nil || !c.IsCA || !selfSigned(c) || bytes.Contains(out, pem.EncodeToMemory(b)) {
			continue
		}
		out = append(out, pem.EncodeToMemory(b)...)
	}
	if out == nil {
		return nil, errors.New("certs: the chain holds no self-signed root")
	}
	return out, nil
}

// CheckVaultPKI has Vault sign one intermediate as StartVaultPKI would, checks it and drops
// it with its key: for check-config.
func CheckVaultPKI(ctx context.Context, o VaultPKIOptions) error {
	p := &vaultPKI{opts: o, now: time.Now}
	_, err := p.sign(ctx)
	return err
}
