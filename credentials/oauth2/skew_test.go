package oauth2

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestSkewReported: an endpoint whose clock is off by more than maxSkew is reported, ahead
// or behind; within it, nothing is.
func TestSkewReported(t *testing.T) {
	var offset time.Duration
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Date", time.Now().Add(offset).UTC().Format(http.TimeFormat))
	}))
	defer srv.Close()
	hc, w := endpointClient(srv.Client())
	for _, c := range []struct {
		offset time.Duration
		want   string
	}{
		{2 * time.Minute, "clock is 2m0s ahead of ours"},
		{-5 * time.Minute, "clock is 5m0s behind ours"},
		{5 * time.Second, ""},
	} {
		offset = c.offset
		resp, err := hc.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		got := w.problem()
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("offset %s: problem %q, want %q", c.offset, got, c.want)
		}
	}
}
