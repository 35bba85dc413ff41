package certs

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestGenerateCA(t *testing.T) {
	certPEM, keyPEM, err := GenerateCA()
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := pem.Decode(keyPEM); b == nil || b.Type != "PRIVATE KEY" {
		t.Fatalf("key is not a PEM PRIVATE KEY block")
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	cert := pair.Leaf
	if !strings.HasPrefix(cert.Subject.CommonName, "capbroker CA ") || len(cert.Subject.CommonName) <= len("capbroker CA ") {
		t.Errorf("CN = %q, want capbroker CA plus a suffix", cert.Subject.CommonName)
	}
	if !cert.IsCA || !cert.BasicConstraintsValid || cert.MaxPathLen != 0 || !cert.MaxPathLenZero {
		t.Errorf("basic constraints: CA %v valid %v maxPathLen %d zero %v", cert.IsCA, cert.BasicConstraintsValid, cert.MaxPathLen, cert.MaxPathLenZero)
	}
	if cert.KeyUsage != x509.KeyUsageCertSign|x509.KeyUsageCRLSign {
		t.Errorf("KeyUsage = %b", cert.KeyUsage)
	}
	if k, ok := pair.PrivateKey.(*ecdsa.PrivateKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("key is %T, want ECDSA P-256", pair.PrivateKey)
	}
	if life := cert.NotAfter.Sub(time.Now()); life < 3650*24*time.Hour || life > 3653*24*time.Hour {
		t.Errorf("CA valid for another %v, want 10 years", life)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool(cert)}); err != nil {
		t.Errorf("CA does not verify as its own root: %v", err)
	}
}

func TestWriteCA(t *testing.T) {
	tests := map[string]struct {
		existing string // file present before WriteCA, if any
		force    bool
		wantErr  bool
	}{
		"new directory":           {},
		"refuses existing cert":   {existing: "ca.crt", wantErr: true},
		"refuses existing key":    {existing: "ca.key", wantErr: true},
		"force replaces the cert": {existing: "ca.crt", force: true},
		"force replaces the key":  {existing: "ca.key", force: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "new", "ca")
			if tc.existing != "" {
				if err := os.MkdirAll(dir, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, tc.existing), []byte("old"), 0o666); err != nil {
					t.Fatal(err)
				}
			}
			err := WriteCA(dir, tc.force)
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), tc.existing) {
					t.Fatalf("WriteCA = %v, want an error naming %s", err, tc.existing)
				}
				if names := dirNames(t, dir); len(names) != 1 || names[0] != tc.existing {
					t.Errorf("directory holds %v after refusing, want only %s", names, tc.existing)
				}
				if b, _ := os.ReadFile(filepath.Join(dir, tc.existing)); string(b) != "old" {
					t.Errorf("%s was modified", tc.existing)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.existing == "" {
				checkMode(t, dir, fs.ModeDir|0o700)
			}
			checkMode(t, filepath.Join(dir, "ca.crt"), 0o644)
			checkMode(t, filepath.Join(dir, "ca.key"), 0o600)
			if names := dirNames(t, dir); len(names) != 2 {
				t.Errorf("directory holds %v, want only ca.crt and ca.key", names)
			}
			if _, err := LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")); err != nil {
				t.Errorf("written CA does not load: %v", err)
			}
		})
	}
}

func TestWriteCAForceNewCA(t *testing.T) {
	dir := t.TempDir()
	if err := WriteCA(dir, false); err != nil {
		t.Fatal(err)
	}
	first, _ := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err := WriteCA(dir, true); err != nil {
		t.Fatal(err)
	}
	second, _ := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if bytes.Equal(first, second) {
		t.Error("force did not write a new CA")
	}
}

func TestLoadCA(t *testing.T) {
	tests := map[string]struct {
		setup   func(t *testing.T, dir string) // changes a fresh dir/ca.crt and dir/ca.key
		wantErr string                         // "" for success; "KEYFILE" stands for the key path
	}{
		"valid": {setup: func(*testing.T, string) {}},
		"key readable by group": {
			setup:   func(t *testing.T, dir string) { chmod(t, filepath.Join(dir, "ca.key"), 0o640) },
			wantErr: "KEYFILE has mode 0640: it must not be accessible by group or others",
		},
		"key writable by others": {
			setup:   func(t *testing.T, dir string) { chmod(t, filepath.Join(dir, "ca.key"), 0o602) },
			wantErr: "KEYFILE has mode 0602",
		},
		"key missing": {
			setup:   func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "ca.key")) },
			wantErr: "no such file",
		},
		"key of another CA": {
			setup: func(t *testing.T, dir string) {
				_, key, err := GenerateCA()
				if err != nil {
					t.Fatal(err)
				}
				writeFile(t, filepath.Join(dir, "ca.key"), key, 0o600)
			},
			wantErr: "private key does not match public key",
		},
		"not a CA": {
			setup: func(t *testing.T, dir string) {
				writeSelfSigned(t, dir, &x509.Certificate{
					NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
					KeyUsage: x509.KeyUsageDigitalSignature, BasicConstraintsValid: true,
				})
			},
			wantErr: "is not a CA certificate",
		},
		"CA without keyCertSign": {
			setup: func(t *testing.T, dir string) {
				writeSelfSigned(t, dir, &x509.Certificate{
					NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
					KeyUsage: x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true,
				})
			},
			wantErr: "is not a CA certificate",
		},
		"expired CA": {
			setup: func(t *testing.T, dir string) {
				writeSelfSigned(t, dir, &x509.Certificate{
					NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour),
					KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
				})
			},
			wantErr: "is valid only from",
		},
		"garbage certificate": {
			setup:   func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "ca.crt"), []byte("junk"), 0o644) },
			wantErr: "failed to find any PEM data",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := WriteCA(dir, false); err != nil {
				t.Fatal(err)
			}
			tc.setup(t, dir)
			keyFile := filepath.Join(dir, "ca.key")
			ca, err := LoadCA(filepath.Join(dir, "ca.crt"), keyFile)
			if tc.wantErr == "" {
				if err != nil || ca.Certificate() == nil {
					t.Fatalf("LoadCA = %v", err)
				}
				return
			}
			if want := strings.ReplaceAll(tc.wantErr, "KEYFILE", keyFile); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("LoadCA error = %v, want it to contain %q", err, want)
			}
		})
	}
}

// longName is a DNS name of the maximum length, 253 bytes.
var longName = strings.Repeat("abcdefghi.", 25) + "com"

func TestCacheLeaf(t *testing.T) {
	ca := testCA(t)
	tests := map[string]struct {
		host, verifyAs string
		ip             bool
	}{
		"DNS name":         {host: "api.example.com", verifyAs: "api.example.com"},
		"mixed-case name":  {host: "API.Example.COM", verifyAs: "api.example.com"},
		"IPv4":             {host: "127.0.0.1", verifyAs: "127.0.0.1", ip: true},
		"IPv6":             {host: "::1", verifyAs: "::1", ip: true},
		"IPv6 long form":   {host: "0:0:0:0:0:0:0:1", verifyAs: "::1", ip: true},
		"underscore label": {host: "_acme.example.com", verifyAs: "_acme.example.com"},
		"253-byte name":    {host: longName, verifyAs: longName},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			before := time.Now()
			cert, err := NewCache(ca, 10).Get(tc.host)
			if err != nil {
				t.Fatal(err)
			}
			leaf := cert.Leaf
			if len(cert.Certificate) != 2 || !bytes.Equal(cert.Certificate[0], leaf.Raw) || !bytes.Equal(cert.Certificate[1], ca.Certificate().Raw) {
				t.Fatal("chain is not [leaf, CA] or Leaf is not the first certificate")
			}
			opts := x509.VerifyOptions{DNSName: tc.verifyAs, Roots: pool(ca.Certificate()), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
			if _, err := leaf.Verify(opts); err != nil {
				t.Errorf("leaf does not verify as %s: %v", tc.verifyAs, err)
			}
			opts.DNSName = "other.example.com"
			if _, err := leaf.Verify(opts); err == nil {
				t.Error("leaf verifies for another host")
			}
			if tc.ip != (len(leaf.IPAddresses) == 1 && len(leaf.DNSNames) == 0) ||
				!tc.ip && (len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != tc.verifyAs) {
				t.Errorf("SANs: DNS %v, IP %v", leaf.DNSNames, leaf.IPAddresses)
			}
			wantCN := tc.verifyAs
			if len(wantCN) > 64 { // the X.509 upper bound for a CN
				wantCN = ""
			}
			if leaf.Subject.CommonName != wantCN {
				t.Errorf("CN = %q, want %q", leaf.Subject.CommonName, wantCN)
			}
			if leaf.IsCA || len(leaf.ExtKeyUsage) != 1 || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth {
				t.Errorf("IsCA %v, ExtKeyUsage %v", leaf.IsCA, leaf.ExtKeyUsage)
			}
			if k, ok := cert.PrivateKey.(*ecdsa.PrivateKey); !ok || k.Curve != elliptic.P256() {
				t.Errorf("key is %T, want ECDSA P-256", cert.PrivateKey)
			}
			if n := leaf.SerialNumber; n.Sign() <= 0 || n.BitLen() > 128 {
				t.Errorf("serial %v is not a positive 128-bit number", n)
			}
			if nb := before.Add(-time.Hour); leaf.NotBefore.After(nb) || leaf.NotBefore.Before(nb.Add(-time.Minute)) {
				t.Errorf("NotBefore = %v, want about an hour ago", leaf.NotBefore)
			}
			if life := leaf.NotAfter.Sub(before); life < 7*24*time.Hour-time.Minute || life > 7*24*time.Hour+time.Minute {
				t.Errorf("valid for another %v, want 7 days", life)
			}
		})
	}
}

func TestCacheTLSHandshake(t *testing.T) {
	ca := testCA(t)
	c := NewCache(ca, 10)
	serverConn, clientConn := net.Pipe()
	server := tls.Server(serverConn, &tls.Config{
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) { return c.Get(hello.ServerName) },
	})
	client := tls.Client(clientConn, &tls.Config{ServerName: "api.example.com", RootCAs: pool(ca.Certificate())})
	done := make(chan error, 1)
	go func() { done <- server.Handshake() }()
	if err := client.Handshake(); err != nil {
		t.Fatalf("client handshake: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("server handshake: %v", err)
	}
	client.Close()
	server.Close()
}

func TestCacheReuse(t *testing.T) {
	c := NewCache(testCA(t), 10)
	a := mustGet(t, c, "Example.COM")
	if b := mustGet(t, c, "example.com"); b != a {
		t.Error("second Get (other case) issued a new certificate")
	}
	if ip := mustGet(t, c, "::1"); mustGet(t, c, "0:0::1") != ip {
		t.Error("two spellings of ::1 issued two certificates")
	}
	if n := c.issued.Load(); n != 2 || c.Len() != 2 {
		t.Errorf("issued %d, cached %d; want 2 and 2", n, c.Len())
	}
}

// TestCacheCached: Cached says whether Get would serve a leaf from the cache, and issues
// nothing itself.
func TestCacheCached(t *testing.T) {
	now := time.Now()
	c := NewCache(testCA(t), 10)
	c.now = func() time.Time { return now }
	if c.Cached("example.com") {
		t.Fatal("an empty cache has example.com")
	}
	first := mustGet(t, c, "example.com")
	if !c.Cached("example.com") || c.issued.Load() != 1 {
		t.Fatalf("after Get: cached %v, issued %d", c.Cached("example.com"), c.issued.Load())
	}
	now = first.Leaf.NotAfter.Add(-59 * time.Minute)
	if c.Cached("example.com") {
		t.Error("a leaf due for renewal counts as cached")
	}
	if c.Cached("other.example.com") || c.issued.Load() != 1 {
		t.Errorf("Cached issued a leaf: %d", c.issued.Load())
	}
}

func TestCacheEviction(t *testing.T) {
	c := NewCache(testCA(t), 3)
	first := mustGet(t, c, "h0.example.com")
	for _, h := range []string{"h1.example.com", "h2.example.com", "h3.example.com", "h4.example.com"} {
		mustGet(t, c, h)
		if c.Len() > 3 {
			t.Fatalf("Len = %d, want <= 3", c.Len())
		}
	}
	if mustGet(t, c, "h0.example.com") == first {
		t.Error("least recently used host was not evicted")
	}
}

func TestCacheConcurrentGet(t *testing.T) {
	c := NewCache(testCA(t), 10)
	const n = 50
	start := make(chan struct{})
	certs := make(chan *tls.Certificate, n)
	for range n {
		go func() {
			<-start
			cert, err := c.Get("new.example.com")
			if err != nil {
				t.Error(err)
			}
			certs <- cert
		}()
	}
	close(start)
	first := <-certs
	for range n - 1 {
		if <-certs != first {
			t.Fatal("concurrent Gets returned different certificates")
		}
	}
	if got := c.issued.Load(); got != 1 {
		t.Errorf("issued %d certificates, want 1", got)
	}
}

func TestCacheRenewal(t *testing.T) {
	now := time.Now()
	c := NewCache(testCA(t), 10)
	c.now = func() time.Time { return now }
	first := mustGet(t, c, "example.com")

	now = now.Add(6 * 24 * time.Hour)
	if mustGet(t, c, "example.com") != first {
		t.Error("leaf reissued while it had a day left")
	}
	now = first.Leaf.NotAfter.Add(-59 * time.Minute)
	second := mustGet(t, c, "example.com")
	if second == first {
		t.Fatal("leaf not reissued with less than an hour left")
	}
	if !second.Leaf.NotAfter.After(first.Leaf.NotAfter) {
		t.Error("reissued leaf does not live longer")
	}
}

func TestCacheCAExpiry(t *testing.T) {
	ca := testCA(t)
	c := NewCache(ca, 10)
	now := ca.Certificate().NotAfter.Add(-3 * 24 * time.Hour)
	c.now = func() time.Time { return now }
	if leaf := mustGet(t, c, "example.com").Leaf; !leaf.NotAfter.Equal(ca.Certificate().NotAfter) {
		t.Errorf("leaf NotAfter %v outlives the CA's %v", leaf.NotAfter, ca.Certificate().NotAfter)
	}
	now = ca.Certificate().NotAfter
	if _, err := c.Get("other.example.com"); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "CA certificate expired") {
		t.Errorf("Get after CA expiry = %v, want CA expired error", err)
	}
	if _, err := c.Get("example.com"); !errors.Is(err, ErrUnavailable) {
		t.Errorf("cached leaf served after CA expiry: err = %v", err)
	}
}

func TestCacheInvalidHost(t *testing.T) {
	c := NewCache(testCA(t), 10)
	tests := map[string]string{
		"empty":          "",
		"too long":       strings.Repeat("abcdefghi.", 25) + "comx",
		"long label":     strings.Repeat("a", 64) + ".com",
		"brackets":       "[::1]",
		"IPv6 zone":      "fe80::1%eth0",
		"wildcard":       "*.example.com",
		"empty label":    "a..example.com",
		"trailing dot":   "example.com.",
		"space":          "exa mple.com",
		"with port":      "example.com:443",
		"non-ASCII name": "bücher.example",
	}
	for name, host := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := c.Get(host); err == nil {
				t.Errorf("Get(%q) succeeded", host)
			}
		})
	}
	if c.issued.Load() != 0 {
		t.Error("a certificate was issued for an invalid host")
	}
}

func BenchmarkCacheMiss(b *testing.B) {
	c := NewCache(testCA(b), 0)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := c.Get("h" + strconv.Itoa(i) + ".example.com"); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkCacheHit(b *testing.B) {
	c := NewCache(testCA(b), 0)
	mustGet(b, c, "example.com")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Get("example.com"); err != nil {
			b.Fatal(err)
		}
	}
}

func testCA(tb testing.TB) *CA {
	tb.Helper()
	dir := tb.TempDir()
	if err := WriteCA(dir, false); err != nil {
		tb.Fatal(err)
	}
	ca, err := LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		tb.Fatal(err)
	}
	return ca
}

func mustGet(tb testing.TB, c *Cache, host string) *tls.Certificate {
	tb.Helper()
	cert, err := c.Get(host)
	if err != nil {
		tb.Fatal(err)
	}
	return cert
}

func pool(cert *x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(cert)
	return p
}

// writeSelfSigned replaces dir/ca.crt and dir/ca.key with a self-signed certificate made
// from tmpl and a new key.
func writeSelfSigned(t *testing.T, dir string, tmpl *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = randomSerial()
	tmpl.Subject = pkix.Name{CommonName: "test"}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "ca.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	writeFile(t, filepath.Join(dir, "ca.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600)
}

func writeFile(t *testing.T, name string, data []byte, mode fs.FileMode) {
	t.Helper()
	if err := os.WriteFile(name, data, mode); err != nil {
		t.Fatal(err)
	}
	chmod(t, name, mode)
}

func chmod(t *testing.T, name string, mode fs.FileMode) {
	t.Helper()
	if err := os.Chmod(name, mode); err != nil {
		t.Fatal(err)
	}
}

func checkMode(t *testing.T, name string, want fs.FileMode) {
	t.Helper()
	st, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Mode() & (fs.ModeDir | fs.ModePerm); got != want {
		t.Errorf("%s has mode %v, want %v", name, got, want)
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
