package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// The warm-up runs at the slice's rate, so that the pool holds the connections the rate needs
// before the slice starts; the eight sequential requests it replaced leave one.
func TestTimedLoopWarmsThePoolAtTheRate(t *testing.T) {
	var served atomic.Int64
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		time.Sleep(3 * time.Millisecond) // at 1,000 req/s, about three requests at a time
		w.Write(smallBody)
	}))
	defer srv.Close()
	defer func(w time.Duration) { latencyWarmUp = w }(latencyWarmUp)
	for _, warm := range []time.Duration{0, 100 * time.Millisecond} {
		// A transport of its own for each round: the last round's may still be dialing, or
		// returning a connection to its pool, in goroutines of its own that read its fields.
		tr := srv.Client().Transport.(*http.Transport).Clone()
		pa := &path{name: "direct", url: srv.URL, client: &http.Client{Transport: tr}}
		tr.DialContext = pa.countingDial()
		tr.MaxIdleConnsPerHost = 64
		latencyWarmUp = warm
		served.Store(0)
		l, st := pa.timedLoop(context.Background(), 1000, 200*time.Millisecond)
		warmDials := pa.dialCount() - st.Dials
		if l.Sent != 200 || l.Errors != 0 || l.P50MS < 3 {
			t.Fatalf("warm-up %s: %+v", warm, l)
		}
		wantServed := int64(200 + 8)
		if warm > 0 {
			wantServed = 200 + 100
		}
		if got := served.Load(); got != wantServed {
			t.Errorf("warm-up %s: the server got %d requests, want %d", warm, got, wantServed)
		}
		switch {
		case warm == 0 && warmDials != 1:
			t.Errorf("sequential warm-up: %d connections before the slice, want 1", warmDials)
		case warm > 0 && warmDials < 2:
			t.Errorf("warm-up at the rate: %d connections before the slice, want several", warmDials)
		}
		pa.client.CloseIdleConnections()
	}
}
