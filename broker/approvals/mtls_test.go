package approvals

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// With admin.tls the client certificate names who decides, and no token is needed.
func TestAPIMutualTLSNamesTheApprover(t *testing.T) {
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "people CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, _ := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "alice"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, _ := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	clientCert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	pool := x509.NewCertPool()
	pool.AddCert(ca)

	f := newFixture(t, Options{})
	srv := httptest.NewUnstartedServer(NewAPI(APIOptions{Queue: f.q, MTLS: true}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	srv.StartTLS()
	defer srv.Close()
	client := srv.Client()
	client.Transport.(*http.Transport).TLSClientConfig.Certificates = []tls.Certificate{clientCert}

	p, ch := hold(t, f.q, context.Background(), req("a1", "DELETE", "/x"))
	resp, err := client.Post(srv.URL+"/api/approvals/"+p.ID+"/approve", "application/json", strings.NewReader(`{}`))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("approve with a client certificate: %v %v", resp, err)
	}
	resp.Body.Close()
	if out := <-ch; out.By != "alice" {
		t.Fatalf("approved by %q", out.By)
	}
	// Without a certificate the handshake itself fails.
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	bare := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	if resp, err := bare.Get(srv.URL + "/api/approvals"); err == nil {
		resp.Body.Close()
		t.Fatal("served without a client certificate")
	}
}
