package main

import (
	"context"
	"path/filepath"
	"testing"
)

// testUpstream starts the bench's upstream with a CA of its own in a temporary directory,
// stopped when the test ends.
func testUpstream(t *testing.T) (string, *pki, *upstream) {
	t.Helper()
	dir := t.TempDir()
	p, err := newPKI("brokerbench test CA", filepath.Join(dir, "upstream-ca.pem"), 0)
	if err != nil {
		t.Fatal(err)
	}
	up, err := startUpstream(p, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(up.close)
	return dir, p, up
}

// TestAgentProtocol: with -agent h2 the client speaks HTTP/2 to the broker and the broker
// reaches the h2 upstream over HTTP/2; by default both are HTTP/1.1 (checkH2 checks the
// upstream's side). Direct to the HTTP/1.1 upstream stays HTTP/1.1 either way.
func TestAgentProtocol(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a broker; skipped with -short")
	}
	dir, p, up := testUpstream(t)
	if err := up.startH2(p); err != nil {
		t.Fatal(err)
	}
	b, err := startBroker(brokerBinary(t), filepath.Join(dir, "bare"), up, p, false)
	if err != nil {
		t.Fatal(err)
	}
	defer b.stop()
	defer func() { agentH2 = false }()
	ctx := context.Background()
	for _, tc := range []struct {
		h2         bool
		viaBroker  string
		directToH1 string
	}{
		{false, "HTTP/1.1", "HTTP/1.1"},
		{true, "HTTP/2.0", "HTTP/1.1"},
	} {
		agentH2 = tc.h2
		paths := []*path{
			{name: "direct", url: up.url(hostIntercept, chatPath)},
			{name: "intercept", url: up.url(hostIntercept, chatPath), via: b.intercepting(), proc: b.process},
		}
		for _, pa := range paths {
			pa.client = pa.withConns(p, 2)
		}
		if got, err := paths[1].proto(ctx); err != nil || got != tc.viaBroker {
			t.Errorf("agent h2 %v: through the broker %q (%v), want %q", tc.h2, got, err, tc.viaBroker)
		}
		if got, err := paths[0].proto(ctx); err != nil || got != tc.directToH1 {
			t.Errorf("agent h2 %v: direct %q (%v), want %q", tc.h2, got, err, tc.directToH1)
		}
		if err := checkH2(ctx, up, h2Paths(p, paths, up)); err != nil {
			t.Errorf("agent h2 %v: %v", tc.h2, err)
		}
	}
}
