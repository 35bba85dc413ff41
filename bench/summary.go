package main

import (
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"text/tabwriter"
)

// stderr carries progress; the table goes to stdout.
var stderr io.Writer = os.Stderr

// summary is the JSON written to bench/results/latest.json.
type summary struct {
	Machine string `json:"machine"`
	Started string `json:"started"`
	Commit  string `json:"commit,omitempty"`
	// Agent is what the clients offered in ALPN (-agent): h1 or h2.
	Agent   string  `json:"agent"`
	Seconds float64 `json:"seconds"`
	// Throughput is requests per second by path and number of connections.
	Throughput map[string]map[int]float64 `json:"throughput_rps"`
	// Ratios are the throughput ratios the targets are stated in.
	Ratios map[string]map[int]float64 `json:"ratios"`
	// FullOverIntercept is the full pipeline's throughput over the bare intercepted path's at
	// 32 connections, measured in pairs of adjacent slices: the figure the target is read from.
	FullOverIntercept paired `json:"full_over_intercept_paired"`
	// InterceptOverDirect is the bare intercepted path's throughput over direct HTTPS at 32
	// connections, measured the same way: the figure the second target is read from.
	InterceptOverDirect paired `json:"intercept_over_direct_paired"`
	// Paired are the other ratios the targets are read from, measured the same way, by
	// "num/den": the broker's paths over the relay and the peers (measureTargets).
	Paired map[string]paired `json:"paired"`
	// AddedP50Paired is the full pipeline's open-loop p50 minus direct's, in pairs of slices.
	AddedP50Paired pairedDiff `json:"added_p50_full_paired"`
	// CPUPerRequestUS is the proxy's CPU time (with its child processes) per request, at c=8.
	CPUPerRequestUS map[string]float64   `json:"proxy_cpu_per_request_us"`
	Latency         map[string]latency   `json:"latency_open_loop"`
	LatencyRate     int                  `json:"latency_rate_rps"`
	AddedP50MS      map[string]float64   `json:"added_p50_ms"`
	NewHost         newHost              `json:"new_host"`
	IdleConnBytes   int64                `json:"idle_intercepted_conn_bytes"`
	SSE             map[string]sseResult `json:"sse_delay"`
	Transfer        map[string]transfer  `json:"transfer_256mib"`
	// Bulk are the 256 MiB transfers' paired ratios, by "num/den" (bulk.go).
	Bulk map[string]bulkPairs `json:"bulk_paired,omitempty"`
	// Secrets is scrubbing with many keys over one key, paired (secrets.go).
	Secrets secretsResult `json:"scrub_secrets_paired,omitempty"`
	// PerCommand is a connection per request, split into its parts (percommand.go).
	PerCommand *perCommand `json:"connection_per_request,omitempty"`
	// H2Upstream is each path to the HTTP/1.1 and the h2 upstream in adjacent slices (h2.go).
	H2Upstream *h2Result `json:"h2_upstream,omitempty"`
	// AgentH2 is each broker path with an HTTP/1.1 and an h2 client, paired (agenth2.go).
	AgentH2 *agentH2Result `json:"agent_h2,omitempty"`
	// Peers are the other proxies measured on the same upstream, or why they were skipped;
	// their figures are in the maps above under their names.
	Peers map[string]peerResult `json:"peers"`
	// Transparent is the transparent path beside the explicit intercepted one (transparent.go).
	Transparent *transparentResult `json:"transparent,omitempty"`
	// OTel is the full pipeline exporting OTLP logs and traces over without (issue 36).
	OTel    *otelCost `json:"otel,omitempty"`
	Targets []target  `json:"targets"`
}

// target is one of issue 25's goals (or issue 7's), checked against this run.
type target struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Limit float64 `json:"limit"`
	Unit  string  `json:"unit"`
	Op    string  `json:"op"` // >= or <=: how Value is held against Limit
	Met   bool    `json:"met"`
	// Min, Max and Pairs are the range of the pairs the value is the median of; Low and High
	// the 95% confidence interval of that median (medianCI). A limit inside it is within
	// the run's noise: the run does not tell whether the target is met.
	Min   float64 `json:"min,omitempty"`
	Max   float64 `json:"max,omitempty"`
	Pairs int     `json:"pairs,omitempty"`
	Low   float64 `json:"ci_low,omitempty"`
	High  float64 `json:"ci_high,omitempty"`
	// Skipped says why the target could not be checked (a peer not measured).
	Skipped string `json:"skipped,omitempty"`
}

// of sets t's value from its pairs' figures: their median, their range, and the median's
// confidence interval.
func (t *target) of(v []float64) {
	t.Value, t.Min, t.Max, t.Pairs = median(v), slices.Min(v), slices.Max(v), len(v)
	t.Low, t.High = medianCI(v)
}

// withinNoise reports whether t's limit lies inside its median's confidence interval.
func (t *target) withinNoise() bool {
	return t.Pairs > 0 && t.Low <= t.Limit && t.Limit <= t.High
}

var conns = []int{1, 8, 32, 128}

func (s *summary) ratios() {
	s.Ratios = map[string]map[int]float64{}
	ratio := func(name, num, den string) {
		s.Ratios[name] = map[int]float64{}
		for _, c := range conns {
			if d := s.Throughput[den][c]; d > 0 {
				s.Ratios[name][c] = s.Throughput[num][c] / d
			}
		}
	}
	ratio("tunnel/direct", "tunnel", "direct")
	ratio("intercept/direct", "intercept", "direct")
	ratio("full/direct", "full", "direct")
	ratio("full/intercept", "full", "intercept")
	// A peer against direct, and the broker path it compares with against the peer.
	for _, pe := range s.measuredPeers() {
		ratio(pe+"/direct", pe, "direct")
		ratio(s.Peers[pe].ComparedWith+"/"+pe, s.Peers[pe].ComparedWith, pe)
	}
	s.AddedP50MS = map[string]float64{}
	for _, p := range append([]string{"tunnel", "intercept", "full"}, s.measuredPeers()...) {
		s.AddedP50MS[p] = s.Latency[p].P50MS - s.Latency["direct"].P50MS
	}
	s.checkTargets()
}

// saturated says whether the path's best throughput is under the open-loop rate.
func (s *summary) saturated(p string) bool {
	best := 0.0
	for _, v := range s.Throughput[p] {
		best = max(best, v)
	}
	return best < float64(s.LatencyRate)
}

// measuredPeers are the peers with figures, in the order of peerList.
func (s *summary) measuredPeers() []string {
	var names []string
	for _, pe := range peerList {
		if r, ok := s.Peers[pe.name]; ok && r.Skipped == "" {
			names = append(names, pe.name)
		}
	}
	return names
}

func (s *summary) print(out io.Writer) {
	fmt.Fprintf(out, "\nmachine: %s\n\n", s.Machine)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	rows := append([]string{"direct", "tunnel", "intercept", "full"}, s.measuredPeers()...)
	fmt.Fprintln(w, "throughput (req/s)\tc=1\tc=8\tc=32\tc=128\tCPU µs/req\t")
	for _, p := range rows {
		fmt.Fprintf(w, "%s\t", p)
		for _, c := range conns {
			fmt.Fprintf(w, "%.0f\t", s.Throughput[p][c])
		}
		if cpu, ok := s.CPUPerRequestUS[p]; ok {
			fmt.Fprintf(w, "%.0f\t\n", cpu)
		} else {
			fmt.Fprint(w, "-\t\n")
		}
	}
	ratios := []string{"tunnel/direct", "intercept/direct", "full/direct", "full/intercept"}
	for _, pe := range s.measuredPeers() {
		ratios = append(ratios, pe+"/direct", s.Peers[pe].ComparedWith+"/"+pe)
	}
	for _, r := range ratios {
		fmt.Fprintf(w, "%s\t", r)
		for _, c := range conns {
			fmt.Fprintf(w, "%.2fx\t", s.Ratios[r][c])
		}
		fmt.Fprint(w, "\t\n")
	}
	w.Flush()
	s.FullOverIntercept.print(out, "full/intercept")
	s.InterceptOverDirect.print(out, "intercept/direct")
	for _, k := range slices.Sorted(maps.Keys(s.Paired)) {
		s.Paired[k].print(out, k)
	}
	if d := s.AddedP50Paired; len(d.DiffsMS) > 0 {
		fmt.Fprintf(out, "full pipeline's added p50 at %d req/s in %d pairs of %d ms open-loop slices with direct: median %.3f ms (%.2f to %.2f)\n",
			d.Rate, len(d.DiffsMS), d.SliceMS, d.Median, slices.Min(d.DiffsMS), slices.Max(d.DiffsMS))
	}
	fmt.Fprintln(out)
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "path\tp50 ms\tp99 ms\tadded p50 ms\tSSE delay mean/max ms\tdownload MiB/s\tupload MiB/s\t")
	over := false
	for _, p := range rows {
		l, e, t := s.Latency[p], s.SSE[p], s.Transfer[p]
		name := p
		if s.saturated(p) {
			name, over = p+" (*)", true
		}
		fmt.Fprintf(w, "%s\t%.2f\t%.2f\t%.2f\t", name, l.P50MS, l.P99MS, s.AddedP50MS[p])
		if _, peer := s.Peers[p]; peer { // peers are not streamed through
			fmt.Fprint(w, "-\t-\t-\t\n")
			continue
		}
		fmt.Fprintf(w, "%.2f / %.2f\t%.0f\t%.0f\t\n", e.MeanDelayMS, e.MaxDelayMS, t.DownloadMBps, t.UploadMBps)
	}
	w.Flush()
	if over {
		fmt.Fprintf(out, "(*) its best throughput is under the open-loop rate of %d req/s: requests queue\n", s.LatencyRate)
	}
	fmt.Fprintf(out, "\nnew host first request: %.2f ms, cached: %.2f ms (extra %.2f ms, median of %d hosts)\n",
		s.NewHost.FirstMS, s.NewHost.CachedMS, s.NewHost.ExtraMS, s.NewHost.Hosts)
	fmt.Fprintf(out, "idle intercepted connection: %.1f KiB of broker RSS\n", float64(s.IdleConnBytes)/1024)
	for _, pe := range peerList {
		if r := s.Peers[pe.name]; r.Skipped != "" {
			fmt.Fprintf(out, "skipped: %s: %s\n", pe.name, r.Skipped)
		} else {
			fmt.Fprintf(out, "peer %s: %s, compared with the broker's %s path\n", pe.name, r.Version, r.ComparedWith)
		}
	}
	s.Transparent.print(out)
	if len(s.Bulk) > 0 || s.Secrets != nil || s.PerCommand != nil {
		fmt.Fprintln(out, "\nbulk transfers, many keys, a connection per request (issue 40):")
		s.printBulk(out)
		s.Secrets.print(out)
		s.PerCommand.print(out)
	}
	s.printTargets(out)
	fmt.Fprintf(out, "took %.0f s\n", s.Seconds)
}

// print writes the pairs' median, their range and the CPU the hypervisor took meanwhile.
func (f paired) print(out io.Writer, name string) {
	if len(f.Ratios) == 0 {
		return
	}
	var steal float64
	for _, st := range f.Steal {
		steal += (st[0] + st[1]) / 2
	}
	fmt.Fprintf(out, "%s at c=%d in %d pairs of adjacent %d ms slices: median %.3fx (%.2f to %.2f); CPU stolen by the hypervisor meanwhile: %.1f%%\n",
		name, f.Conns, len(f.Ratios), f.SliceMS, f.Median, slices.Min(f.Ratios), slices.Max(f.Ratios), 100*steal/float64(max(len(f.Steal), 1)))
	if len(f.CPURatios) > 0 {
		var num, den []float64
		for _, c := range f.CPUUS {
			num, den = append(num, c[0]), append(den, c[1])
		}
		fmt.Fprintf(out, "  broker CPU per request in the same pairs: median %.3fx (%.2f to %.2f); %.0f µs over %.0f µs\n",
			f.CPUMedian, slices.Min(f.CPURatios), slices.Max(f.CPURatios), median(num), median(den))
	}
	if len(f.MachineUS) > 0 {
		var num, den []float64
		for _, c := range f.MachineUS {
			num, den = append(num, c[0]), append(den, c[1])
		}
		fmt.Fprintf(out, "  the machine's CPU per request (every process, the kernel's included): %.0f µs over %.0f µs\n", median(num), median(den))
	}
}
