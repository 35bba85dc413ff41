package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestTransparentQuick measures the transparent path beside the explicit one with one pair
// and one latency round, and checks that both carried requests through the broker (the pool
// address leads nowhere but through the redirect) and that the redirect is gone afterwards.
func TestTransparentQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a broker and changes the packet filter; skipped with -short")
	}
	if why := transparentSkip(); why != "" {
		if os.Getenv("CI") != "" {
			t.Fatal("CI runs as root with nft (scripts/install-test-tools.sh):", why)
		}
		t.Skip(why)
	}
	dir, p, up := testUpstream(t)
	direct := &path{name: "direct", url: up.url(hostIntercept, chatPath)}
	var progress bytes.Buffer
	stderr = &progress
	defer func() { stderr = os.Stderr }()
	r, err := measureTransparent(context.Background(), brokerBinary(t), dir, up, p, direct, 1, 1, 200*time.Millisecond, 200)
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	table := fmt.Sprintf("capbroker_bench_%d", os.Getpid())
	if out, err := exec.Command("nft", "list", "table", "ip", table).CombinedOutput(); err == nil {
		t.Errorf("table ip %s still there after the measurement:\n%s", table, out)
	}
	if r.Skipped != "" || !transparentPool.Contains(mustAddr(t, r.PoolAddr)) {
		t.Fatalf("skipped %q, pool address %q", r.Skipped, r.PoolAddr)
	}
	if len(r.Throughput) != 2 {
		t.Fatalf("throughput at %d connection counts, want 2 (1 and 32)", len(r.Throughput))
	}
	for _, tp := range r.Throughput {
		if len(tp.Ratios) != 1 || tp.TransparentRPS[0] <= 0 || tp.ExplicitRPS[0] <= 0 || tp.TransparentCPUUS[0] <= 0 || tp.ExplicitCPUUS[0] <= 0 {
			t.Errorf("c=%d: ratios %v, req/s %v / %v, CPU %v / %v", tp.Conns, tp.Ratios, tp.TransparentRPS, tp.ExplicitRPS, tp.TransparentCPUUS, tp.ExplicitCPUUS)
		}
	}
	if l := r.Latency; l == nil || l.Errors != 0 || len(l.TransparentP50) != 1 || len(l.ExplicitP99) != 1 {
		t.Errorf("latency: %+v", l)
	}
	var out bytes.Buffer
	r.print(&out)
	for _, want := range []string{"transparent/explicit", "c=1", "c=32", "added over direct at 200 req/s", "transparent minus explicit in the same rounds"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("printed figures lack %q:\n%s", want, out.String())
		}
	}
}

// TestTransparentSkipped: a transparent path that could not be measured says why, in the
// table and in the JSON summary.
func TestTransparentSkipped(t *testing.T) {
	s := &summary{Transparent: &transparentResult{Skipped: "not root: the nftables redirect needs CAP_NET_ADMIN"}}
	var out bytes.Buffer
	s.Transparent.print(&out)
	if got := out.String(); got != "skipped: transparent: not root: the nftables redirect needs CAP_NET_ADMIN\n" {
		t.Errorf("printed %q", got)
	}
	js, _ := json.Marshal(s)
	if !bytes.Contains(js, []byte(`"transparent":{"skipped":"not root`)) {
		t.Errorf("JSON: %s", js)
	}
}

func mustAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
