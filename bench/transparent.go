package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/capbroker/capbroker/broker/transparent"
	"github.com/capbroker/capbroker/internal/harness"
)

// The transparent path (issue 24) is measured beside the explicit intercepted path of the same
// broker: one bare broker (allow-all policy) serves both its proxy port and a transparent
// listener, and a temporary nftables table of the bench's own redirects TCP from loopback to
// the upstream's port at a pool address (198.18.0.0/15, the benchmark range: nothing else is
// reached there) to the listener. The client of the transparent path has no proxy: it dials
// the pool address the broker's resolver would answer for the host name, with the name as its
// TLS server name, and trusts the broker's CA. The explicit client asks the same broker for
// the same name through CONNECT. So the two differ only in the way in.

// transparentHost is the name both paths ask for: the broker resolves it to 127.0.0.1, where
// the upstream listens with a certificate that names it (newPKI).
const transparentHost = "localhost"

// transparentPool is the broker's default pool (transparent.dns.pool).
var transparentPool = netip.MustParsePrefix("198.18.0.0/15")

// transparentResult is the summary's "transparent" member.
type transparentResult struct {
	// Skipped says why the transparent path was not measured (not root, no nft, not Linux).
	Skipped  string `json:"skipped,omitempty"`
	Host     string `json:"host,omitempty"`
	PoolAddr string `json:"pool_addr,omitempty"`
	// Throughput is transparent over explicit by connections, in adjacent alternating slices,
	// with each side's own figures in the same pairs.
	Throughput []transparentPairs `json:"throughput,omitempty"`
	// Latency is each path's open-loop p50 and p99 minus direct's, in rounds of adjacent slices.
	Latency *transparentLatency `json:"added_latency,omitempty"`
}

type transparentPairs struct {
	paired
	// TransparentRPS, ExplicitRPS are each pair's throughputs; the CPU figures each pair's
	// broker CPU microseconds per request.
	TransparentRPS   []float64 `json:"transparent_rps"`
	ExplicitRPS      []float64 `json:"explicit_rps"`
	TransparentCPUUS []float64 `json:"transparent_cpu_us"`
	ExplicitCPUUS    []float64 `json:"explicit_cpu_us"`
}

type transparentLatency struct {
	Rate    int   `json:"rate_rps"`
	SliceMS int64 `json:"slice_ms"`
	// Added p50 and p99 over direct in each round (ms), by path.
	TransparentP50 []float64 `json:"transparent_p50_ms"`
	TransparentP99 []float64 `json:"transparent_p99_ms"`
	ExplicitP50    []float64 `json:"explicit_p50_ms"`
	ExplicitP99    []float64 `json:"explicit_p99_ms"`
	Errors         int       `json:"errors"`
}

// transparentSkip says why the transparent path cannot be measured here, or "".
func transparentSkip() string {
	if runtime.GOOS != "linux" {
		return "transparent mode needs Linux (SO_ORIGINAL_DST)"
	}
	if os.Geteuid() != 0 {
		return "not root: the nftables redirect needs CAP_NET_ADMIN"
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return "nft not found (scripts/install-test-tools.sh installs it)"
	}
	return ""
}

// measureTransparent starts the broker with a transparent listener and the redirect, and
// measures the two paths in pairs: throughput at 1 and 32 connections (pairs of slice each),
// and the added p50/p99 at rate req/s against direct (rounds of one second per path).
func measureTransparent(ctx context.Context, bin, dir string, up *upstream, p *pki, direct *path, pairs, rounds int, slice time.Duration, rate int) (*transparentResult, error) {
	if why := transparentSkip(); why != "" {
		fmt.Fprintln(stderr, "  skipped: transparent:", why)
		return &transparentResult{Skipped: why}, nil
	}
	pool, ok := transparent.NewNames([]netip.Prefix{transparentPool}).Assign(transparentHost, false)
	if !ok {
		return nil, errors.New("no pool address for " + transparentHost)
	}
	src, err := sourceFor(pool)
	if err != nil {
		return nil, err
	}
	tAddr, err := harness.FreeAddr()
	if err != nil {
		return nil, err
	}
	b, err := startTransparentBroker(bin, filepath.Join(dir, "transparent"), up, p, tAddr, src)
	if err != nil {
		return nil, err
	}
	defer b.stop()
	_, tPort, _ := net.SplitHostPort(tAddr)
	remove, err := redirectPool(up.port, tPort, b.stop)
	if err != nil {
		return nil, err
	}
	defer remove()

	r := &transparentResult{Host: transparentHost, PoolAddr: pool.String()}
	u := up.url(transparentHost, chatPath)
	explicit := &path{name: "explicit", url: u, via: b.intercepting(), proc: b.process}
	trans := &path{name: "transparent", url: u, proc: b.process}
	target := net.JoinHostPort(pool.String(), strconv.Itoa(up.port))
	clients := func(conns int) {
		explicit.client = explicit.withConns(p, conns)
		if trans.client != nil {
			trans.client.CloseIdleConnections()
		}
		trans.client = transparentClient(target, b, conns)
		direct.client = direct.withConns(p, conns)
	}
	clients(1)
	for _, pa := range []*path{explicit, trans} {
		if err := pa.check(ctx); err != nil {
			return nil, fmt.Errorf("%s: %w", pa.name, err)
		}
	}
	for _, c := range []int{1, 32} {
		clients(c)
		r.Throughput = append(r.Throughput, transparentThroughput(ctx, trans, explicit, c, pairs, slice))
	}

	fmt.Fprintln(stderr, "  added latency, transparent and explicit, rounds with direct...")
	clients(256)
	l := &transparentLatency{Rate: rate, SliceMS: time.Second.Milliseconds()}
	order := []*path{direct, explicit, trans}
	for i := range rounds {
		got := map[string]latency{}
		for j := range order { // each round starts one path later
			pa := order[(i+j)%len(order)]
			got[pa.name] = pa.openLoop(ctx, rate, time.Second)
			l.Errors += got[pa.name].Errors
		}
		d := got[direct.name]
		l.TransparentP50 = append(l.TransparentP50, round3(got["transparent"].P50MS-d.P50MS))
		l.TransparentP99 = append(l.TransparentP99, round3(got["transparent"].P99MS-d.P99MS))
		l.ExplicitP50 = append(l.ExplicitP50, round3(got["explicit"].P50MS-d.P50MS))
		l.ExplicitP99 = append(l.ExplicitP99, round3(got["explicit"].P99MS-d.P99MS))
	}
	r.Latency = l
	for _, pa := range []*path{explicit, trans, direct} {
		pa.client.CloseIdleConnections()
	}
	return r, nil
}

// transparentThroughput is pairedRatio, keeping each side's figures too.
func transparentThroughput(ctx context.Context, trans, explicit *path, conns, pairs int, d time.Duration) transparentPairs {
	r := transparentPairs{paired: paired{Conns: conns, SliceMS: d.Milliseconds()}}
	for i := range max(pairs, 1) {
		t, e := adjacentSlices(ctx, i, trans, explicit, conns, d)
		if e.rps == 0 || t.rps == 0 {
			continue
		}
		r.Ratios = append(r.Ratios, t.rps/e.rps)
		r.Steal = append(r.Steal, [2]float64{round3(t.steal), round3(e.steal)})
		r.TransparentRPS = append(r.TransparentRPS, round3(t.rps))
		r.ExplicitRPS = append(r.ExplicitRPS, round3(e.rps))
		r.TransparentCPUUS = append(r.TransparentCPUUS, round3(t.cpuPerReq))
		r.ExplicitCPUUS = append(r.ExplicitCPUUS, round3(e.cpuPerReq))
		if t.cpuPerReq > 0 && e.cpuPerReq > 0 {
			r.CPURatios = append(r.CPURatios, t.cpuPerReq/e.cpuPerReq)
		}
	}
	r.Median, r.CPUMedian = median(r.Ratios), median(r.CPURatios)
	fmt.Fprintf(stderr, "  transparent/explicit c=%d: median %.2fx of %d pairs (%.0f / %.0f req/s)\n",
		conns, r.Median, len(r.Ratios), median(r.TransparentRPS), median(r.ExplicitRPS))
	return r
}

// sourceFor is the address the kernel sends from to a (a route lookup, nothing sent): a
// connection to the pool keeps it after the redirect, and the broker identifies the agent by
// it. A loopback source cannot be bound for a destination off loopback.
func sourceFor(a netip.Addr) (netip.Addr, error) {
	c, err := net.Dial("udp4", net.JoinHostPort(a.String(), "9"))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("no route to the pool %s: %w", transparentPool, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), nil
}

// transparentClient is a client with no proxy that reaches every host at target (the pool
// address).
func transparentClient(target string, b *broker, conns int) *http.Client {
	t := newTransport(nil, b.caPool, conns)
	d := &net.Dialer{Timeout: 5 * time.Second} // the pool leads nowhere without the redirect
	t.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, "tcp4", target)
	}
	return &http.Client{Transport: t, Timeout: time.Minute}
}

// redirectPool installs a table of the bench's own sending locally made TCP connections to
// the pool's port port to the local port to, and returns what removes it. If the bench is
// interrupted (SIGINT, SIGTERM) meanwhile, the table is removed, onSignal called, and the
// bench exits.
func redirectPool(port int, to string, onSignal func()) (func(), error) {
	table := fmt.Sprintf("capbroker_bench_%d", os.Getpid())
	// The filter chain runs after the redirect: anything still addressed to the pool (another
	// port, UDP, a redirect that did not apply) is refused here and never leaves the machine.
	rules := fmt.Sprintf(`table ip %s {
	chain output {
		type nat hook output priority -100; policy accept;
		ip daddr %s tcp dport %d redirect to :%s
	}
	chain contain {
		type filter hook output priority 0; policy accept;
		ip daddr %s reject
	}
}
`, table, transparentPool, port, to, transparentPool)
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("nft: %v: %s", err, out)
	}
	del := func() {
		if out, err := exec.Command("nft", "delete", "table", "ip", table).CombinedOutput(); err != nil {
			fmt.Fprintf(stderr, "  removing nft table %s: %v: %s\n", table, err, out)
		}
	}
	sig := make(chan os.Signal, 1)
	done := make(chan struct{})
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		select {
		case s := <-sig:
			del()
			onSignal()
			fmt.Fprintln(os.Stderr, "bench: interrupted:", s)
			os.Exit(1)
		case <-done:
		}
	}()
	return func() {
		signal.Stop(sig)
		close(done)
		del()
	}, nil
}

// startTransparentBroker is startBroker's bare broker with a transparent listener on tAddr
// serving the upstream's port, and its agent identified by its token or by the address src.
func startTransparentBroker(bin, dir string, up *upstream, p *pki, tAddr string, src netip.Addr) (*broker, error) {
	b, err := startBrokerWith(bin, dir, up, p, false,
		fmt.Sprintf("    addresses: [\"%s/32\"]\n", src),
		fmt.Sprintf("transparent:\n  listen: %q\n  ports: [%d]\n", tAddr, up.port))
	if err != nil {
		return nil, err
	}
	if err := b.waitListening(tAddr, 10*time.Second); err != nil {
		b.stop()
		return nil, err
	}
	return b, nil
}

// print writes the pairs' medians and ranges.
func (r *transparentResult) print(out io.Writer) {
	if r == nil {
		return
	}
	if r.Skipped != "" {
		fmt.Fprintf(out, "skipped: transparent: %s\n", r.Skipped)
		return
	}
	rng := func(v []float64, f string) string {
		if len(v) == 0 {
			return "-"
		}
		return fmt.Sprintf(f+" ("+f+" to "+f+")", median(v), slices.Min(v), slices.Max(v))
	}
	fmt.Fprintf(out, "\ntransparent (redirected to %s) and explicit intercepted, same broker, same host %q: medians (ranges) of adjacent pairs\n", r.PoolAddr, r.Host)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "conns\tpairs\ttransparent req/s\texplicit req/s\ttransparent/explicit\ttransparent CPU µs/req\texplicit CPU µs/req\tCPU ratio\t")
	for _, t := range r.Throughput {
		fmt.Fprintf(w, "c=%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", t.Conns, len(t.Ratios),
			rng(t.TransparentRPS, "%.0f"), rng(t.ExplicitRPS, "%.0f"), rng(t.Ratios, "%.2f"),
			rng(t.TransparentCPUUS, "%.0f"), rng(t.ExplicitCPUUS, "%.0f"), rng(t.CPURatios, "%.2f"))
	}
	w.Flush()
	if l := r.Latency; l != nil {
		fmt.Fprintf(out, "added over direct at %d req/s open loop, %d rounds of %d ms slices (%d errors): transparent p50 %s ms, p99 %s ms; explicit p50 %s ms, p99 %s ms\n",
			l.Rate, len(l.TransparentP50), l.SliceMS, l.Errors, rng(l.TransparentP50, "%.2f"), rng(l.TransparentP99, "%.2f"),
			rng(l.ExplicitP50, "%.2f"), rng(l.ExplicitP99, "%.2f"))
		var d50, d99 []float64 // within each round: the two paths' own p50s and p99s
		for i := range l.TransparentP50 {
			d50 = append(d50, l.TransparentP50[i]-l.ExplicitP50[i])
			d99 = append(d99, l.TransparentP99[i]-l.ExplicitP99[i])
		}
		fmt.Fprintf(out, "transparent minus explicit in the same rounds: p50 %s ms, p99 %s ms\n", rng(d50, "%.2f"), rng(d99, "%.2f"))
	}
}
