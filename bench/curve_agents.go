package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"time"
)

// The agents curve: 1 to 10,000 agents in the config, each with a token (its SHA-256 in the
// config) and a source address, and requests from the last of them, by token and by source
// address, through the bare pipeline (allow-all policy: what is measured is identity and
// admission, not the policy). Each point is a broker with that many agents, measured in
// slices alternating with a broker of one agent.
func init() { registerCurve("agents", curveAgents) }

// agentsConfig is a bare broker's config with n agents; the last one, measured, is
// bench-agent with token bench-token and the address 127.0.0.1 (the bench's clients).
func agentsConfig(caLines, polDir, upstreamCA string, n int) string {
	var b strings.Builder
	b.WriteString(`proxy: {listen: "127.0.0.1:0", max_connections_per_agent: 1024}
admin: {listen: "127.0.0.1:0"}
`)
	b.WriteString(caLines)
	fmt.Fprintf(&b, "policy: {dir: %q, mode: enforce}\nupstream:\n  ca_file: %q\n  allow_private: [\"127.0.0.0/8\"]\nagents:\n", polDir, upstreamCA)
	for i := range n - 1 {
		sum := sha256.Sum256(fmt.Appendf(nil, "token-%d", i))
		fmt.Fprintf(&b, "  - {id: agent-%d, token_sha256: %s, addresses: [\"10.%d.%d.%d\"], labels: {team: t%d}}\n",
			i, hex.EncodeToString(sum[:]), i>>16&255, i>>8&255, i&255, i%10)
	}
	sum := sha256.Sum256([]byte("bench-token"))
	fmt.Fprintf(&b, "  - {id: %s, token_sha256: %s, addresses: [\"127.0.0.1\"], labels: {team: bench}}\n", agentID, hex.EncodeToString(sum[:]))
	return b.String()
}

func curveAgents(ctx context.Context, env curveEnv) (Curve, error) {
	c := Curve{Name: "agents", Title: "Agents in the config: throughput of one agent's requests",
		XLabel: "agents configured", YLabel: "requests/s (8 connections, bare pipeline)", LogX: true}
	curveHeader(&c)
	sizes := curveSizes(env, []int{1, 10, 100, 1000, 10000})
	pairs, slice := 6, 300*time.Millisecond
	if env.quick {
		pairs, slice = 2, 150*time.Millisecond
	}
	const conns = 8
	p, up, err := env.upstream()
	if err != nil {
		return c, err
	}
	defer up.close()
	start := func(name string, n int) (*curveBroker, error) {
		dir := filepath.Join(env.dir, name)
		caLines, err := curveCA(env.bin, dir)
		if err != nil {
			return nil, err
		}
		polDir := filepath.Join(dir, "policies")
		if err := mkdirAll(polDir); err != nil {
			return nil, err
		}
		if err := writeAllowAll(polDir); err != nil {
			return nil, err
		}
		return startCurveBroker(env.bin, dir, agentsConfig(caLines, polDir, p.caFile, n))
	}
	base, err := start("agents-base", 1)
	if err != nil {
		return c, err
	}
	defer base.stop()
	// byToken sends the agent's proxy password; byAddress sends none, so the broker
	// identifies the agent by the connection's source address.
	paths := func(b *curveBroker) (byToken, byAddress *path) {
		u := up.url(hostIntercept, chatPath)
		byToken = &path{name: "token", url: u, proc: b.process,
			via: &via{addr: b.proxyAddr, user: url.UserPassword(agentID, "bench-token"), roots: b.caPool}}
		byAddress = &path{name: "address", url: u, proc: b.process, via: &via{addr: b.proxyAddr, roots: b.caPool}}
		for _, pa := range []*path{byToken, byAddress} {
			pa.client = pa.withConns(p, conns)
		}
		return byToken, byAddress
	}
	baseToken, baseAddr := paths(base)
	for _, pa := range []*path{baseToken, baseAddr} {
		if err := pa.check(ctx); err != nil {
			return c, fmt.Errorf("agents baseline, %s: %w", pa.name, err)
		}
	}
	series := map[string]*Series{"token": {Name: "by token"}, "address": {Name: "by source address"}}
	for _, n := range sizes {
		b, err := start(fmt.Sprintf("agents-%d", n), n)
		if err != nil {
			return c, fmt.Errorf("%d agents: %w", n, err)
		}
		tok, addr := paths(b)
		for _, pair := range [][2]*path{{tok, baseToken}, {addr, baseAddr}} {
			pt, bl := pair[0], pair[1]
			if err := pt.check(ctx); err != nil {
				b.stop()
				return c, fmt.Errorf("%d agents, %s: %w", n, pt.name, err)
			}
			r := measurePair(ctx, pt, bl, conns, pairs, slice)
			s := series[pt.name]
			s.Points = append(s.Points, Point{X: float64(n), Y: round3(r.rps), Baseline: round3(r.baseRPS), Extra: map[string]float64{
				"cpu_us_per_request": round3(r.cpu), "baseline_cpu_us_per_request": round3(r.baseCPU),
				"ratio_median": round3(median(r.ratios)), "ratio_min": round3(minOf(r.ratios)), "ratio_max": round3(maxOf(r.ratios)),
			}})
			fmt.Fprintf(stderr, "  agents=%-5d %-7s %6.0f req/s (baseline %6.0f), %.1f µs CPU/req (baseline %.1f)\n",
				n, pt.name, r.rps, r.baseRPS, r.cpu, r.baseCPU)
		}
		rss, baseRSS := settledRSS(b.process), settledRSS(base.process)
		for _, s := range series {
			pt := &s.Points[len(s.Points)-1]
			pt.Extra["rss_mib"], pt.Extra["baseline_rss_mib"] = round3(rss), round3(baseRSS)
			pt.Extra["listening_ms"] = float64(b.listening.Milliseconds())
			pt.Extra["heap_mib"], pt.Extra["baseline_heap_mib"] = round3(b.heapMiB(ctx)), round3(base.heapMiB(ctx))
			pt.Extra["live_heap_mib_est"], pt.Extra["baseline_live_heap_mib_est"] = round3(b.liveHeapMiB(ctx)), round3(base.liveHeapMiB(ctx))
		}
		fmt.Fprintf(stderr, "  agents=%-5d RSS %.1f MiB (baseline %.1f), heap %.1f MiB (baseline %.1f), listening after %s\n",
			n, rss, baseRSS, b.heapMiB(ctx), base.heapMiB(ctx), b.listening.Round(time.Millisecond))
		b.stop()
	}
	c.Series = []Series{*series["token"], *series["address"]}
	c.Note = "Per request, identity by token is one map lookup by agent id and one SHA-256 of the " +
		"presented token (constant in the number of agents); by source address, one map lookup per " +
		"distinct prefix length configured (at most 33 for IPv4, 129 for IPv6), no longer a scan of " +
		"every agent. Admission counts connections and requests in maps keyed by agent. Memory " +
		"grows linearly with the agents configured (their ids, labels, token digests and addresses)."
	return c, nil
}

func minOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	m := v[0]
	for _, x := range v {
		m = min(m, x)
	}
	return m
}

func maxOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	m := v[0]
	for _, x := range v {
		m = max(m, x)
	}
	return m
}
