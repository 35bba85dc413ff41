package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

// The hosts curve: 1 to 11,000 distinct hosts reached through one broker, past the bound of
// its certificate cache (10,000 leaves, least recently used out first). Each host is an
// address of its own on loopback, 127.1.x.y, where the bench's upstream listens. For each
// number of hosts, a fresh broker is sent one request on a new connection to every host in
// turn (the first: the broker issues the host's certificate), then to every host again in the
// same order (the cache hit path, or past the bound, a miss every time), and every tenth
// request goes to one host it has already seen, the baseline: the same request with the
// certificate cached, in the same moments. The upstream closes every connection after its
// answer, so that every request dials it anew whatever the host and the broker's pool of
// idle upstream connections holds nothing: what differs is the certificate.
func init() { registerCurve("hosts", curveHosts) }

const hostsCacheBound = 10000 // broker/broker.go certCacheSize

// hostAddr is the i-th host's loopback address, from 127.1.0.1, 250 to a block.
func hostAddr(i int) string {
	return fmt.Sprintf("127.%d.%d.%d", 1+i/(250*250), i/250%250, i%250+1)
}

// manyHostsUpstream serves smallBody on n loopback addresses, each with a certificate naming
// it (one leaf per block of 250 addresses), without keep-alive.
type manyHostsUpstream struct {
	port   int
	caFile string
	srv    *http.Server
}

func startManyHosts(dir string, n int) (*manyHostsUpstream, error) {
	ca, caKey, err := newCA("brokerbench hosts CA")
	if err != nil {
		return nil, err
	}
	u := &manyHostsUpstream{caFile: filepath.Join(dir, "hosts-ca.pem")}
	if err := os.WriteFile(u.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}), 0o644); err != nil {
		return nil, err
	}
	leaves := map[string]*tls.Certificate{} // by address
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Now()
	for block := 0; block*250 < n; block++ {
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(block) + 2), Subject: pkix.Name{CommonName: hostAddr(block * 250)},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
		for i := block * 250; i < min(n, (block+1)*250); i++ {
			tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(hostAddr(i)))
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return nil, err
		}
		leaf := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
		for _, ip := range tmpl.IPAddresses {
			leaves[ip.String()] = leaf
		}
	}
	u.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Length", strconv.Itoa(len(smallBody)))
			_, _ = w.Write(smallBody)
		}),
		TLSConfig: &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if a, ok := h.Conn.LocalAddr().(*net.TCPAddr); ok {
				if c := leaves[a.IP.String()]; c != nil {
					return c, nil
				}
			}
			return nil, errors.New("no certificate for this address")
		}},
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	u.srv.SetKeepAlivesEnabled(false)
	var lns []net.Listener
	for i := range n {
		l, err := net.Listen("tcp", net.JoinHostPort(hostAddr(i), strconv.Itoa(u.port)))
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, fmt.Errorf("upstream on %s: %w", hostAddr(i), err)
		}
		if i == 0 {
			u.port = l.Addr().(*net.TCPAddr).Port
		}
		lns = append(lns, l)
	}
	for _, l := range lns {
		go func() { _ = u.srv.Serve(tls.NewListener(l, u.srv.TLSConfig)) }()
	}
	return u, nil
}

func (u *manyHostsUpstream) url(i int) string {
	return fmt.Sprintf("https://%s:%d%s", hostAddr(i), u.port, chatPath)
}

func curveHosts(ctx context.Context, env curveEnv) (Curve, error) {
	c := Curve{Name: "hosts", Title: "Distinct hosts: a request on a new connection, certificate issued or cached",
		XLabel: "distinct hosts reached", YLabel: "ms per request on a new agent connection (median)", LogX: true}
	curveHeader(&c)
	// With the baseline host, hostsCacheBound-1 hosts fill the cache exactly: every request of
	// the second pass is a hit. 10% more, and every one is a miss.
	sizes := []int{1, 10, 100, 1000, hostsCacheBound - 1, hostsCacheBound + hostsCacheBound/10}
	if env.quick {
		sizes = []int{1, 50}
	}
	const every = 10                                          // one baseline request per this many measured
	up, err := startManyHosts(env.dir, sizes[len(sizes)-1]+1) // and the baseline host
	if err != nil {
		return c, err
	}
	defer up.srv.Close()
	first := Series{Name: "first request to a host (certificate issued)"}
	again := Series{Name: "the same hosts again (cached; past 10,000, issued again)"}
	for _, n := range sizes {
		dir := filepath.Join(env.dir, fmt.Sprintf("hosts-%d", n))
		caLines, err := curveCA(env.bin, dir)
		if err != nil {
			return c, err
		}
		polDir := filepath.Join(dir, "policies")
		if err := mkdirAll(polDir); err != nil {
			return c, err
		}
		if err := writeAllowAll(polDir); err != nil {
			return c, err
		}
		cfg := fmt.Sprintf(`proxy: {listen: "127.0.0.1:0", max_connections_per_agent: 1024}
admin: {listen: "127.0.0.1:0"}
%spolicy: {dir: %q, mode: enforce}
upstream:
  ca_file: %q
  allow_private: ["127.0.0.0/8"]
agents:
  - id: %s
    token_env: BENCH_AGENT_TOKEN
`, caLines, polDir, up.caFile, agentID)
		b, err := startCurveBroker(env.bin, dir, cfg, "BENCH_AGENT_TOKEN=bench-token")
		if err != nil {
			return c, err
		}
		b.token = "bench-token"
		rss0, heap0 := settledRSS(b.process), b.heapMiB(ctx)
		// The baseline host is one beyond the n measured; seen once before the passes.
		baseHost := n
		base := &path{name: "cached", url: up.url(baseHost), via: b.intercepting()}
		timeOne := func(pa *path) (time.Duration, error) {
			pa.client = pa.via.client(1)
			defer pa.client.CloseIdleConnections()
			t := time.Now()
			err := pa.do(ctx)
			return time.Since(t), err
		}
		if _, err := timeOne(base); err != nil {
			b.stop()
			return c, fmt.Errorf("hosts: baseline host: %w", err)
		}
		pass := func() (pt, bl []time.Duration, err error) {
			for i := range n {
				d, err := timeOne(&path{name: "host", url: up.url(i), via: b.intercepting()})
				if err != nil {
					return nil, nil, fmt.Errorf("host %s: %w", hostAddr(i), err)
				}
				pt = append(pt, d)
				if i%every == 0 {
					d, err := timeOne(base)
					if err != nil {
						return nil, nil, fmt.Errorf("baseline host: %w", err)
					}
					bl = append(bl, d)
				}
			}
			return pt, bl, nil
		}
		start := time.Now()
		p1, b1, err := pass()
		if err != nil {
			b.stop()
			return c, err
		}
		took1 := time.Since(start)
		m := b.metrics(ctx)
		entries := m["capbroker_cert_cache_entries"]
		rss1, heap1, live1 := settledRSS(b.process), b.heapMiB(ctx), b.liveHeapMiB(ctx)
		p2, b2, err := pass()
		if err != nil {
			b.stop()
			return c, err
		}
		ms := func(d []time.Duration) float64 { return round3(medianMS(d)) }
		first.Points = append(first.Points, Point{X: float64(n), Y: ms(p1), Baseline: ms(b1), Extra: map[string]float64{
			"p90_ms": round3(quantileMS(p1, 0.9)), "rss_mib": round3(rss1), "rss_mib_before": round3(rss0),
			"heap_mib": round3(heap1), "heap_mib_before": round3(heap0), "live_heap_mib_est": round3(live1),
			"cache_entries": entries, "seconds": round3(took1.Seconds()),
		}})
		again.Points = append(again.Points, Point{X: float64(n), Y: ms(p2), Baseline: ms(b2), Extra: map[string]float64{
			"p90_ms": round3(quantileMS(p2, 0.9)), "cache_entries": b.metrics(ctx)["capbroker_cert_cache_entries"],
			"rss_mib": round3(settledRSS(b.process)), "live_heap_mib_est": round3(b.liveHeapMiB(ctx)),
		}})
		fmt.Fprintf(stderr, "  hosts=%-5d first %.2f ms (baseline %.2f), again %.2f ms (baseline %.2f); cache %0.f; RSS %.1f -> %.1f MiB, heap %.1f -> %.1f MiB\n",
			n, ms(p1), ms(b1), ms(p2), ms(b2), entries, rss0, rss1, heap0, heap1)
		b.stop()
	}
	c.Series = []Series{first, again}
	c.Note = "A host's first request costs one certificate issue (an ECDSA P-256 key and signature), " +
		"constant per host; the cache is a map with a least-recently-used list, constant per lookup. " +
		"Its memory grows linearly with the hosts seen, up to 10,000 leaves (certCacheSize), and stops " +
		"there. Past the bound, hosts visited in a cycle longer than the cache miss every time " +
		"(least recently used goes first): each request issues its certificate again, the " +
		"first-request cost, with memory flat."
	return c, nil
}

// quantileMS is the q-quantile of d in milliseconds (d is sorted in place).
func quantileMS(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return float64(d[int(q*float64(len(d)-1))].Microseconds()) / 1000
}
