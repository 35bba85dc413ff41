package main

// Upstreams that speak HTTP/2 (issue 25): most public APIs offer h2, and a broker that
// negotiates it takes another path upstream (net/http's HTTP/2 client connections instead of
// its own HTTP/1.1 exchanges). The bench runs a second upstream beside the HTTP/1.1-only one,
// with the same handler and certificate, offering h2 first in ALPN, and measures each of the
// broker's paths to both, through the same two brokers, in adjacent slices.

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// startH2 starts the h2 upstream: u's handler on a port of its own on hostIntercept, offering
// h2 then http/1.1. Requests that reach it over HTTP/2 are counted (h2Requests), so that a
// check can tell that the broker really spoke HTTP/2 to it.
func (u *upstream) startH2(p *pki) error {
	h2 := &upstream{}
	inner := u.srv.Handler
	h2.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.ProtoMajor == 2 {
				u.h2Requests.Add(1)
			}
			inner.ServeHTTP(w, r)
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{p.leaf}, NextProtos: []string{"h2", "http/1.1"}},
	}
	ln, err := net.Listen("tcp", hostIntercept+":0")
	if err != nil {
		return err
	}
	h2.port = ln.Addr().(*net.TCPAddr).Port
	h2.lns = []net.Listener{ln}
	go func() { _ = h2.srv.ServeTLS(ln, "", "") }() // ServeTLS sets HTTP/2 up
	u.h2 = h2
	return nil
}

// policyPorts are the upstream ports the full pipeline's policy allows, as Rego set members.
func (u *upstream) policyPorts() string {
	ports := []string{"443", strconv.Itoa(u.port)}
	if u.h2 != nil {
		ports = append(ports, strconv.Itoa(u.h2.port))
	}
	return strings.Join(ports, ", ")
}

// h2Paths are direct, intercept and full to the h2 upstream, named with an -h2 suffix. The
// direct client offers only http/1.1 (as every client of the bench does), so direct-h2 is
// HTTP/1.1 to the same server: the h2 upstream's baseline.
func h2Paths(p *pki, paths []*path, up *upstream) []*path {
	var out []*path
	for _, pa := range paths {
		if pa.name == "tunnel" {
			continue // the broker does not see the protocol inside an opaque tunnel
		}
		h2 := &path{name: pa.name + "-h2", url: up.h2.url(hostIntercept, chatPath), via: pa.via, proc: pa.proc}
		h2.client = h2.withConns(p, 0)
		out = append(out, h2)
	}
	return out
}

// checkH2 checks every h2 path once, and that the brokers' requests reached the h2 upstream
// in the protocol the bench's client spoke to the broker: the broker speaks to an upstream
// the protocol its agent spoke (HTTP/2 where the upstream offers it).
func checkH2(ctx context.Context, up *upstream, paths []*path) error {
	for _, pa := range paths {
		before := up.h2Requests.Load()
		if err := pa.check(ctx); err != nil {
			return fmt.Errorf("%s: %w", pa.name, err)
		}
		if overH2 := up.h2Requests.Load() != before; pa.via != nil && overH2 != agentH2 {
			return fmt.Errorf("%s: the broker spoke HTTP/2 to the h2 upstream: %v; for a client offering h2: %v", pa.name, overH2, agentH2)
		}
	}
	return nil
}

// spread is a median with the range it came from.
type spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

func spreadOf(v []float64) spread {
	if len(v) == 0 {
		return spread{}
	}
	return spread{Median: round3(median(v)), Min: round3(slices.Min(v)), Max: round3(slices.Max(v))}
}

// upstreamPair is one path's figures to the HTTP/1.1 and the h2 upstream, slice by slice.
type upstreamPair struct {
	Path string `json:"path"`
	// RPS and CPUUS are requests per second and the broker's CPU microseconds per request
	// (none for direct), per upstream kind.
	H1RPS   spread  `json:"h1_rps"`
	H2RPS   spread  `json:"h2_rps"`
	H1CPUUS *spread `json:"h1_cpu_us,omitempty"`
	H2CPUUS *spread `json:"h2_cpu_us,omitempty"`
	// H1OverH2 is the HTTP/1.1 upstream's throughput over the h2 upstream's, pair by pair
	// (how many times fewer requests the h2 path carries); CPUH2OverH1 the broker's CPU per
	// request to the h2 upstream over that to the HTTP/1.1 one.
	H1OverH2    spread  `json:"h1_over_h2"`
	CPUH2OverH1 *spread `json:"cpu_h2_over_h1,omitempty"`

	h1rps, h2rps, h1cpu, h2cpu, ratio, cpuRatio []float64
}

// h2Result is the JSON summary's h2_upstream: each path to both upstreams in adjacent slices.
type h2Result struct {
	Conns   int            `json:"conns"`
	SliceMS int64          `json:"slice_ms"`
	Rounds  int            `json:"rounds"`
	Paths   []upstreamPair `json:"paths"`
	// OverDirect are intercept/direct and full/direct per upstream kind, each from the same
	// round's slices: "full/direct h2" is full-h2 over direct-h2.
	OverDirect map[string]spread `json:"over_direct"`
}

// measureH2 measures direct, intercept and full to both upstreams in rounds of six adjacent
// slices of d: each path's HTTP/1.1 and h2 slices side by side, the HTTP/1.1 one first in one
// round and the h2 one first in the next.
func measureH2(ctx context.Context, p *pki, h1, h2 []*path, conns, rounds int, d time.Duration) *h2Result {
	fmt.Fprintln(stderr, "HTTP/1.1 upstream against h2 upstream, paired...")
	r := &h2Result{Conns: conns, SliceMS: d.Milliseconds(), Rounds: rounds, OverDirect: map[string]spread{}}
	byName := map[string]*path{}
	for _, pa := range slices.Concat(h1, h2) {
		pa.client = pa.withConns(p, conns)
		byName[pa.name] = pa
	}
	names := []string{"direct", "intercept", "full"}
	pairs := make([]upstreamPair, len(names))
	over := map[string][]float64{}
	for i := range rounds {
		rps := map[string]float64{}
		for j, name := range names {
			a, b := byName[name], byName[name+"-h2"]
			if i%2 == 1 {
				a, b = b, a
			}
			ra := a.closedLoop(ctx, conns, d)
			rb := b.closedLoop(ctx, conns, d)
			if i%2 == 1 {
				ra, rb = rb, ra
			}
			pr := &pairs[j]
			pr.Path = name
			rps[name], rps[name+"-h2"] = ra.rps, rb.rps
			pr.h1rps, pr.h2rps = append(pr.h1rps, ra.rps), append(pr.h2rps, rb.rps)
			if rb.rps > 0 {
				pr.ratio = append(pr.ratio, ra.rps/rb.rps)
			}
			if ra.cpuPerReq > 0 && rb.cpuPerReq > 0 {
				pr.h1cpu, pr.h2cpu = append(pr.h1cpu, ra.cpuPerReq), append(pr.h2cpu, rb.cpuPerReq)
				pr.cpuRatio = append(pr.cpuRatio, rb.cpuPerReq/ra.cpuPerReq)
			}
		}
		for _, kind := range []string{"", "-h2"} {
			if d := rps["direct"+kind]; d > 0 {
				label := " h1"
				if kind != "" {
					label = " h2"
				}
				over["intercept/direct"+label] = append(over["intercept/direct"+label], rps["intercept"+kind]/d)
				over["full/direct"+label] = append(over["full/direct"+label], rps["full"+kind]/d)
			}
		}
	}
	for _, pr := range pairs {
		pr.H1RPS, pr.H2RPS, pr.H1OverH2 = spreadOf(pr.h1rps), spreadOf(pr.h2rps), spreadOf(pr.ratio)
		if len(pr.cpuRatio) > 0 { // none for direct
			h1, h2, ratio := spreadOf(pr.h1cpu), spreadOf(pr.h2cpu), spreadOf(pr.cpuRatio)
			pr.H1CPUUS, pr.H2CPUUS, pr.CPUH2OverH1 = &h1, &h2, &ratio
		}
		r.Paths = append(r.Paths, pr)
	}
	for k, v := range over {
		r.OverDirect[k] = spreadOf(v)
	}
	return r
}

func (r *h2Result) print(out io.Writer) {
	if r == nil {
		return
	}
	fmt.Fprintf(out, "\nHTTP/1.1 upstream against h2 upstream at c=%d, %d rounds of adjacent %d ms slices (median, range):\n", r.Conns, r.Rounds, r.SliceMS)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "path\th1 req/s\th2 req/s\th1/h2\th1 CPU µs/req\th2 CPU µs/req\th2/h1 CPU\t")
	sp := func(s *spread, f string) string {
		if s == nil {
			return "-"
		}
		return fmt.Sprintf(f+" ("+f+"-"+f+")", s.Median, s.Min, s.Max)
	}
	for _, pr := range r.Paths {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", pr.Path, sp(&pr.H1RPS, "%.0f"), sp(&pr.H2RPS, "%.0f"), sp(&pr.H1OverH2, "%.2f"),
			sp(pr.H1CPUUS, "%.0f"), sp(pr.H2CPUUS, "%.0f"), sp(pr.CPUH2OverH1, "%.2f"))
	}
	w.Flush()
	for _, k := range slices.Sorted(maps.Keys(r.OverDirect)) {
		v := r.OverDirect[k]
		fmt.Fprintf(out, "  %s: %s\n", k, sp(&v, "%.2f"))
	}
}
