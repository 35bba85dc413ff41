package approvals

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/internal/testpki"
)

// With admin.tls the client certificate names who decides, and no token is needed.
func TestAPIMutualTLSNamesTheApprover(t *testing.T) {
	people := testpki.New(t, "people CA")
	clientCert, pool := people.Client(t, "alice"), people.Pool

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
