// Package certs is the broker's certificate authority: creating and loading it (a file CA), or
// having Vault's PKI engine sign a short-lived intermediate whose key stays in memory
// (vaultpki.go), and issuing the leaf certificates presented to agents inside intercepted
// tunnels.
package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// CA is what signs the broker's leaves: a file CA (LoadCA), fixed for the life of the
// process, or a Vault-signed intermediate that is replaced as it ages (StartVaultPKI). It is
// safe for concurrent use.
type CA struct {
	cur atomic.Pointer[issuer] // nil until a vault_pki CA has its first intermediate
	pki *vaultPKI              // nil for a file CA
}

// issuer is one signing certificate and key, and the chain sent with each leaf it signs.
type issuer struct {
	cert  *x509.Certificate
	key   crypto.Signer
	chain [][]byte // cert.Raw, then the CAs above it that are not self-signed roots
	// until is when it stops signing, and when the leaves it signed are no longer served:
	// its NotAfter for a file CA, a little before for an intermediate (vaultpki.go).
	until time.Time
}

// ErrUnavailable is returned, wrapped, while the CA cannot sign: a vault_pki CA without a
// current intermediate (never signed yet, or expiring and not renewed), or an expired file CA.
// Nothing is intercepted then.
var ErrUnavailable = errors.New("the broker's CA cannot sign certificates")

// Certificate returns the current signing certificate, nil while there is none.
func (ca *CA) Certificate() *x509.Certificate {
	if is := ca.cur.Load(); is != nil {
		return is.cert
	}
	return nil
}

// signer returns the issuer that signs at now, or an error matching ErrUnavailable.
func (ca *CA) signer(now time.Time) (*issuer, error) {
	is := ca.cur.Load()
	switch {
	case is == nil && ca.pki != nil:
		return nil, fmt.Errorf("%w: no intermediate from Vault's PKI engine yet: %s", ErrUnavailable, ca.pki.lastError())
	case is == nil:
		return nil, ErrUnavailable
	case !now.Before(is.until) && ca.pki != nil:
		return nil, fmt.Errorf("%w: the intermediate from Vault's PKI engine expires at %s and could not be renewed: %s",
			ErrUnavailable, is.cert.NotAfter.UTC().Format(time.RFC3339), ca.pki.lastError())
	case !now.Before(is.until):
		return nil, fmt.Errorf("%w: the CA certificate expired at %s", ErrUnavailable, is.cert.NotAfter.UTC().Format(time.RFC3339))
	}
	return is, nil
}

// Ready returns nil when the CA can sign now, else why not (matching ErrUnavailable).
func (ca *CA) Ready() error {
	now := time.Now
	if ca.pki != nil {
		now = ca.pki.now // a test's clock
	}
	_, err := ca.signer(now())
	return err
}

// GenerateCA creates a self-signed ECDSA P-256 CA named "capbroker CA <random suffix>",
// valid for 10 years, that may sign leaf certificates only (path length 0). It returns the
// certificate and the PKCS#8 private key, both PEM-encoded.
func GenerateCA() (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	suffix := make([]byte, 4)
	rand.Read(suffix) // crypto/rand.Read never fails; it crashes the program instead
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "capbroker CA " + hex.EncodeToString(suffix), Organization: []string{"capbroker"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// randomSerial returns a random 128-bit serial number.
func randomSerial() *big.Int {
	b := make([]byte, 16)
	rand.Read(b)
	return new(big.Int).SetBytes(b)
}

// ErrExists is returned by WriteCA when it would replace a CA without force.
var ErrExists = errors.New("a CA already exists here; refusing to replace it")

// WriteCA generates a CA and writes dir/ca.crt (mode 0644) and dir/ca.key (mode 0600),
// creating dir with mode 0700 if needed. Unless force is set, it refuses, without touching
// anything, when either file exists. Each file is written under a temporary name with its
// final mode and then renamed into place, so a reader never sees a partial file.
func WriteCA(dir string, force bool) error {
	crt, key := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	if !force {
		for _, p := range []string{crt, key} {
			if _, err := os.Lstat(p); err == nil {
				return fmt.Errorf("certs: %s: %w", p, ErrExists)
			} else if !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("certs: %w", err)
			}
		}
	}
	certPEM, keyPEM, err := GenerateCA()
	if err != nil {
		return fmt.Errorf("certs: generate CA: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	// The key goes first: a crash in between leaves a key that does not match the old
	// certificate, which LoadCA rejects, rather than a certificate without its key.
	if err := writeAtomic(key, keyPEM, 0o600); err != nil {
		return err
	}
	return writeAtomic(crt, certPEM, 0o644)
}

// writeAtomic writes data to a temporary file in path's directory, sets mode, syncs and
// renames it to path.
func writeAtomic(path string, data []byte, mode fs.FileMode) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*") // mode 0600
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
			err = fmt.Errorf("certs: write %s: %w", path, err)
		}
	}()
	if err := f.Chmod(mode); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// LoadCA reads a PEM certificate and private key. The key file must not be accessible by
// group or others, the key must match the certificate, and the certificate must be a CA
// (basicConstraints CA:true and keyCertSign) that is currently valid.
func LoadCA(certFile, keyFile string) (*CA, error) {
	keyPEM, err := readPrivate(keyFile)
	if err != nil {
		return nil, err
	}
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("certs: CA certificate: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM) // checks that the key matches
	if err != nil {
		return nil, fmt.Errorf("certs: CA certificate %s and key %s: %w", certFile, keyFile, err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("certs: CA certificate %s: %w", certFile, err)
	}
	if !cert.BasicConstraintsValid || !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("certs: %s is not a CA certificate (needs basicConstraints CA:true and keyUsage keyCertSign)", certFile)
	}
	if now := time.Now(); now.Before(cert.NotBefore) || !now.Before(cert.NotAfter) {
		return nil, fmt.Errorf("certs: CA certificate %s is valid only from %s to %s", certFile, cert.NotBefore, cert.NotAfter)
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("certs: CA key %s cannot sign", keyFile)
	}
	ca := &CA{}
	ca.cur.Store(&issuer{cert: cert, key: key, chain: [][]byte{cert.Raw}, until: cert.NotAfter})
	return ca, nil
}

// readPrivate reads a regular file that group and others cannot access. The mode is checked
// on the opened file, so it is the mode of the bytes that are read.
func readPrivate(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("certs: CA key: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("certs: CA key: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("certs: CA key %s is not a regular file", name)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("certs: CA key %s has mode %04o: it must not be accessible by group or others (chmod 600 %s)", name, perm, name)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("certs: CA key: %w", err)
	}
	return b, nil
}
