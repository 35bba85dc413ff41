package policy

import (
	"context"
	"testing"
	"time"
)

// TestBundleRunReportsRecovery: after failed polls, the first good one is reported even when
// the bundle has not changed (304), so /readyz stops reporting the failure.
func TestBundleRunReportsRecovery(t *testing.T) {
	srv := newBundleServer(t)
	srv.serve(buildBundle(t, "v1", allowPolicy("one"), map[string]any{"allowed": []any{"api.example.com"}}, nil), `"v1"`)
	e := new(Engine)
	p, err := NewBundlePoller(e, BundleOptions{Dial: testDial.Dial, URL: srv.URL, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	reloads := make(chan error, 100)
	done := make(chan struct{})
	go func() { p.Run(ctx, func(_ string, err error) { reloads <- err }); close(done) }()
	defer func() { cancel(); <-done }()
	next := func() error {
		t.Helper()
		select {
		case err := <-reloads:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("no report within 10s")
			return nil
		}
	}
	if err := next(); err != nil {
		t.Fatalf("first load: %v", err)
	}
	srv.setDown(true)
	if err := next(); err == nil {
		t.Fatal("want a failure while the server is down")
	}
	srv.setDown(false)
	err = next()
	for err != nil { // failures polled before the server came back
		err = next()
	}
	if e.Revision() != "v1" {
		t.Fatalf("revision %q", e.Revision())
	}
}
