package integration

import (
	"bufio"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"testing"
)

// metric reads one unlabelled gauge from the broker's /metrics.
func (b *brokerProc) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + b.adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindSubmatch(text)
	if m == nil {
		t.Fatalf("no metric %s", name)
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// TestSoakMixedTrafficLeavesNoLeaks runs a bounded mix of allowed, denied and reset requests,
// then checks that goroutines, open files and memory come back near their baseline.
func TestSoakMixedTrafficLeavesNoLeaks(t *testing.T) {
	reset := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(200)
		w.Write([]byte("partial"))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the upstream drops the connection mid-response
	})
	e := newEnv(t, envOpts{handler: reset})
	client := e.broker.client(t, agentID, e.token)
	client.Transport.(*http.Transport).DisableKeepAlives = true
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte(agentID+":"+e.token))

	round := func() {
		var wg sync.WaitGroup
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := 0; i < 25; i++ {
					switch (w + i) % 5 {
					case 0: // allowed, credential injected and scrubbed
						if resp, err := client.Get(e.url("/api/echo")); err == nil {
							io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
						}
					case 1: // denied by policy
						if resp, err := client.Get(e.url("/admin/x")); err == nil {
							io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
						}
					case 2: // upstream resets the connection
						if resp, err := client.Get(e.url("/api/custom/reset")); err == nil {
							resp.Body.Close()
						}
					case 3: // agent opens a tunnel and vanishes before TLS
						if c, err := net.Dial("tcp", e.broker.proxyAddr); err == nil {
							fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: %s\r\n\r\n", e.up.Listener.Addr(), e.up.Listener.Addr(), auth)
							http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
							c.(*net.TCPConn).SetLinger(0)
							c.Close()
						}
					case 4: // denied CONNECT, half a request, then a half-close
						if c, err := net.Dial("tcp", e.broker.proxyAddr); err == nil {
							fmt.Fprintf(c, "CONNECT 10.9.9.9:443 HTTP/1.1\r\nHost: 10.9.9.9:443\r\nProxy-Authorization: %s\r\n\r\nGET / HT", auth)
							c.(*net.TCPConn).CloseWrite()
							io.Copy(io.Discard, c)
							c.Close()
						}
					}
				}
			}(w)
		}
		wg.Wait()
	}
	round() // warm-up: pools, caches and lazily started goroutines
	baseG := e.broker.metric(t, "go_goroutines")
	baseFD := e.broker.metric(t, "process_open_fds")
	baseHeap := e.broker.metric(t, "go_memstats_heap_inuse_bytes")
	for i := 0; i < 4; i++ {
		round()
	}
	// Connections the broker is still closing wind down as their goroutines see EOF; read the
	// gauges a bounded number of times until they are back near the baseline.
	var g, fd float64
	for i := 0; i < 200; i++ {
		g, fd = e.broker.metric(t, "go_goroutines"), e.broker.metric(t, "process_open_fds")
		if g <= baseG+10 && fd <= baseFD+10 {
			break
		}
	}
	if g > baseG+10 || fd > baseFD+10 {
		t.Fatalf("after 1000 mixed requests: goroutines %v (baseline %v), open fds %v (baseline %v)", g, baseG, fd, baseFD)
	}
	if heap := e.broker.metric(t, "go_memstats_heap_inuse_bytes"); heap > baseHeap+32<<20 {
		t.Fatalf("heap in use grew from %v to %v", baseHeap, heap)
	}
	// Denied CONNECTs never reached certificate generation: only the upstream's host is cached.
	if n := e.broker.metric(t, "capbroker_cert_cache_entries"); n != 1 {
		t.Fatalf("certificate cache holds %v entries, want 1", n)
	}
	t.Logf("goroutines %v -> %v, fds %v -> %v", baseG, g, baseFD, fd)
}
