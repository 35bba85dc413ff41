// Command bench measures the broker on loopback against a direct connection: `make bench`.
//
// It starts a TLS upstream with its own CA, builds the broker and starts two of them (a bare
// one with an allow-all policy, and one running the full pipeline: the shipped policies,
// credential injection, scrubbing and audit to a file), drives them with Go HTTP clients, and
// prints a table of ratios against direct HTTPS. Other proxies (mitmproxy, squid with ssl-bump,
// smokescreen) are measured beside it on the same upstream when installed, and skipped with the
// reason when not. The summary is also written as JSON.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

func main() {
	o := options{}
	flag.DurationVar(&o.phase, "phase", 800*time.Millisecond, "duration of each throughput phase")
	flag.IntVar(&o.rounds, "rounds", 2, "throughput rounds over all paths; each figure is a path's best round")
	flag.IntVar(&o.pairs, "pairs", 20, "pairs of adjacent slices for each of the ratios the targets are stated in (full/intercept, intercept/relay, tunnel/smokescreen; half as many for intercept/direct and the margins over squid and mitmproxy)")
	flag.DurationVar(&o.slice, "slice", 500*time.Millisecond, "duration of each slice of -pairs")
	flag.IntVar(&o.rate, "rate", 1000, "open-loop request rate for the latency phase (req/s)")
	flag.DurationVar(&o.latencyFor, "latency-for", 3*time.Second, "duration of each latency phase")
	flag.DurationVar(&o.latencySlice, "latency-slice", time.Second, "duration of each open-loop slice of -only latency-pairs (the targets' pairs take 1s)")
	flag.BoolVar(&preciseSend, "latency-precise", preciseSend, "open-loop sends wait in nanosleep on a thread of their own, not in time.Sleep (whose wake-ups are whole milliseconds)")
	flag.DurationVar(&latencyWarmUp, "latency-warm", latencyWarmUp, "open-loop warm-up at -rate before each latency phase and slice, uncounted (0: eight requests in sequence)")
	flag.IntVar(&o.newHosts, "new-hosts", 20, "hosts never seen before, for the first-request cost")
	flag.IntVar(&o.idle, "idle", 200, "idle intercepted connections held for the memory figure")
	flag.BoolVar(&o.big, "big", true, "measure the 256 MiB download and upload")
	flag.IntVar(&o.bulkPairs, "bulk-pairs", 15, "pairs of 256 MiB transfers each way for the bulk targets; one pair of the full download ranges from 0.6 to 1.2x the bare one on a 2-core machine, and the 95% interval of their median, printed with the targets, is about 0.3 wide with 15 pairs, 0.1 with 60 (-only bulk: intercept/relay and full/intercept alone)")
	peers := flag.String("peers", "relay,mitmproxy,squid,smokescreen", "other proxies to measure beside the broker, comma-separated, or none (relay is the bench's own bare intercepting proxy)")
	flag.StringVar(&o.out, "out", "bench/results/latest.json", "JSON summary file")
	flag.StringVar(&o.only, "only", "", strings.Join([]string{
		"measure only this path's (or this peer's: relay, squid...) throughput at -conns connections for -phase, then stop (for profiling)",
		"pairs: only the paired ratios of the targets (-pairs, -slice)",
		"floor: intercept/relay and full/intercept, paired",
		"tunnel-pairs: tunnel/smokescreen, paired",
		"proxy-pairs: the full pipeline chained through a forwarding squid over the full pipeline direct, and the tunnel chained through it over squid alone, paired",
		"otel-pairs: the full pipeline exporting OTLP logs and traces to a local collector, then to a minimal OTLP sink, over it without, paired",
		"sse: the SSE delay of each path",
		"transparent: the transparent path beside the explicit intercepted one, paired (root and nft, else skipped)",
		"ssh-clone: a clone of a -ssh-mib repository through the broker's SSH front door against ssh direct to the same sshd, in a quarter of -pairs (at least 3) alternating rounds (root and sshd, else skipped)",
		"latency-pairs: only the added p50 of the full pipeline, the bare intercepted path and the relay over direct, and of the full pipeline over the relay, each in a quarter of -pairs (at least 3) of -latency-slice open-loop slices at -rate",
		"postgres-pairs: pgbench's default workload through the Postgres front door over direct, paired, with statement decisions off and on (-conns clients, 8 by default, -slice of at least 2s, root, Debian's postgresql and a Vault binary)",
		"curves: only the curves of -curves",
		"charts: only draw the charts",
		"bulk: 256 MiB transfers both ways, intercept/relay and full/intercept, in -bulk-pairs pairs",
		"secrets: scrubbing with 100 keys over one, in this process, in -pairs pairs",
		"per-command: a connection per request split into CONNECT, handshake and request, for two key exchanges, and the CONNECT paired with a minimal CONNECT responder's (the floor)",
		"connect-pairs: only those pairs, -pairs of them",
		"agent-h2-pairs: the bare intercepted path and the full pipeline with an HTTP/1.1 client (-conns connections) against an h2 client (one connection, -conns streams), paired, with the broker's CPU per request",
	}, "; "))
	flag.IntVar(&o.conns, "conns", 32, "connections for -only")
	flag.IntVar(&o.sshMiB, "ssh-mib", 300, "-only ssh-clone: the size of the repository cloned, in MiB")
	flag.BoolVar(&keepAlive, "keepalive", true, "clients keep their connections between requests; false: a connection (a CONNECT and a TLS handshake through a proxy) per request, as one curl command makes")
	flag.StringVar(&o.agent, "agent", "h1", "what the bench's clients offer in ALPN, to the brokers and the upstream alike: h1 (http/1.1 alone, as the LLM SDKs) or h2 (h2 first, then http/1.1, as curl and browsers)")
	flag.StringVar(&o.upstream, "upstream", "both", "upstreams: h1 (HTTP/1.1 only), h2 (also one offering h2; -only pairs measures only the h1/h2 pairs) or both; -only takes direct-h2, intercept-h2, full-h2 unless h1")
	otlpSink := flag.String("otlp-sink", "", "run as the minimal OTLP sink of -only otel-pairs (gRPC; decodes, counts and discards) on this address, and nothing else")
	relay := flag.String("relay", "", "run as the relay (a bare intercepting proxy, the floor of the intercepted path) on this address, and nothing else")
	relayCA := flag.String("relay-ca", "", "with -relay: where to write the relay's CA certificate")
	relayUpstreamCA := flag.String("relay-upstream-ca", "", "with -relay: the upstream's CA certificate")
	connectFloor := flag.String("connect-floor", "", "run as the CONNECT floor of -only per-command (accept, read the head, answer 200, read until the client closes) on this address, and nothing else")
	curves := flag.String("curves", "none", "curves to measure after the main run (or instead of it, with -only curves): names, comma-separated, all, or none; each is written to "+curvesDir+"/NAME.json")
	curvesQuick := flag.Bool("curves-quick", false, "fewer and shorter points on each curve")
	charts := flag.Bool("charts", true, "draw the charts under "+chartsDir+"/ from "+curvesDir+"/ and -out (-only charts: only that)")
	flag.Parse()
	if *otlpSink != "" {
		if err := serveOTLPSink(*otlpSink); err != nil {
			fmt.Fprintln(os.Stderr, "otlp-sink:", err)
			os.Exit(1)
		}
		return
	}
	if *relay != "" {
		if err := serveRelay(*relay, *relayCA, *relayUpstreamCA); err != nil {
			fmt.Fprintln(os.Stderr, "relay:", err)
			os.Exit(1)
		}
		return
	}
	if *connectFloor != "" {
		if err := serveConnectFloor(*connectFloor); err != nil {
			fmt.Fprintln(os.Stderr, "connect-floor:", err)
			os.Exit(1)
		}
		return
	}
	o.peers = strings.Split(*peers, ",")
	names, err := selectCurves(*curves)
	switch o.agent {
	case "h1", "h2":
		agentH2 = o.agent == "h2"
	default:
		err = fmt.Errorf("-agent %q: h1 or h2", o.agent)
	}
	if err == nil && o.only == "curves" && len(names) == 0 {
		err = errors.New("-only curves: no curve selected (-curves NAME,... or all)")
	}
	if err == nil && o.only != "curves" && o.only != "charts" {
		err = run(context.Background(), o)
	}
	if err == nil && (o.only == "" || o.only == "curves" || o.only == "charts") {
		err = afterMain(context.Background(), names, *curvesQuick, *charts || o.only == "charts", o.out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type options struct {
	phase, latencyFor time.Duration
	rate, rounds      int
	newHosts, idle    int
	big               bool
	peers             []string
	out               string
	only              string
	bulkPairs         int
	conns             int
	pairs             int
	slice             time.Duration
	latencySlice      time.Duration
	upstream          string // h1, h2 or both
	sshMiB            int    // -only ssh-clone: the repository's size
	agent             string // h1 or h2 (agentH2)
}

func run(ctx context.Context, o options) error {
	start := time.Now()
	if o.only == "secrets" { // in this process: no broker to start
		measureSecrets(max(o.pairs, 1)).print(os.Stdout)
		return nil
	}
	dir, err := os.MkdirTemp("", "brokerbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin, err := buildBroker(dir)
	if err != nil {
		return err
	}
	if o.only == "ssh-clone" {
		r, err := sshClone(ctx, bin, dir, o.sshMiB, max(o.pairs/4, 3))
		r.print(os.Stdout)
		return err
	}
	if o.only == "postgres-pairs" {
		return postgresPairs(ctx, bin, dir, o)
	}
	p, err := newPKI("brokerbench upstream CA", filepath.Join(dir, "upstream-ca.pem"), o.newHosts)
	if err != nil {
		return err
	}
	up, err := startUpstream(p, o.newHosts)
	if err != nil {
		return err
	}
	defer up.close()
	if o.upstream != "h1" {
		if err := up.startH2(p); err != nil {
			return err
		}
	}
	bare, err := startBroker(bin, filepath.Join(dir, "bare"), up, p, false)
	if err != nil {
		return err
	}
	defer bare.stop()
	full, err := startBroker(bin, filepath.Join(dir, "full"), up, p, true)
	if err != nil {
		return err
	}
	defer full.stop()

	s := &summary{
		Machine: machine(), Started: start.UTC().Format(time.RFC3339), Commit: gitCommit(), Agent: o.agent,
		Throughput: map[string]map[int]float64{}, CPUPerRequestUS: map[string]float64{},
		Latency: map[string]latency{}, LatencyRate: o.rate, SSE: map[string]sseResult{}, Transfer: map[string]transfer{},
	}
	paths := []*path{
		{name: "direct", url: up.url(hostIntercept, chatPath)},
		{name: "tunnel", url: up.url(hostTunnel, chatPath), via: bare.tunnelling(p), proc: bare.process},
		{name: "intercept", url: up.url(hostIntercept, chatPath), via: bare.intercepting(), proc: bare.process},
		{name: "full", url: up.url(hostIntercept, chatPath), via: full.intercepting(), proc: full.process},
	}
	for i := range paths {
		paths[i].client = paths[i].withConns(p, 0)
	}
	// Check every path once before measuring: a refusal would make every figure meaningless.
	for _, pa := range paths {
		if err := pa.check(ctx); err != nil {
			return fmt.Errorf("%s: %w", pa.name, err)
		}
	}
	var pathsH2 []*path
	if up.h2 != nil {
		pathsH2 = h2Paths(p, paths, up)
		if err := checkH2(ctx, up, pathsH2); err != nil {
			return err
		}
	}
	direct, intercept, fullPath := paths[0], paths[2], paths[3]
	// The targets' ratios, each measured in adjacent slices (pairedRatio).
	pairs := func(conns int) {
		fmt.Fprintln(os.Stderr, "full pipeline over bare intercepted, and bare intercepted over direct, paired...")
		for _, pa := range []*path{direct, intercept, fullPath} {
			pa.client = pa.withConns(p, conns)
		}
		s.FullOverIntercept = pairedRatio(ctx, fullPath, intercept, conns, max(o.pairs, 1), o.slice)
		s.InterceptOverDirect = pairedRatio(ctx, intercept, direct, conns, max(o.pairs/2, 3), o.slice)
	}
	if o.only == "pairs" {
		if o.upstream != "h2" {
			pairs(o.conns)
			s.FullOverIntercept.print(os.Stdout, "full/intercept")
			s.InterceptOverDirect.print(os.Stdout, "intercept/direct")
		}
		if pathsH2 != nil {
			measureH2(ctx, p, paths, pathsH2, o.conns, max(o.pairs, 1), o.slice).print(os.Stdout)
		}
		return nil
	}
	if o.only == "transparent" {
		r, err := measureTransparent(ctx, bin, dir, up, p, direct, max(o.pairs, 1), max(o.pairs/2, 3), o.slice, o.rate)
		r.print(os.Stdout)
		return err
	}
	if o.only == "latency-pairs" {
		return latencyPairs(ctx, up, p, direct, intercept, fullPath, o)
	}
	if o.only == "sse" {
		measureSSE(ctx, up, paths, s.SSE)
		return nil
	}
	if o.only == "bulk" {
		return bulkOnly(ctx, up, p, intercept, fullPath, o)
	}
	if o.only == "per-command" {
		r := measurePerCommand(ctx, p, up, bare, full, max(o.pairs, 1), max(o.pairs, 1))
		r.print(os.Stdout)
		return nil
	}
	if o.only == "connect-pairs" {
		return connectPairs(ctx, up, bare, max(o.pairs, 1))
	}
	if o.only == "agent-h2-pairs" {
		return agentH2Pairs(ctx, p, intercept, fullPath, o)
	}
	if o.only == "floor" {
		return floorPairs(ctx, up, p, intercept, fullPath, o)
	}
	if o.only == "tunnel-pairs" {
		return tunnelPairs(ctx, up, p, paths[1], o)
	}
	if o.only == "proxy-pairs" {
		return proxyPairs(ctx, bin, dir, up, p, fullPath, paths[1], o)
	}
	if o.only == "otel-pairs" {
		return otelPairs(ctx, bin, dir, up, p, fullPath, o)
	}
	if o.only != "" {
		only := slices.Concat(paths, pathsH2)
		if slices.ContainsFunc(peerList, func(pe peer) bool { return pe.name == o.only }) {
			peer, stop, err := startOnePeer(ctx, up, p, o.only)
			if err != nil {
				return fmt.Errorf("-only %s: %w", o.only, err)
			}
			defer stop()
			only = []*path{peer}
		}
		for _, pa := range only {
			if pa.name == o.only {
				pa.client = pa.withConns(p, o.conns)
				proto, err := pa.proto(ctx)
				if err != nil {
					return fmt.Errorf("%s: %w", pa.name, err)
				}
				r := pa.throughput(ctx, o.conns, o.phase)
				fmt.Printf("%s c=%d (the client's %s): %.0f req/s, %.1f µs CPU per request\n", pa.name, o.conns, proto, r.rps, r.cpuPerReq)
				return nil
			}
		}
		return fmt.Errorf("-only %q: no such path", o.only)
	}
	// SSE first, before the peers start: measured after the peers' phases, one path or
	// another read 1.7-2.5 ms where alone, after a latency phase, or in a whole run without
	// the peers, every path reads 0.3-0.5 (a peer still at work beside it, though the
	// proxies had gone quiet by their CPU time).
	fmt.Fprintln(os.Stderr, "SSE...")
	measureSSE(ctx, up, paths, s.SSE)
	// The peers are checked as they start; one that fails is skipped, with the reason.
	peerPaths, peerResults, stopPeers := startPeers(ctx, up, p, o.peers)
	defer stopPeers()
	s.Peers = peerResults
	// Peers are measured for throughput, latency and CPU, interleaved with the broker's paths.
	all := slices.Concat(paths, peerPaths)

	// Memory per idle connection is read off a broker that has carried no load yet, so that
	// heap grown by the other phases does not hide it.
	fmt.Fprintln(os.Stderr, "idle intercepted connections...")
	fresh, err := startBroker(bin, filepath.Join(dir, "idle"), up, p, false)
	if err != nil {
		return err
	}
	s.IdleConnBytes = idleCost(fresh, up, o.idle)
	fresh.stop()

	// Every path is measured in each round, in turn, and keeps its best round: a burst of
	// load from outside (a shared machine) then lowers one round of one path, not a ratio.
	fmt.Fprintln(os.Stderr, "throughput (small bodies, keep-alive)...")
	for range max(o.rounds, 1) {
		for _, c := range []int{1, 8, 32, 128} {
			for _, pa := range all {
				pa.client = pa.withConns(p, c)
				r := pa.throughput(ctx, c, o.phase)
				if s.Throughput[pa.name] == nil {
					s.Throughput[pa.name] = map[int]float64{}
				}
				s.Throughput[pa.name][c] = max(s.Throughput[pa.name][c], r.rps)
				if pa.proc == nil || c != 8 || r.cpuPerReq == 0 {
					continue // CPU per request is read at 8 connections, of the proxy's process
				}
				if cpu, seen := s.CPUPerRequestUS[pa.name]; !seen || r.cpuPerReq < cpu {
					s.CPUPerRequestUS[pa.name] = r.cpuPerReq // its best round, as for throughput
				}
			}
		}
	}

	// The best rounds above are each path's own, taken seconds apart; the targets' ratios
	// are measured in adjacent slices.
	pairs(32)
	if pathsH2 != nil {
		// A quarter of the pairs: the quick bench stays under five minutes.
		s.H2Upstream = measureH2(ctx, p, paths, pathsH2, 32, max(o.pairs/4, 3), o.slice)
	}

	var procs []*process
	for _, pa := range all {
		if pa.proc != nil && !slices.Contains(procs, pa.proc) {
			procs = append(procs, pa.proc)
		}
	}
	fmt.Fprintln(os.Stderr, "latency (open loop)...")
	for _, pa := range all {
		settleBefore(procs, pa.name)
		pa.client = pa.withConns(p, 256)
		s.Latency[pa.name] = pa.openLoop(ctx, o.rate, o.latencyFor)
	}
	// The rest of the targets' pairs: the broker over the relay and the peers, added p50.
	s.measureTargets(ctx, p, all, procs, max(o.pairs, 1), o.slice, o.rate)
	if !agentH2 { // with -agent h2 every client speaks h2 already
		settleBefore(procs, "agent h2")
		if s.AgentH2, err = measureAgentH2(ctx, p, []*path{intercept, fullPath}, 32, max(o.pairs/2, 3), o.slice); err != nil {
			return err
		}
	}
	fmt.Fprintln(os.Stderr, "transparent beside explicit intercepted, paired...")
	// A few pairs only (about 20 s): -only transparent measures -pairs of them.
	if s.Transparent, err = measureTransparent(ctx, bin, dir, up, p, direct, 4, 3, o.slice, o.rate); err != nil {
		s.Transparent = &transparentResult{Skipped: "failed: " + err.Error()} // as a peer's failed check
	}

	fmt.Fprintln(os.Stderr, "new hosts...")
	s.NewHost = newHostCost(ctx, bare, p, up, o.newHosts)

	if o.big {
		fmt.Fprintln(os.Stderr, "256 MiB download and upload...")
		for _, pa := range []*path{direct, paths[1]} {
			pa.client = pa.withConns(p, 1)
			s.Transfer[pa.name] = transfer{
				DownloadMBps: pa.download(ctx, up.url(pa.host(), "/v1/models/download")),
				UploadMBps:   pa.upload(ctx, up.url(pa.host(), "/bench/repo.git/git-upload-pack")),
			}
		}
		s.Bulk = map[string]bulkPairs{}
		if i := slices.IndexFunc(all, func(pa *path) bool { return pa.name == "relay" }); i >= 0 {
			s.Bulk["intercept/relay"] = s.measureBulk(ctx, p, up, intercept, all[i], max(o.bulkPairs, 1))
		}
		s.Bulk["full/intercept"] = s.measureBulk(ctx, p, up, fullPath, intercept, max(o.bulkPairs, 1))
	}
	fmt.Fprintln(os.Stderr, "scrubbing with 100 keys over 1, paired...")
	s.Secrets = measureSecrets(max(o.pairs/2, 5))
	fmt.Fprintln(os.Stderr, "a connection per request...")
	s.PerCommand = measurePerCommand(ctx, p, up, bare, full, max(o.pairs/4, 3), max(o.pairs, 30))
	fmt.Fprintln(os.Stderr, "the full pipeline exporting OTLP logs and traces over without, paired...")
	if s.OTel, err = measureOTelCost(ctx, bin, dir, up, p, fullPath, max(o.pairs, 6), o.slice); err != nil {
		return err
	}
	s.Seconds = time.Since(start).Seconds()
	s.ratios()
	s.print(os.Stdout)
	s.H2Upstream.print(os.Stdout)
	s.AgentH2.print(os.Stdout)
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return err
	}
	js, _ := json.MarshalIndent(s, "", "  ")
	return os.WriteFile(o.out, append(js, '\n'), 0o644)
}

func machine() string {
	cpu := ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range splitLines(string(b)) {
			if k, v, ok := cut(l, ":"); ok && k == "model name" {
				cpu = v
				break
			}
		}
	}
	return fmt.Sprintf("%d cores (%s), %s/%s, %s", runtime.NumCPU(), cpu, runtime.GOOS, runtime.GOARCH, runtime.Version())
}

// buildBroker builds the broker binary into dir and returns its path.
func buildBroker(dir string) (string, error) {
	bin := filepath.Join(dir, "broker")
	build := exec.Command("go", "build", "-o", bin, "./cmd/broker")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("building the broker (run from the repository root): %w", err)
	}
	return bin, nil
}
