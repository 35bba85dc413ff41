// Package testpki makes the throwaway certificate authorities of the tests' TLS servers and
// clients: a CA, its certificate as PEM and in a file, a pool that trusts it, and leaves it
// signs, for servers on loopback names and for clients.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// PKI is a CA valid from an hour ago for a day.
type PKI struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA certificate; File holds it, in a directory the test removes.
	PEM  []byte
	File string
	// Pool trusts the CA alone.
	Pool *x509.CertPool
	// Leaf is a server certificate for 127.0.0.1 and localhost.
	Leaf   tls.Certificate
	serial atomic.Int64
}

// New makes a CA named name and its loopback leaf.
func New(t testing.TB, name string) *PKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	p := &PKI{Cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), Pool: x509.NewCertPool()}
	p.Pool.AddCert(cert)
	p.serial.Store(1)
	p.File = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(p.File, p.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	p.Leaf = p.Server(t, time.Now().Add(24*time.Hour), "localhost", "127.0.0.1")
	return p
}

// Server issues a server certificate for names (DNS names or IP addresses), valid until
// notAfter and from two days before it.
func (p *PKI) Server(t testing.TB, notAfter time.Time, names ...string) tls.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{
		Subject: pkix.Name{CommonName: names[0]}, NotBefore: notAfter.Add(-48 * time.Hour), NotAfter: notAfter,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	return p.issue(t, tmpl)
}

// Client issues a client certificate whose common name is name.
func (p *PKI) Client(t testing.TB, name string) tls.Certificate {
	t.Helper()
	return p.issue(t, &x509.Certificate{
		Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	})
}

func (p *PKI) issue(t testing.TB, tmpl *x509.Certificate) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = big.NewInt(p.serial.Add(1))
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.Cert, &key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
