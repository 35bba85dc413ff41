package credentials

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/capbroker/capbroker/internal/svcdial"
	"github.com/capbroker/capbroker/internal/svcdial/svcdialtest"
)

// EndpointClient connects only through the dial it is given (cmd/broker: DialService), and
// without one dials nothing.
func TestEndpointClientUsesInjectedDial(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer srv.Close()
	var rec svcdialtest.Recorder
	c, err := EndpointClient("", rec.Dial)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if rec.Count() != 1 {
		t.Fatalf("dials through the injected dial: %d, want 1", rec.Count())
	}
	c, _ = EndpointClient("", nil)
	if _, err := c.Get(srv.URL); !errors.Is(err, svcdial.ErrNoDialer) {
		t.Fatalf("without a dial: %v, want ErrNoDialer", err)
	}
}
