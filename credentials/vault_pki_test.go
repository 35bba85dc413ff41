package credentials

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"

	"github.com/capbroker/capbroker/credentials/vaulttest"
)

// TestVaultSignIntermediate: a CSR is signed as an intermediate that may sign leaves only, for
// the TTL asked, by a token that may do nothing else; a token without the capability is
// refused with an error that names what it needs; the chain is read without a token.
func TestVaultSignIntermediate(t *testing.T) {
	t.Parallel()
	srv := vaulttest.Start(t)
	root := srv.Client()
	must(t, root.Sys().Mount("pki", &api.MountInput{Type: "pki", Config: api.MountConfigInput{MaxLeaseTTL: "87600h"}}))
	gen, err := root.Logical().Write("pki/root/generate/internal", map[string]any{"common_name": "test root", "ttl": "87600h"})
	must(t, err)
	rootPEM := gen.Data["certificate"].(string)
	must(t, root.Sys().PutPolicy("pki-sign", `path "pki/root/sign-intermediate" { capabilities = ["update"] }`))
	tok, err := root.Auth().Token().Create(&api.TokenCreateRequest{Policies: []string{"pki-sign"}})
	must(t, err)
	v := startVault(t, srv.Addr, VaultAuth{Method: AuthToken, TokenFile: writeFile(t, tok.Auth.ClientToken)})
	ctx := ctxT(t)

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "ignored"}}, key)
	must(t, err)
	csr := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	si, err := v.SignIntermediate(ctx, "/pki/root/sign-intermediate", csr, "capbroker test intermediate", 90*time.Second)
	must(t, err)
	b, _ := pem.Decode([]byte(si.Certificate))
	cert, err := x509.ParseCertificate(b.Bytes)
	must(t, err)
	if !cert.IsCA || !cert.MaxPathLenZero || cert.Subject.CommonName != "capbroker test intermediate" || len(cert.DNSNames) != 0 {
		t.Errorf("intermediate: CA %v pathlen0 %v CN %q SANs %v", cert.IsCA, cert.MaxPathLenZero, cert.Subject.CommonName, cert.DNSNames)
	}
	if life := time.Until(cert.NotAfter); life > 90*time.Second || life < 80*time.Second {
		t.Errorf("intermediate lives %s, want 90s", life)
	}
	if pub, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(key.Public()) {
		t.Error("intermediate is not for the CSR's key")
	}
	if !strings.Contains(strings.Join(si.Chain, ""), strings.TrimSpace(rootPEM)) {
		t.Errorf("chain %q lacks the root", si.Chain)
	}
	chain, err := v.PKIChain(ctx, "pki", "")
	if err != nil || !strings.Contains(chain, strings.TrimSpace(rootPEM)) {
		t.Errorf("PKIChain = %q, %v", chain, err)
	}

	other, err := root.Auth().Token().Create(&api.TokenCreateRequest{Policies: []string{"default"}})
	must(t, err)
	denied := startVault(t, srv.Addr, VaultAuth{Method: AuthToken, TokenFile: writeFile(t, other.Auth.ClientToken)})
	_, err = denied.SignIntermediate(ctx, "pki/root/sign-intermediate", csr, "x", time.Minute)
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "needs update on pki/root/sign-intermediate") ||
		strings.Contains(err.Error(), other.Auth.ClientToken) {
		t.Errorf("token without the capability: %v", err)
	}
}
