package integration

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/xml"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The HTTP/2 conformance test runs h2spec (github.com/summerwind/h2spec, built from its Go
// module in integration/testdata/h2spec, a module of its own) against the HTTP/2 server an
// agent reaches inside an intercepted tunnel, the way an agent reaches it: through CONNECT.
//
// h2spec dials a host and port and sends that same host and port as every request's
// :authority, while the broker answers only requests whose host is the CONNECT host. So
// h2spec runs in a network namespace of its own and dials 127.0.0.1:443 there (for port 443
// it sends the host alone, "127.0.0.1"), where a shim listens: for each connection it sends
// CONNECT 127.0.0.1:<upstream port> with the agent's proxy credentials to the broker, reads
// the 200 and relays bytes both ways. h2spec then does its TLS handshake (ALPN h2) with the
// broker's intercepting listener, and each request it sends goes, decided and with a
// credential injected, to a real TLS upstream on loopback.

// h2specAgent is the agent h2spec's connections are tunnelled as.
const h2specAgent = "h2spec-agent"

// h2specPolicy intercepts tunnels to 127.0.0.1 and lets every request in them through with
// the canary credential, so each of h2spec's requests takes the whole pipeline.
const h2specPolicy = `package broker

default decision := {"allow": false, "reason": "not allowed by the h2spec policy"}

decision := {"allow": true, "intercept": true} if {
	input.phase == "connect"
	input.request.host == "127.0.0.1"
}

decision := {"allow": true, "credentials": ["canary"]} if {
	input.phase == "request"
}
`

// h2specKnownFailures are h2spec cases the agent-facing HTTP/2 server may fail, by h2spec's
// ID, each with why: none. The broker's own server (broker/http2srv) passes every case; those
// net/http's server failed (a SETTINGS frame repeating a parameter, and connection-specific
// header fields answered with a 400 rather than RST_STREAM) are gone with it. A case listed
// here that passes fails the test too, so the list never outlives what it describes.
var h2specKnownFailures = map[string]string{}

var h2specBuild toolBuild

// h2specBinary builds h2spec (testdata/h2spec pins its module) once, cached.
func h2specBinary(t *testing.T) string {
	t.Helper()
	return h2specBuild.binary(t, "h2spec", "h2spec", "github.com/summerwind/h2spec/cmd/h2spec", "h2spec", "go.mod", "go.sum")
}

// requireRootNetns skips where a network namespace cannot be made (not root, or no
// iproute2), and fails instead in CI.
func requireRootNetns(t *testing.T) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "needs root to create a network namespace (ip netns add)"
	} else if _, err := exec.LookPath("ip"); err != nil {
		why = "needs iproute2 (ip)"
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") != "" || os.Getenv("CAPBROKER_REQUIRE_VAULT") == "1" {
		t.Fatal(why)
	}
	t.Skip("skipped: " + why)
}

// newH2specNS makes a network namespace with only loopback up, removed when the test ends.
func newH2specNS(t *testing.T) string {
	t.Helper()
	ns := "cbh2spec-" + randHex(4)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	ipCmd(t, "netns", "add", ns)
	ipCmd(t, "-n", ns, "link", "set", "lo", "up")
	return ns
}

// h2specBroker is a broker in front of a TLS upstream, with the agents h2specAgent and
// h2Bystander.
type h2specBroker struct {
	broker *brokerProc
	caPEM  []byte
	up     string            // the upstream's host:port, the CONNECT target
	tokens map[string]string // by agent
	canary string            // the credential the broker injects

	// What the default upstream has answered: all requests, and those without the canary.
	served, uncredentialed atomic.Int64
}

// h2Bystander is an agent that is not the one under test: it must be served throughout.
const h2Bystander = "h2-bystander"

// h2specBody is what the upstream answers by default: a body of some length, as h2spec's
// flow-control cases need one of at least 5 bytes.
var h2specBody = strings.Repeat("h2spec upstream response\n", 40)

// startH2specBroker starts the broker and its upstream, which serves h, or by default
// answers every request with a 200 and h2specBody after reading its body, as h2spec expects
// of the server it tests.
func startH2specBroker(t *testing.T, h http.Handler) *h2specBroker {
	t.Helper()
	h2 := &h2specBroker{tokens: map[string]string{}, canary: "sk-canary-" + randHex(12)}
	if h == nil {
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h2.served.Add(1)
			if r.Header.Get("Authorization") != "Bearer "+h2.canary {
				h2.uncredentialed.Add(1)
			}
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, h2specBody)
		})
	}
	pki := newUpstreamPKI(t)
	up := httptest.NewUnstartedServer(h)
	up.TLS = &tls.Config{Certificates: []tls.Certificate{pki.Leaf}}
	// The broker opens an upstream connection while an agent's handshake runs, and drops it
	// when the tunnel ends first, as many of h2spec's do: not worth a line each.
	up.Config.ErrorLog = log.New(io.Discard, "", 0)
	up.StartTLS()
	t.Cleanup(up.Close)
	h2.up = up.Listener.Addr().String()
	env := []string{"CANARY_SECRET=" + h2.canary}
	for _, agent := range []string{h2specAgent, h2Bystander} {
		h2.tokens[agent] = randHex(16)
		env = append(env, tokenEnv(agent)+"="+h2.tokens[agent])
	}
	h2.broker = startBroker(t, brokerOpts{
		policy: h2specPolicy,
		mode:   "enforce",
		config: canaryConfig(pki.File, []string{h2specAgent, h2Bystander}, ""),
		env:    env,
	})
	var err error
	if h2.caPEM, err = os.ReadFile(h2.broker.caFile); err != nil {
		t.Fatal(err)
	}
	return h2
}

// connect opens a tunnel to the upstream as the agent: CONNECT, the proxy credentials, the
// 200. What the broker sent after the 200, if anything, is left in the returned reader.
func (h *h2specBroker) connect(agent string) (net.Conn, *bufio.Reader, error) {
	c, err := net.Dial("tcp", h.broker.proxyAddr)
	if err != nil {
		return nil, nil, err
	}
	auth := base64.StdEncoding.EncodeToString([]byte(agent + ":" + h.tokens[agent]))
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", h.up, h.up, auth); err != nil {
		c.Close()
		return nil, nil, err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		c.Close()
		return nil, nil, fmt.Errorf("CONNECT %s: %s", h.up, resp.Status)
	}
	return c, br, nil
}

// shim carries every connection accepted on l through its own tunnel to the upstream. A
// tunnel that cannot be opened closes the accepted connection, which h2spec reports.
func (h *h2specBroker) shim(t *testing.T, l net.Listener) {
	t.Helper()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		open = map[net.Conn]bool{}
	)
	track := func(c net.Conn, on bool) {
		mu.Lock()
		defer mu.Unlock()
		if on {
			open[c] = true
		} else {
			delete(open, c)
		}
	}
	// When the test ends, whatever is still open is closed: a server that keeps a
	// connection h2spec has left ends no test.
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			agent, err := l.Accept()
			if err != nil {
				return
			}
			track(agent, true)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer track(agent, false)
				defer agent.Close()
				tun, br, err := h.connect(h2specAgent)
				if err != nil {
					t.Logf("shim: %v", err)
					return
				}
				track(tun, true)
				defer track(tun, false)
				defer tun.Close()
				spliceTunnel(agent, tun, br)
			}()
		}
	}()
}

// spliceTunnel copies bytes both ways between agent and tun (read through br) until both
// directions have ended; each end of input is passed on as a half-close, so either side sees
// the other close.
func spliceTunnel(agent, tun net.Conn, br *bufio.Reader) {
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(tun, agent)
		closeWrite(tun)
		close(done)
	}()
	_, _ = io.Copy(agent, br)
	closeWrite(agent)
	<-done
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}

// h2specReport is the part of h2spec's JUnit report the test reads.
type h2specReport struct {
	Suites []struct {
		Name  string `xml:"name,attr"`
		Cases []struct {
			Package   string  `xml:"package,attr"`
			ClassName string  `xml:"classname,attr"`
			Failure   *string `xml:"failure"`
			Error     *string `xml:"error"`
			Skipped   *string `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// h2specCase is one case's outcome, by h2spec's ID ("http2/5.1/1": section, then the case's
// number in it).
type h2specCase struct {
	id, desc, failure string
	skipped           bool
}

func readH2specReport(t *testing.T, file string) []h2specCase {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("h2spec wrote no report: %v", err)
	}
	var r h2specReport
	if err := xml.Unmarshal(b, &r); err != nil {
		t.Fatalf("h2spec's report: %v", err)
	}
	var cases []h2specCase
	for _, s := range r.Suites {
		for i, c := range s.Cases {
			hc := h2specCase{id: c.Package + "/" + strconv.Itoa(i+1), desc: c.ClassName, skipped: c.Skipped != nil}
			switch {
			case c.Failure != nil:
				hc.failure = *c.Failure
			case c.Error != nil:
				hc.failure = "error: " + *c.Error
			}
			cases = append(cases, hc)
		}
	}
	return cases
}

// TestH2Spec runs h2spec's whole suite (generic, http2 and hpack sections, strict cases
// included: -S) against the agent-facing HTTP/2 server, through CONNECT, and fails listing
// every case that failed by its ID, but for the documented known failures
// (h2specKnownFailures).
func TestH2Spec(t *testing.T) {
	bin := h2specBinary(t)
	requireRootNetns(t)
	h := startH2specBroker(t, nil)
	ns := newH2specNS(t)
	var l net.Listener
	inNetns(t, ns, func() (err error) {
		l, err = net.Listen("tcp", "127.0.0.1:443")
		return err
	})
	h.shim(t, l)

	report := filepath.Join(t.TempDir(), "h2spec.xml")
	// -o is each case's timeout, in seconds: a case that waits for the server to do nothing
	// (or for a frame that does not come) takes that long. net/http closes a connection a
	// second after its GOAWAY (to let the client read it), so h2spec's default of 2 is the
	// shortest that sees those closes.
	cmd := exec.Command("ip", "netns", "exec", ns, bin, "-h", "127.0.0.1", "-p", "443", "-t", "-k", "-S", "-o", "2", "-j", report)
	out, err := cmd.CombinedOutput()
	cases := readH2specReport(t, report)
	if len(cases) < 140 {
		t.Fatalf("h2spec ran %d cases, want its whole suite (%v):\n%s", len(cases), err, out)
	}
	var failed, stale []string
	for _, c := range cases {
		_, known := h2specKnownFailures[c.id]
		switch {
		case c.skipped:
			t.Errorf("%s %s: skipped", c.id, c.desc)
		case c.failure != "" && !known:
			failed = append(failed, fmt.Sprintf("%s %s\n%s", c.id, c.desc, indent(c.failure)))
		case c.failure == "" && known:
			stale = append(stale, c.id)
		}
	}
	for id := range h2specKnownFailures {
		if !slices.ContainsFunc(cases, func(c h2specCase) bool { return c.id == id }) {
			stale = append(stale, id)
		}
	}
	sort.Strings(stale)
	if len(failed) > 0 {
		t.Errorf("%d of %d h2spec cases failed:\n%s", len(failed), len(cases), strings.Join(failed, "\n"))
	}
	if len(stale) > 0 {
		t.Errorf("listed as known failures but passed (remove them from h2specKnownFailures): %s", strings.Join(stale, ", "))
	}
	// h2spec's requests took the whole pipeline: decided for the CONNECT host, the credential
	// injected, answered by the upstream (many of them are cancelled by h2spec's ending the
	// connection before the answer).
	if n := h.served.Load(); n < 30 {
		t.Errorf("the upstream answered %d of h2spec's requests, want at least 30 (of over a hundred)", n)
	}
	if n := h.uncredentialed.Load(); n > 0 {
		t.Errorf("%d of h2spec's requests reached the upstream without the injected credential", n)
	}
	for _, ev := range h.broker.audit(t) {
		if ev["decision"] == "deny" && ev["status"] == float64(http.StatusForbidden) {
			t.Errorf("a request of h2spec's was denied: %v", ev["reason"])
		}
	}
	t.Logf("h2spec: %d cases, %d known failures of net/http's server; the upstream answered %d requests; its output:\n%s",
		len(cases), len(h2specKnownFailures), h.served.Load(), out)
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n    ")
}

// h2Tunnel opens a tunnel as agent and does a TLS handshake in it that negotiates h2,
// trusting the broker's CA, as an HTTP/2 client of the agent's would.
func (h *h2specBroker) h2Tunnel(t *testing.T, agent string) *tls.Conn {
	t.Helper()
	raw, br, err := h.connect(agent)
	if err != nil {
		t.Fatal(err)
	}
	if br.Buffered() > 0 {
		t.Fatalf("the broker sent %d bytes after its 200, before the agent's ClientHello", br.Buffered())
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(h.caPEM)
	host, _, _ := net.SplitHostPort(h.up)
	c := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: host, NextProtos: []string{"h2"}})
	if err := c.Handshake(); err != nil {
		raw.Close()
		t.Fatal(err)
	}
	if p := c.ConnectionState().NegotiatedProtocol; p != "h2" {
		c.Close()
		t.Fatalf("ALPN negotiated %q, want h2", p)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// servesBystander checks that another agent, on a tunnel of its own, gets its GET answered
// over HTTP/2 (net/http's client).
func (h *h2specBroker) servesBystander(t *testing.T) {
	t.Helper()
	cc, err := (&http2.Transport{}).NewClientConn(h.h2Tunnel(t, h2Bystander))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "https://"+h.up+"/bystander", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cc.RoundTrip(req)
	if err != nil {
		t.Fatalf("the bystander's request: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || string(body) != h2specBody {
		t.Fatalf("the bystander's request: %s, %d bytes, %v", resp.Status, len(body), err)
	}
}

// brokerRSS is the broker process's resident memory, in bytes.
func brokerRSS(t *testing.T, b *brokerProc) int {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", b.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			if err != nil {
				t.Fatalf("VmRSS: %q", v)
			}
			return kib << 10
		}
	}
	t.Fatal("no VmRSS in the broker's /proc status")
	return 0
}

// rawH2 is an HTTP/2 client connection written frame by frame, as a hostile agent would.
type rawH2 struct {
	conn *tls.Conn
	bw   *bufio.Writer
	fr   *http2.Framer
	hbuf bytes.Buffer
	enc  *hpack.Encoder

	// Set by the frame reader (read); read after done is closed.
	done      chan struct{}
	settings  chan uint32 // the server's SETTINGS_MAX_CONCURRENT_STREAMS, once
	pingAck   chan struct{}
	goAway    string        // the server's GOAWAY, if it sent one: its error code and last stream
	goneAway  chan struct{} // closed when the server sends GOAWAY
	readErr   error
	responses int // HEADERS frames the server sent
	resets    int // RST_STREAM frames the server sent
}

// startRawH2 sends the client preface and an empty SETTINGS frame on c and reads the
// server's frames from then on.
func startRawH2(t *testing.T, c *tls.Conn) *rawH2 {
	t.Helper()
	r := &rawH2{conn: c, bw: bufio.NewWriterSize(c, 64<<10), done: make(chan struct{}),
		settings: make(chan uint32, 1), pingAck: make(chan struct{}, 1), goneAway: make(chan struct{})}
	r.fr = http2.NewFramer(r.bw, c)
	r.enc = hpack.NewEncoder(&r.hbuf)
	// A server that stops reading fails the test rather than hangs it.
	_ = c.SetWriteDeadline(time.Now().Add(waitTimeout))
	if _, err := io.WriteString(r.bw, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := r.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	if err := r.bw.Flush(); err != nil {
		t.Fatal(err)
	}
	go r.read()
	return r
}

func (r *rawH2) read() {
	defer close(r.done)
	sentSettings := false
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			r.readErr = err
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() && !sentSettings {
				sentSettings = true
				v, ok := f.Value(http2.SettingMaxConcurrentStreams)
				if !ok {
					v = 1<<32 - 1 // no limit announced
				}
				r.settings <- v
			}
		case *http2.PingFrame:
			if f.IsAck() {
				r.pingAck <- struct{}{}
			}
		case *http2.HeadersFrame:
			r.responses++
		case *http2.RSTStreamFrame:
			r.resets++
		case *http2.GoAwayFrame:
			if r.goAway == "" {
				close(r.goneAway)
			}
			r.goAway = fmt.Sprintf("%v (last stream %d)", f.ErrCode, f.LastStreamID)
		}
	}
}

// headerBlock encodes a GET of path to the upstream.
func (r *rawH2) headerBlock(h *h2specBroker, path string, extra ...hpack.HeaderField) []byte {
	r.hbuf.Reset()
	for _, f := range append([]hpack.HeaderField{
		{Name: ":method", Value: "GET"}, {Name: ":scheme", Value: "https"},
		{Name: ":authority", Value: h.up}, {Name: ":path", Value: path},
	}, extra...) {
		_ = r.enc.WriteField(f)
	}
	return bytes.Clone(r.hbuf.Bytes())
}

// TestH2HostileAgent: an agent that abuses HTTP/2 framing in ways h2spec does not try
// cannot take the broker down, nor keep it from serving another agent.
func TestH2HostileAgent(t *testing.T) {
	var (
		release        = make(chan struct{})
		mu             sync.Mutex
		inFlight, peak int
		held           int
	)
	t.Cleanup(func() { close(release) })
	var slowUpload func(w http.ResponseWriter, r *http.Request)
	h := startH2specBroker(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow-upload" {
			slowUpload(w, r)
			return
		}
		if r.URL.Path != "/hold" {
			_, _ = io.WriteString(w, h2specBody)
			return
		}
		// /hold is a slow upstream: each request is held until the broker gives up on it.
		mu.Lock()
		inFlight++
		held++
		peak = max(peak, inFlight)
		mu.Unlock()
		select {
		case <-r.Context().Done():
		case <-release:
		}
		mu.Lock()
		inFlight--
		mu.Unlock()
	}))

	// Rapid reset (CVE-2023-44487): streams opened and cancelled at once, many times over
	// the concurrency limit. The broker may run at most the streams it announced at once,
	// however quickly they are reset.
	t.Run("rapid reset", func(t *testing.T) {
		const streams = 5000
		r := startRawH2(t, h.h2Tunnel(t, h2specAgent))
		var limit uint32
		select {
		case limit = <-r.settings:
		case <-r.done:
			t.Fatalf("no SETTINGS from the broker: %v", r.readErr)
		}
		if limit == 1<<32-1 {
			t.Errorf("the broker announced no SETTINGS_MAX_CONCURRENT_STREAMS: an agent's streams on one connection are unbounded")
		}
		var werr error
		for i := range streams {
			id := uint32(2*i + 1)
			if werr = r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.headerBlock(h, "/hold"),
				EndStream: true, EndHeaders: true}); werr != nil {
				break
			}
			if werr = r.fr.WriteRSTStream(id, http2.ErrCodeCancel); werr != nil {
				break
			}
			if i%100 == 99 {
				if werr = r.bw.Flush(); werr != nil {
					break
				}
			}
		}
		if werr == nil {
			werr = r.fr.WritePing(false, [8]byte{'h', '2', 's', 'p', 'e', 'c'})
		}
		if werr == nil {
			werr = r.bw.Flush()
		}
		// The server has read everything before the PING once it answers it; or it ended
		// the connection.
		select {
		case <-r.pingAck:
		case <-r.done:
		case <-time.After(waitTimeout):
			t.Fatal("the broker neither answered the PING after the flood nor ended the connection")
		}
		r.conn.Close()
		<-r.done
		mu.Lock()
		gotPeak, gotHeld := peak, held
		mu.Unlock()
		t.Logf("%d streams opened and reset (write error: %v); the broker answered %d, reset %d, GOAWAY %q; upstream saw %d requests, at most %d at once (limit %d)",
			streams, werr, r.responses, r.resets, r.goAway, gotHeld, gotPeak, limit)
		if uint32(gotPeak) > limit {
			t.Errorf("the upstream had %d of the agent's requests in flight at once; the broker announced at most %d streams", gotPeak, limit)
		}
		h.servesBystander(t)
	})

	// CONTINUATION flood (CVE-2024-27316, CVE-2023-45288): a header block that never ends,
	// each CONTINUATION frame adding another header field. The broker must end the
	// connection once the block is past its header size limit, not buffer (or decode) it
	// for as long as the agent sends.
	t.Run("continuation flood", func(t *testing.T) {
		const budget = 64 << 20 // bytes of CONTINUATION the agent is prepared to send
		r := startRawH2(t, h.h2Tunnel(t, h2specAgent))
		field := hpack.HeaderField{Name: "x-flood", Value: strings.Repeat("f", 4000)}
		werr := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: r.headerBlock(h, "/flood", field)})
		sent := 0
		for werr == nil && sent < budget {
			// A literal, never indexed: each frame adds 4,000 bytes to the header list.
			r.hbuf.Reset()
			_ = r.enc.WriteField(hpack.HeaderField{Name: field.Name, Value: field.Value, Sensitive: true})
			frag := bytes.Clone(r.hbuf.Bytes())
			if werr = r.fr.WriteContinuation(1, false, frag); werr == nil {
				sent += len(frag)
				if sent%(256<<10) < len(frag) {
					werr = r.bw.Flush()
				}
			}
		}
		if werr == nil {
			werr = r.bw.Flush()
		}
		select {
		case <-r.done:
		case <-time.After(waitTimeout):
			t.Fatalf("the broker took %d bytes of one header block and kept the connection open", sent)
		}
		t.Logf("sent %d bytes of CONTINUATION before the broker ended the connection (write error: %v; GOAWAY %q; read: %v)",
			sent, werr, r.goAway, r.readErr)
		if sent >= budget {
			t.Errorf("the broker took all %d bytes of one header block before ending the connection", sent)
		}
		if r.responses > 0 {
			t.Errorf("the broker answered a request whose header block never ended")
		}
		h.servesBystander(t)
	})

	// PING flood without reading (CVE-2019-9512; SETTINGS likewise, CVE-2019-9515): each
	// PING needs an answer, which cannot be written while the agent reads nothing. The broker
	// must not queue the answers without bound: it ends the connection, or it stops reading
	// until it can write (then the agent's writes stall: a write that has not gone through
	// in stallAfter counts as stalled; on a slow machine a slow read may pass for a stall,
	// never the reverse).
	t.Run("ping flood", func(t *testing.T) {
		const budget = 2_000_000 // PINGs the agent is prepared to send (34 MB)
		const stallAfter = 3 * time.Second
		c := h.h2Tunnel(t, h2specAgent)
		bw := bufio.NewWriterSize(c, 64<<10)
		fr := http2.NewFramer(bw, c)
		_, werr := io.WriteString(bw, http2.ClientPreface)
		if werr == nil {
			werr = fr.WriteSettings()
		}
		flush := func() error {
			_ = c.SetWriteDeadline(time.Now().Add(stallAfter))
			return bw.Flush()
		}
		sent := 0
		for ; werr == nil && sent < budget; sent++ {
			if werr = fr.WritePing(false, [8]byte{byte(sent), byte(sent >> 8), byte(sent >> 16)}); werr == nil && sent%1000 == 999 {
				werr = flush()
			}
		}
		if werr == nil {
			werr = flush()
		}
		t.Logf("sent %d PINGs, reading none, before the write failed or stalled: %v", sent, werr)
		if werr == nil {
			t.Errorf("the broker took %d PINGs from an agent that read none of the answers, and kept the connection open", sent)
		}
		c.Close()
		h.servesBystander(t)
	})

	// Large frames: a server's frame buffer grows to the largest frame it reads and keeps
	// that size while the connection lasts. Frames of 1 MiB on many connections of one agent
	// must not hold a MiB of the broker's memory each: the broker refuses frames over the
	// protocol's default 16 KiB.
	// An upload to an upstream slower than the agent (or one that reads slowly on purpose):
	// the agent keeps the stream's window full, so the broker reads the body a frame or more
	// behind what it has received for as long as the upload lasts. What it holds of the body
	// must stay about one window, not grow with the upload (it held the whole body before).
	t.Run("upload to a slow upstream", func(t *testing.T) {
		const size, at = 96 << 20, 64 << 20
		before := brokerRSS(t, h.broker)
		reached, measured := make(chan struct{}), make(chan struct{})
		slowUpload = func(w http.ResponseWriter, r *http.Request) {
			// 64 KiB a millisecond: a quarter or less of what the agent sends on this machine.
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			p := make([]byte, 64<<10)
			total := 0
			for {
				<-tick.C
				n, err := io.ReadFull(r.Body, p)
				if total < at && total+n >= at {
					reached <- struct{}{} // the test reads the broker's memory now
					<-measured
				}
				total += n
				if err != nil {
					break
				}
			}
			_, _ = fmt.Fprint(w, total)
		}
		cc, err := (&http2.Transport{}).NewClientConn(h.h2Tunnel(t, h2specAgent))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "https://"+h.up+"/slow-upload", io.LimitReader(zeroReader{}, size))
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			status int
			body   string
			err    error
		}
		done := make(chan result, 1)
		go func() {
			resp, err := cc.RoundTrip(req)
			if err != nil {
				done <- result{err: err}
				return
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			done <- result{resp.StatusCode, string(body), err}
		}()
		var grew int
		select {
		case <-reached:
			func() {
				defer close(measured)
				grew = brokerRSS(t, h.broker) - before
			}()
		case r := <-done:
			t.Fatalf("the upload ended before the upstream had read %d MiB: %d %q %v", at>>20, r.status, r.body, r.err)
		}
		r := <-done
		if r.err != nil || r.status != http.StatusOK || r.body != strconv.Itoa(size) {
			t.Fatalf("the upload: %d, the upstream read %q bytes of %d, %v", r.status, r.body, size, r.err)
		}
		t.Logf("%d MiB into a %d MiB upload to a slow upstream, the broker's RSS had grown by %d MiB", at>>20, size>>20, grew>>20)
		if grew > 24<<20 {
			t.Errorf("the broker's memory grew by %d MiB while the upstream read %d MiB of an upload slowly", grew>>20, at>>20)
		}
		h.servesBystander(t)
	})

	t.Run("large frames", func(t *testing.T) {
		const conns, size = 128, 1<<20 - 1
		before := brokerRSS(t, h.broker)
		var accepted int
		frame := make([]byte, 9+size)
		frame[0], frame[1], frame[2], frame[3] = size>>16, size>>8&0xff, size&0xff, 0xfa // a frame of an unknown type, which a server must ignore
		for range conns {
			r := startRawH2(t, h.h2Tunnel(t, h2specAgent))
			_, werr := r.bw.Write(frame)
			if werr == nil {
				werr = r.fr.WritePing(false, [8]byte{'b', 'i', 'g'})
			}
			if werr == nil {
				werr = r.bw.Flush()
			}
			// Once the PING is answered the server has read the whole frame; or it is ending
			// the connection.
			select {
			case <-r.pingAck:
				accepted++
			case <-r.goneAway:
			case <-r.done:
			case <-time.After(waitTimeout):
				t.Fatalf("the broker neither answered the PING after a 1 MiB frame nor ended the connection (write: %v)", werr)
			}
		}
		after := brokerRSS(t, h.broker)
		t.Logf("%d connections each sent a frame of 1 MiB: %d were kept; the broker's RSS went from %d to %d MiB",
			conns, accepted, before>>20, after>>20)
		if grown := after - before; grown > conns<<20/4 {
			t.Errorf("the broker's memory grew by %d MiB for %d connections that each sent one 1 MiB frame", grown>>20, conns)
		}
		h.servesBystander(t)
	})
}

// zeroReader is an endless body of zeros.
type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
