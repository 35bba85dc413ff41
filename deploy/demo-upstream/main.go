// Command demo-upstream is the API in the docker-compose demo: an HTTPS server with its own CA
// that answers every request under /v1/ with what it received (method, path, headers), and
// says whether the API key it expects arrived. It plays a third-party API: it knows the key
// (it "issued" it), the agent does not, and the broker injects it.
//
// On first start it creates a CA and a server certificate for -names under -pki and writes
// the CA certificate there as ca.crt, for the broker's upstream.ca_file. The CA key is never
// written: the server certificate is all it needs.
//
//	demo-upstream -listen :8443 -pki /pki -names api.demo.test -key-file /demo-api-key/api_key
//	demo-upstream -healthcheck -listen :8443 -pki /pki   (exit 0 when the server answers over TLS)
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo-upstream:", err)
		os.Exit(1)
	}
}

type options struct {
	listen, pki, names, keyFile string
	healthcheck                 bool
}

func run(args []string, stdout io.Writer) error {
	var o options
	fs := flag.NewFlagSet("demo-upstream", flag.ContinueOnError)
	fs.StringVar(&o.listen, "listen", ":8443", "address to serve HTTPS on")
	fs.StringVar(&o.pki, "pki", "./pki", "folder for ca.crt, tls.crt and tls.key (created on first start)")
	fs.StringVar(&o.names, "names", "api.demo.test,localhost", "comma-separated DNS names and IPs for the server certificate")
	fs.StringVar(&o.keyFile, "key-file", "", "file holding the API key this server expects (read at every request)")
	fs.BoolVar(&o.healthcheck, "healthcheck", false, "check that a server on -listen answers over TLS with the -pki CA, then exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.healthcheck {
		return healthcheck(o)
	}
	cert, err := ensurePKI(o.pki, strings.Split(o.names, ","))
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	logger := log.New(stdout, "", log.LstdFlags)
	logger.Printf("demo API listening on https://%s (CA %s)", ln.Addr(), filepath.Join(o.pki, "ca.crt"))
	srv := &http.Server{
		Handler:           &api{keyFile: o.keyFile, log: logger},
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
	}
	return srv.ServeTLS(ln, "", "")
}

// api answers /healthz without authentication and everything else with what it received.
type api struct {
	keyFile string
	log     *log.Logger
}

// received is the JSON the demo API answers with.
type received struct {
	Authenticated bool              `json:"authenticated"`
	Message       string            `json:"message"`
	Method        string            `json:"method"`
	Path          string            `json:"path"`
	Headers       map[string]string `json:"received_headers"`
}

func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/healthz" {
		fmt.Fprintln(w, "ok")
		return
	}
	out := received{Method: r.Method, Path: r.URL.Path, Headers: map[string]string{}}
	for name, values := range r.Header {
		out.Headers[name] = strings.Join(values, ", ")
	}
	status := http.StatusOK
	key, err := a.expectedKey()
	auth := r.Header.Get("Authorization")
	switch {
	case err != nil:
		status, out.Message = http.StatusServiceUnavailable, "this API has no key provisioned yet (vault-seed writes it)"
	case subtle.ConstantTimeCompare([]byte(auth), []byte("Bearer "+key)) == 1:
		out.Authenticated, out.Message = true, "the request carried this API's key"
	default:
		status, out.Message = http.StatusUnauthorized, "missing or wrong API key"
	}
	// The log shows that the key arrived without printing it whole.
	a.log.Printf("%s %s from %s: status %d, authenticated=%v, Authorization=%q, headers=%s",
		r.Method, r.URL.Path, r.RemoteAddr, status, out.Authenticated, mask(auth), headerNames(r.Header))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
}

func (a *api) expectedKey() (string, error) {
	if a.keyFile == "" {
		return "", errors.New("no -key-file")
	}
	b, err := os.ReadFile(a.keyFile)
	if err != nil {
		return "", err
	}
	key := strings.TrimSpace(string(b))
	if key == "" {
		return "", errors.New("empty key file")
	}
	return key, nil
}

// mask keeps the scheme and the first characters of a credential.
func mask(v string) string {
	scheme, cred, ok := strings.Cut(v, " ")
	if !ok {
		scheme, cred = "", v
	}
	if len(cred) > 8 {
		cred = cred[:8] + "…"
	}
	return strings.TrimSpace(scheme + " " + cred)
}

func headerNames(h http.Header) string {
	names := make([]string, 0, len(h))
	for n := range h {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

// ensurePKI loads dir/tls.crt and dir/tls.key, or creates a CA, a server certificate for
// names, and writes dir/ca.crt (0644), dir/tls.crt (0644) and dir/tls.key (0600).
func ensurePKI(dir string, names []string) (tls.Certificate, error) {
	crt, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if cert, err := tls.LoadX509KeyPair(crt, key); err == nil {
		return cert, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return tls.Certificate{}, fmt.Errorf("loading %s: %w (remove the folder's files to start afresh)", dir, err)
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "capbroker demo API CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(1, 0, 0),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return tls.Certificate{}, err
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: strings.TrimSpace(names[0])},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(1, 0, 0),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, n := range names {
		if n = strings.TrimSpace(n); n == "" {
			continue
		} else if ip := net.ParseIP(n); ip != nil {
			leafTmpl.IPAddresses = append(leafTmpl.IPAddresses, ip)
		} else {
			leafTmpl.DNSNames = append(leafTmpl.DNSNames, n)
		}
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &leafKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	leafKeyDER, err := x509.MarshalPKCS8PrivateKey(leafKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return tls.Certificate{}, err
	}
	files := []struct {
		path  string
		block *pem.Block
		mode  os.FileMode
	}{
		{key, &pem.Block{Type: "PRIVATE KEY", Bytes: leafKeyDER}, 0o600},
		{crt, &pem.Block{Type: "CERTIFICATE", Bytes: leafDER}, 0o644},
		{filepath.Join(dir, "ca.crt"), &pem.Block{Type: "CERTIFICATE", Bytes: caDER}, 0o644},
	}
	for _, f := range files {
		if err := writeAtomic(f.path, pem.EncodeToMemory(f.block), f.mode); err != nil {
			return tls.Certificate{}, err
		}
	}
	return tls.LoadX509KeyPair(crt, key)
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// healthcheck GETs /healthz on the local listener, verifying the certificate with the -pki CA.
func healthcheck(o options) error {
	pem, err := os.ReadFile(filepath.Join(o.pki, "ca.crt"))
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return errors.New("no certificate in ca.crt")
	}
	_, port, err := net.SplitHostPort(o.listen)
	if err != nil {
		return err
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(o.pki, "tls.crt"), filepath.Join(o.pki, "tls.key"))
	if err != nil {
		return err
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return err
	}
	name := leaf.Subject.CommonName
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		Proxy:           nil,
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: name},
	}}
	resp, err := client.Get("https://127.0.0.1:" + port + "/healthz")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthz: %s", resp.Status)
	}
	return nil
}
