package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"time"
)

// The idle curve: 1,000 and 10,000 intercepted connections, each having made one request
// and then left idle, held on one broker: its memory and file descriptors per connection,
// and the throughput of 32 active connections meanwhile, beside the same load on a second
// broker holding none (adjacent slices, taken in turn).
func init() { registerCurve("idle", idleCurve) }

// idleLimits let one agent hold the curve's largest point.
const idleLimits = "max_connections: 30000, max_connections_per_agent: 30000"

func idleCurve(ctx context.Context, env curveEnv) (Curve, error) {
	points, pairs, slice := []int{1000, 10000}, 8, 500*time.Millisecond
	if env.quick {
		points, pairs = []int{1000}, 3
	}
	c := Curve{
		Name: "idle", Title: "Idle intercepted connections held by one broker",
		XLabel: "idle intercepted connections (one request each, then quiet)", YLabel: "broker RSS per idle connection, KiB", LogX: true,
		Note: "Memory and descriptors are the broker's growth from before the connections were opened to a second after the last, over their number; " +
			"throughput_c32 is 32 active connections on the broker holding them, and its baseline the same load on a broker holding none, " +
			fmt.Sprintf("medians of %d pairs of %d ms slices. An idle HTTP/1.1 tunnel is parked after 100 ms (its TLS state and one small goroutine stay); ", pairs, slice.Milliseconds()) +
			"the server's idle timeout (90 s) ends it; proxy.max_connections (4,096 by default) bounds how many are held.",
	}
	p, up, err := env.upstream()
	if err != nil {
		return c, err
	}
	defer up.close()
	c.Series = []Series{{Name: "bare broker, intercepted"}}
	for _, n := range points {
		pt, err := idlePoint(ctx, env, up, p, n, pairs, slice)
		if err != nil {
			return c, fmt.Errorf("%d idle connections: %w", n, err)
		}
		c.Series[0].Points = append(c.Series[0].Points, pt)
	}
	return c, nil
}

// idlePoint measures one point on two fresh bare brokers.
func idlePoint(ctx context.Context, env curveEnv, up *upstream, p *pki, n, pairs int, slice time.Duration) (Point, error) {
	var holder, other *broker
	dir := filepath.Join(env.dir, fmt.Sprint(n))
	err := withLimits(idleLimits, func() (err error) {
		if holder, err = startBroker(env.bin, filepath.Join(dir, "holder"), up, p, false); err != nil {
			return err
		}
		other, err = startBroker(env.bin, filepath.Join(dir, "other"), up, p, false)
		return err
	})
	if holder != nil {
		defer holder.stop()
	}
	if other != nil {
		defer other.stop()
	}
	if err != nil {
		return Point{}, err
	}
	u := up.url(hostIntercept, chatPath)
	active := &path{name: "holding", url: u, via: holder.intercepting(), proc: holder.process}
	quiet := &path{name: "holding none", url: u, via: other.intercepting(), proc: other.process}
	for _, pa := range []*path{active, quiet} {
		pa.client = pa.withConns(p, 32)
		if err := pa.check(ctx); err != nil {
			return Point{}, fmt.Errorf("%s: %w", pa.name, err)
		}
	}
	// Both brokers carry the same load first, so that what grows on the holder afterwards is
	// the idle connections', not its pools' and heap's first growth.
	for _, pa := range []*path{active, quiet} {
		pa.closedLoop(ctx, 32, slice)
	}
	var conns []net.Conn
	var mu sync.Mutex
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	open := func(k int) error {
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for w := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < k; i += 16 {
					c, err := idleOpen(holder, up)
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					conns = append(conns, c)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		close(errs)
		return <-errs
	}
	if err := open(20); err != nil { // warm-up: pools that later connections reuse
		return Point{}, err
	}
	time.Sleep(500 * time.Millisecond)
	rss0, fds0 := holder.rss(), openFiles(holder.cmd.Process.Pid)
	t := time.Now()
	if err := open(n); err != nil {
		return Point{}, fmt.Errorf("after %d connections: %w", len(conns)-20, err)
	}
	opened := time.Since(t)
	time.Sleep(time.Second) // every tunnel parks after 100 ms
	rss1, fds1 := holder.rss(), openFiles(holder.cmd.Process.Pid)
	pt := Point{X: float64(n), Extra: map[string]float64{
		"fds_per_conn":           round3(float64(fds1-fds0) / float64(n)),
		"rss_mib":                round3(float64(rss1) / (1 << 20)),
		"info_opened_per_s":      round3(float64(n) / opened.Seconds()),
		"info_broker_open_files": float64(fds1),
	}}
	pt.Y = round3(float64(rss1-rss0) / float64(n) / 1024)
	var with, without, ratios []float64
	for i := range pairs {
		a, b := adjacentSlices(ctx, i, active, quiet, 32, slice)
		with, without = append(with, a.rps), append(without, b.rps)
		if b.rps > 0 {
			ratios = append(ratios, a.rps/b.rps)
		}
	}
	pt.Extra["throughput_c32"] = round3(median(with))
	pt.Extra["baseline_throughput_c32"] = round3(median(without))
	pt.Extra["throughput_c32_vs_none"] = round3(median(ratios))
	if len(ratios) > 0 {
		lo, hi := ratios[0], ratios[0]
		for _, r := range ratios {
			lo, hi = min(lo, r), max(hi, r)
		}
		pt.Extra["throughput_c32_vs_none_min"], pt.Extra["throughput_c32_vs_none_max"] = round3(lo), round3(hi)
	}
	// Still held? A connection the broker closed meanwhile would make the figures a lie.
	if still := openFiles(holder.cmd.Process.Pid); still < fds0+n {
		return pt, fmt.Errorf("the broker holds %d descriptors after the throughput slices, fewer than the %d connections held", still-fds0, n)
	}
	fmt.Fprintf(stderr, "  %d idle: %.1f KiB and %.2f descriptors each (RSS %.0f MiB), opened at %.0f/s; 32 active: %.0f req/s beside %.0f without (%.2fx)\n",
		n, pt.Y, pt.Extra["fds_per_conn"], pt.Extra["rss_mib"], pt.Extra["info_opened_per_s"], pt.Extra["throughput_c32"], pt.Extra["baseline_throughput_c32"], pt.Extra["throughput_c32_vs_none"])
	return pt, nil
}

// idleOpen opens an intercepted tunnel through b, makes one request on it and returns it.
func idleOpen(b *broker, up *upstream) (net.Conn, error) {
	c, err := net.Dial("tcp", b.proxyAddr)
	if err != nil {
		return nil, err
	}
	target := fmt.Sprintf("%s:%d", hostIntercept, up.port)
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", target, target, basicAuth(agentID, b.token))
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	if err != nil {
		c.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		c.Close()
		return nil, fmt.Errorf("CONNECT: %s", resp.Status)
	}
	tc := tls.Client(c, &tls.Config{RootCAs: b.caPool, ServerName: hostIntercept})
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", target)
	resp, err = http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		tc.Close()
		return nil, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		tc.Close()
		return nil, fmt.Errorf("request: %s", resp.Status)
	}
	return tc, nil
}
