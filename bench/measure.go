package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// requestBody is what every small request sends: a chat completion the shipped policy allows.
var requestBody = []byte(`{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"Say ok."}],"max_tokens":8}`)

// path is one way of reaching the upstream.
type path struct {
	name   string
	client *http.Client
	url    string
	via    *via     // nil for direct
	proc   *process // the proxy whose CPU time is charged to the requests; nil for direct
	// h2 makes the path's client offer h2 first whatever -agent says (agenth2.go).
	h2 bool
}

// via is a proxy between the client and the upstream.
type via struct {
	addr  string
	user  *url.Userinfo  // proxy credentials, nil for none
	roots *x509.CertPool // what the client trusts behind the proxy: the upstream's CA, or the proxy's
}

func (pa *path) host() string {
	u, _ := url.Parse(pa.url)
	return u.Hostname()
}

// agentH2 makes the bench's clients offer h2 before http/1.1 (-agent h2): a broker then serves
// them over HTTP/2, and speaks HTTP/2 to an upstream that offers it.
var agentH2 bool

// keepAlive is false for a connection per request (-keepalive=false).
var keepAlive = true

func directClient(p *pki, conns int) *http.Client {
	return &http.Client{Transport: newTransport(nil, p.pool, conns), Timeout: time.Minute}
}

func (v *via) client(conns int) *http.Client {
	pu := &url.URL{Scheme: "http", User: v.user, Host: v.addr}
	return &http.Client{Transport: newTransport(http.ProxyURL(pu), v.roots, conns), Timeout: time.Minute}
}

func newTransport(proxy func(*http.Request) (*url.URL, error), roots *x509.CertPool, conns int) *http.Transport {
	if conns <= 0 {
		conns = 2
	}
	return &http.Transport{
		Proxy: proxy, TLSClientConfig: &tls.Config{RootCAs: roots},
		MaxIdleConns: conns, MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns,
		DisableCompression: true, ForceAttemptHTTP2: agentH2, DisableKeepAlives: !keepAlive,
	}
}

// withConns returns a fresh client for the path with a pool of conns connections.
func (pa *path) withConns(p *pki, conns int) *http.Client {
	if pa.client != nil {
		pa.client.CloseIdleConnections()
	}
	c := directClient(p, conns)
	if pa.via != nil {
		c = pa.via.client(conns)
	}
	if pa.h2 {
		c.Transport.(*http.Transport).ForceAttemptHTTP2 = true
	}
	c.Transport.(*http.Transport).DialContext = pa.countingDial() // for loopStats
	return c
}

// post sends the small request every phase measures.
func (pa *path) post(ctx context.Context) (*http.Response, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, pa.url, bytes.NewReader(requestBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "brokerbench/1")
	return pa.client.Do(req)
}

func (pa *path) do(ctx context.Context) error {
	resp, err := pa.post(ctx)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return err
}

// proto is the protocol the client speaks on the path's first hop (to the proxy behind
// CONNECT, or to the upstream): "HTTP/1.1" or "HTTP/2.0".
func (pa *path) proto(ctx context.Context) (string, error) {
	resp, err := pa.post(ctx)
	if err != nil {
		return "", err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.Proto, nil
}

// check is do, with the response's body compared with what the upstream sends.
func (pa *path) check(ctx context.Context) error {
	resp, err := pa.post(ctx)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, smallBody) {
		return fmt.Errorf("check request: status %d: %.300s", resp.StatusCode, body)
	}
	return nil
}

type throughputResult struct {
	rps       float64
	cpuPerReq float64 // the proxy's CPU microseconds per request
	steal     float64 // the fraction of the machine's CPU time the hypervisor took meanwhile
	// machinePerReq is the whole machine's CPU microseconds per request (every process and
	// the kernel; with a proxy process only): the broker's, the client's, the upstream's,
	// and whatever else the path makes run, such as an OTLP receiver.
	machinePerReq float64
}

// throughput runs conns closed-loop clients for d, after one warm-up request each.
func (pa *path) throughput(ctx context.Context, conns int, d time.Duration) throughputResult {
	r := pa.closedLoop(ctx, conns, d)
	fmt.Fprintf(stderr, "  %-11s c=%-3d %8.0f req/s\n", pa.name, conns, r.rps)
	return r
}

// closedLoop is throughput without the progress line.
func (pa *path) closedLoop(ctx context.Context, conns int, d time.Duration) throughputResult {
	var wg sync.WaitGroup
	for range conns {
		wg.Add(1)
		go func() { defer wg.Done(); _ = pa.do(ctx) }()
	}
	wg.Wait()
	var n, errs atomic.Int64
	var cpu0 time.Duration
	if pa.proc != nil {
		cpu0 = pa.proc.cpu()
	}
	mc0 := readMachineCPU()
	start := time.Now()
	deadline := start.Add(d)
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				if pa.do(ctx) != nil {
					errs.Add(1)
					continue
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	mc := readMachineCPU().since(mc0)
	r := throughputResult{rps: float64(n.Load()) / el.Seconds(), steal: mc.stealFraction()}
	if pa.proc != nil && n.Load() > 0 {
		r.cpuPerReq = float64((pa.proc.cpu() - cpu0).Microseconds()) / float64(n.Load())
		r.machinePerReq = mc.busyUS() / float64(n.Load())
	}
	if e := errs.Load(); e > 0 {
		fmt.Printf("  %s c=%d: %d errors\n", pa.name, conns, e)
	}
	return r
}

// paired is one path's throughput over another's, measured in adjacent slices.
type paired struct {
	Conns   int       `json:"conns"`
	SliceMS int64     `json:"slice_ms"`
	Ratios  []float64 `json:"ratios"` // one per pair of slices, in the order measured
	Median  float64   `json:"median"`
	// Steal is the fraction of the machine's CPU time the hypervisor took during each pair's
	// slices (num's, den's): on a shared VM, what moves a pair's ratio besides the broker.
	Steal [][2]float64 `json:"steal"`
	// CPURatios are, when both paths are the broker's, num's broker CPU time per request over
	// den's in each pair, and CPUMedian their median: what the extra work costs the broker
	// itself, apart from the client and the upstream that share the machine.
	CPURatios []float64 `json:"cpu_ratios,omitempty"`
	CPUMedian float64   `json:"cpu_median,omitempty"`
	// CPUUS are num's and den's broker CPU microseconds per request in each pair.
	CPUUS [][2]float64 `json:"cpu_us,omitempty"`
	// MachineUS are the whole machine's CPU microseconds per request in num's and den's
	// slices of each pair (every process and the kernel; to 10 ms ticks): where a ratio of
	// requests moves more than the broker's CPU explains, the rest of the machine did more.
	MachineUS [][2]float64 `json:"machine_us,omitempty"`
}

// pairedRatio measures num's throughput over den's at conns connections in pairs of
// adjacent slices of d each, den first in one pair and num first in the next, and keeps the
// median of the pairs' ratios. A burst of load from outside (a shared machine) then falls on
// both slices of a pair alike, or on one pair among many, where the best rounds of two paths
// measured seconds apart can catch one of them in a quiet moment and the other in a busy one.
func pairedRatio(ctx context.Context, num, den *path, conns, pairs int, d time.Duration) paired {
	r := paired{Conns: conns, SliceMS: d.Milliseconds()}
	for i := range pairs {
		n, m := adjacentSlices(ctx, i, num, den, conns, d) // num's and den's
		if m.rps > 0 {
			r.Ratios = append(r.Ratios, n.rps/m.rps)
			r.Steal = append(r.Steal, [2]float64{round3(n.steal), round3(m.steal)})
		}
		if n.cpuPerReq > 0 && m.cpuPerReq > 0 {
			r.CPURatios = append(r.CPURatios, n.cpuPerReq/m.cpuPerReq)
			r.CPUUS = append(r.CPUUS, [2]float64{round3(n.cpuPerReq), round3(m.cpuPerReq)})
			r.MachineUS = append(r.MachineUS, [2]float64{round3(n.machinePerReq), round3(m.machinePerReq)})
		}
	}
	r.Median, r.CPUMedian = median(r.Ratios), median(r.CPURatios)
	fmt.Fprintf(stderr, "  %s/%s c=%d: median %.2fx of %d pairs\n", num.name, den.name, conns, r.Median, len(r.Ratios))
	return r
}

// adjacentSlices measures a and b at conns connections for d each, in adjacent slices of pair
// i: b first in even pairs, a first in odd ones, so that neither path always has the first.
func adjacentSlices(ctx context.Context, i int, a, b *path, conns int, d time.Duration) (ra, rb throughputResult) {
	if i%2 == 0 {
		rb = b.closedLoop(ctx, conns, d)
		ra = a.closedLoop(ctx, conns, d)
	} else {
		ra = a.closedLoop(ctx, conns, d)
		rb = b.closedLoop(ctx, conns, d)
	}
	return ra, rb
}

// median is the middle of v, or the mean of its middle two; 0 for none.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	sorted := slices.Sorted(slices.Values(v))
	if len(sorted)%2 == 0 {
		return (sorted[len(sorted)/2-1] + sorted[len(sorted)/2]) / 2
	}
	return sorted[len(sorted)/2]
}

// medianCI is the 95% confidence interval of the median of v, figures of independent pairs,
// from their order statistics whatever their distribution (the sign test's interval): the
// k-th smallest and the k-th largest, k the largest for which fewer than k of n values fall
// below the true median with a chance of 2.5% at most (Binomial(n, 1/2)). With under 6
// values no k does, and it is the range, with less than 95% confidence. On a 2-core machine
// the pairs of a 256 MiB download range from 0.7 to 1.3x: the interval of 15 pairs is about
// 0.3 wide, of 60 about 0.1.
func medianCI(v []float64) (lo, hi float64) {
	s := slices.Sorted(slices.Values(v))
	n := len(s)
	if n == 0 {
		return 0, 0
	}
	k := 1
	pmf := math.Pow(0.5, float64(n)) // P(X = k-1), X ~ Binomial(n, 1/2)
	cdf := pmf                       // P(X <= k-1)
	for k < n/2 {
		pmf *= float64(n-k+1) / float64(k) // P(X = k)
		if cdf+pmf > 0.025 {
			break
		}
		cdf += pmf
		k++
	}
	return s[k-1], s[n-k]
}

type latency struct {
	P50MS, P99MS float64
	Sent, Errors int
}

// openLoop sends rate requests per second for d, each timed from its scheduled send.
//
// Before it, it sends at the same rate for latencyWarmUp, uncounted: the pool then holds the
// connections this rate needs (arrivals overlap now and then, each overlap a connection), and
// the processes on the path have been running at the rate. It used to send eight requests in
// sequence, which leave one connection: concurrent arrivals early in the slice then opened
// new ones inside it, and timed the handshakes (a CONNECT and two TLS handshakes through an
// intercepting proxy, one TLS handshake direct), so that a short slice measured the pool's
// warming more than the path. The target is the median at that rate, in steady state; both
// sides of every pair get the same warm-up.
func (pa *path) openLoop(ctx context.Context, rate int, d time.Duration) latency {
	l, _ := pa.timedLoop(ctx, rate, d)
	fmt.Fprintf(stderr, "  %-11s p50 %.2f ms p99 %.2f ms\n", pa.name, l.P50MS, l.P99MS)
	return l
}

type newHost struct {
	FirstMS, CachedMS, ExtraMS float64
	Hosts                      int
}

// newHostCost times a request on a new connection to a host the broker has never seen
// (certificate issue, upstream dial), then a request on another new connection to the same
// host (certificate cached). Medians over hosts.
func newHostCost(ctx context.Context, b *broker, p *pki, up *upstream, hosts int) newHost {
	var first, cached []time.Duration
	for i := range hosts {
		host := fmt.Sprintf("127.0.0.%d", firstNewHost+i)
		pa := &path{name: "intercept", url: up.url(host, chatPath), via: b.intercepting()}
		for round := range 2 {
			pa.client = pa.via.client(1)
			t := time.Now()
			if err := pa.do(ctx); err != nil {
				fmt.Fprintf(stderr, "  new host %s: %v\n", host, err)
				continue
			}
			el := time.Since(t)
			pa.client.CloseIdleConnections()
			if round == 0 {
				first = append(first, el)
			} else {
				cached = append(cached, el)
			}
		}
	}
	r := newHost{FirstMS: medianMS(first), CachedMS: medianMS(cached), Hosts: hosts}
	r.ExtraMS = r.FirstMS - r.CachedMS
	fmt.Fprintf(stderr, "  new host: first %.2f ms, cached %.2f ms\n", r.FirstMS, r.CachedMS)
	return r
}

func medianMS(d []time.Duration) float64 {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return float64(d[len(d)/2].Microseconds()) / 1000
}

// idleCost opens n intercepted tunnels, makes one request on each and leaves them idle; it
// returns the broker's resident memory growth per connection.
func idleCost(b *broker, up *upstream, n int) int64 {
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	open := func() error {
		c, err := net.Dial("tcp", b.proxyAddr)
		if err != nil {
			return err
		}
		conns = append(conns, c)
		target := fmt.Sprintf("%s:%d", hostIntercept, up.port)
		auth := basicAuth(agentID, b.token)
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", target, target, auth)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("CONNECT: %s", resp.Status)
		}
		tc := tls.Client(c, &tls.Config{RootCAs: b.caPool, ServerName: hostIntercept})
		conns[len(conns)-1] = tc
		fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", target)
		resp, err = http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return nil
	}
	// Warm up: the first connections grow pools that later ones reuse.
	for range 20 {
		if err := open(); err != nil {
			fmt.Fprintln(stderr, "  idle:", err)
			return 0
		}
	}
	time.Sleep(500 * time.Millisecond)
	before := b.rss()
	for range n {
		if err := open(); err != nil {
			fmt.Fprintln(stderr, "  idle:", err)
			return 0
		}
	}
	time.Sleep(time.Second)
	per := (b.rss() - before) / int64(n)
	fmt.Fprintf(stderr, "  idle intercepted connection: %d KiB\n", per>>10)
	return per
}

type sseResult struct {
	MeanDelayMS, MaxDelayMS float64
}

// measureSSE measures each path's SSE delay (sse) into into.
func measureSSE(ctx context.Context, up *upstream, paths []*path, into map[string]sseResult) {
	for _, pa := range paths {
		into[pa.name] = pa.sse(ctx, up.url(pa.host(), "/v1/models/sse"))
	}
}

// sse reads an event stream whose events carry their send time and reports how late they came.
func (pa *path) sse(ctx context.Context, u string) sseResult {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	resp, err := pa.client.Do(req)
	if err != nil {
		fmt.Fprintln(stderr, "  sse:", err)
		return sseResult{}
	}
	defer resp.Body.Close()
	var sum, max time.Duration
	n := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		ns, _ := strconv.ParseInt(v, 10, 64)
		d := time.Since(time.Unix(0, ns))
		sum += d
		max = maxDur(max, d)
		n++
	}
	if n != sseEvents {
		fmt.Fprintf(stderr, "  sse %s: %d of %d events (status %d)\n", pa.name, n, sseEvents, resp.StatusCode)
		return sseResult{}
	}
	r := sseResult{MeanDelayMS: float64((sum / time.Duration(n)).Microseconds()) / 1000, MaxDelayMS: float64(max.Microseconds()) / 1000}
	fmt.Fprintf(stderr, "  %-11s SSE delay mean %.2f ms max %.2f ms\n", pa.name, r.MeanDelayMS, r.MaxDelayMS)
	return r
}

func maxDur(a, b time.Duration) time.Duration {
	if a > b {
		return a
	}
	return b
}

type transfer struct {
	DownloadMBps, UploadMBps float64
}

func (pa *path) download(ctx context.Context, u string) float64 {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	t := time.Now()
	resp, err := pa.client.Do(req)
	if err != nil {
		fmt.Fprintln(stderr, "  download:", err)
		return 0
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || n != bigSize {
		fmt.Fprintf(stderr, "  download %s: %d bytes, %v (status %d)\n", pa.name, n, err, resp.StatusCode)
		return 0
	}
	mbps := float64(n) / (1 << 20) / time.Since(t).Seconds()
	fmt.Fprintf(stderr, "  %-11s download %.0f MiB/s\n", pa.name, mbps)
	return mbps
}

func (pa *path) upload(ctx context.Context, u string) float64 {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, u, io.LimitReader(pattern{}, bigSize))
	req.ContentLength = bigSize
	req.Header.Set("Content-Type", "application/x-git-upload-pack-request")
	t := time.Now()
	resp, err := pa.client.Do(req)
	if err != nil {
		fmt.Fprintln(stderr, "  upload:", err)
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "  upload %s: status %d\n", pa.name, resp.StatusCode)
		return 0
	}
	mbps := float64(bigSize) / (1 << 20) / time.Since(t).Seconds()
	fmt.Fprintf(stderr, "  %-11s upload %.0f MiB/s\n", pa.name, mbps)
	return mbps
}

// pattern is an endless stream of letters.
type pattern struct{}

func (pattern) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'a' + byte(i%26)
	}
	return len(p), nil
}

func basicAuth(user, pass string) string {
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	r.SetBasicAuth(user, pass)
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Basic ")
}

func splitLines(s string) []string { return strings.Split(s, "\n") }

func cut(s, sep string) (string, string, bool) {
	k, v, ok := strings.Cut(s, sep)
	return strings.TrimSpace(k), strings.TrimSpace(v), ok
}

func round3(f float64) float64 { return math.Round(f*1000) / 1000 }
