package integration

// Attacks from the security review: each is driven as a hostile agent would, and each test
// checks what the agent got, what the upstream saw and what the audit log says.

import (
	"bufio"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// dialFrom opens a TCP connection to the broker's proxy listener from a loopback source
// address of the test's choosing (127.0.0.2 is another machine on the sandbox's network).
func dialFrom(t *testing.T, b *brokerProc, src string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: waitTimeout}
	c, err := d.Dial("tcp", b.proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(waitTimeout))
	return c
}

func basicAuth(agent, token string) string {
	return base64.StdEncoding.EncodeToString([]byte(agent + ":" + token))
}

// closedByPeer reports whether the broker closed c: a read ends at EOF or a reset, with no byte.
func closedByPeer(c net.Conn, br *bufio.Reader) bool {
	_ = c.SetReadDeadline(time.Now().Add(waitTimeout))
	_, err := br.ReadByte()
	return err != nil && !isTimeoutErr(err)
}

func isTimeoutErr(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// twoAgents is a broker with two token agents, coder-1 and coder-2, in front of e's upstream.
func twoAgents(t *testing.T, e *env, proxy, policy string) (*brokerProc, string) {
	t.Helper()
	token2 := randHex(16)
	b := startBroker(t, brokerOpts{
		policy: policy,
		mode:   "enforce",
		proxy:  proxy,
		config: canaryConfig(e.pki.File, []string{"coder-1", "coder-2"}, ""),
		env:    []string{tokenEnv("coder-1") + "=" + e.token, tokenEnv("coder-2") + "=" + token2, "CANARY_SECRET=" + e.canary},
	})
	return b, token2
}

// TestAttackOneAgentLocksOthersOut: agent A holds every connection it may, denied plain
// requests, idle keep-alive connections and tunnels alike; agent B is served all the while.
func TestAttackOneAgentLocksOthersOut(t *testing.T) {
	e := newEnv(t, envOpts{})
	b, token2 := twoAgents(t, e, "max_connections: 20, max_connections_per_agent: 4", testPolicy)
	authA := basicAuth("coder-1", e.token)
	target := e.up.Listener.Addr().String()

	// 20 connections, a denied plain-HTTP request on each, none closed by A. Each is answered
	// (403 for a denial, 429 beyond A's four) and closed by the broker at once.
	statuses := map[int]int{}
	for range 20 {
		c := dialFrom(t, b, "127.0.0.1")
		fmt.Fprintf(c, "GET http://%s/admin HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", target, target, authA)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("A's request: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		statuses[resp.StatusCode]++
		if !closedByPeer(c, br) {
			t.Fatalf("the broker kept A's connection open after a %d", resp.StatusCode)
		}
	}
	if statuses[403] == 0 || statuses[403]+statuses[429] != 20 {
		t.Fatalf("A's statuses: %v", statuses)
	}

	// A now holds four idle keep-alive connections (allowed plain requests) and tries a fifth.
	plain := plainUpstream(t)
	for i := range 5 {
		c := dialFrom(t, b, "127.0.0.1")
		fmt.Fprintf(c, "GET http://%s/open/x HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", plain, plain, authA)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("A's keep-alive request %d: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		want := http.StatusOK
		if i == 4 {
			want = http.StatusTooManyRequests
		}
		if resp.StatusCode != want {
			t.Fatalf("A's keep-alive request %d: %d, want %d", i, resp.StatusCode, want)
		}
	}

	// B, from its own address, is served at once.
	clientB := b.client(t, "coder-2", token2)
	resp, err := clientB.Get(e.url("/open/b"))
	if err != nil {
		t.Fatalf("B was locked out: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("B got %d", resp.StatusCode)
	}

	// A's over-cap connections were audited as such, with A's name.
	b.waitAuditWhere(t, 1, "A's refusal over its cap", func(ev auditEvent) bool {
		return ev["agent"] == "coder-1" && ev["status"] == float64(429)
	})
}

// TestAttackSilentConnectionsFromOneAddress: connections that never send a request cannot
// keep out the next client from their own address, nor anyone else: each new connection
// takes the place of the address's oldest silent one, which the broker closes.
func TestAttackSilentConnectionsFromOneAddress(t *testing.T) {
	e := newEnv(t, envOpts{proxy: "max_connections: 20, max_connections_per_agent: 4"})
	var silent []net.Conn
	for range 30 { // more than the broker holds in total, from the agents' own address
		silent = append(silent, dialFrom(t, e.broker, "127.0.0.1"))
	}
	// The broker accepts in order: by the time it has taken the last, it has closed the first.
	first := bufio.NewReader(silent[0])
	if !closedByPeer(silent[0], first) {
		t.Fatal("the oldest silent connection was kept")
	}
	out, err := e.curl("-o", "/dev/null", "-w", "%{http_code}", e.url("/open/x"))
	if err != nil || out != "200" {
		t.Fatalf("the agent was not served while silent connections came from its address: %q %v", out, err)
	}
	for _, s := range silent {
		s.Close()
	}
}

// TestAttackUpgradeKeepsFramingGuard: an Upgrade the upstream did not switch leaves the
// connection an HTTP/1.1 connection, checked like any other: ambiguous framing after it is
// refused, on a tunnel and on a plain connection alike.
func TestAttackUpgradeKeepsFramingGuard(t *testing.T) {
	e := newEnv(t, envOpts{})
	upgrade := "GET /open/u HTTP/1.1\r\nHost: %s\r\nUpgrade: foo\r\nConnection: upgrade\r\n%s\r\n"
	smuggles := map[string]string{
		"CL+TE":   "POST /open/s HTTP/1.1\r\nHost: %s\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n%s\r\n0\r\n\r\n",
		"bare LF": "GET /open/s HTTP/1.1\nHost: %s\n%s\n",
	}
	target := e.up.Listener.Addr().String()
	var plainSeen atomic.Int32
	plain := plainUpstreamFunc(t, func(r *http.Request) {
		if r.URL.Path == "/open/s" {
			plainSeen.Add(1)
		}
	})
	for name, smuggle := range smuggles {
		t.Run("tunnel "+name, func(t *testing.T) {
			conn := e.rawTunnel(t, "127.0.0.1")
			resp, _ := exchangeRaw(t, conn, fmt.Sprintf(upgrade, target, ""))
			if resp.StatusCode != 200 {
				t.Fatalf("upgrade request: %d", resp.StatusCode)
			}
			resp, closed := exchangeRaw(t, conn, fmt.Sprintf(smuggle, target, ""))
			if resp.StatusCode != 400 || !closed {
				t.Fatalf("%s after a declined upgrade: %d, closed %v", name, resp.StatusCode, closed)
			}
		})
		t.Run("plain "+name, func(t *testing.T) {
			c := dialFrom(t, e.broker, "127.0.0.1")
			auth := "Proxy-Authorization: Basic " + basicAuth(agentID, e.token) + "\r\n"
			resp, _ := exchangeRaw(t, c, fmt.Sprintf(strings.Replace(upgrade, "/open/u", "http://"+plain+"/open/u", 1), plain, auth))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("upgrade request: %d", resp.StatusCode)
			}
			raw := strings.Replace(smuggle, "/open/s", "http://"+plain+"/open/s", 1)
			sep := "\r\n"
			if name == "bare LF" {
				sep = "\n"
			}
			resp, closed := exchangeRaw(t, c, fmt.Sprintf(raw, plain, strings.TrimSuffix(auth, "\r\n")+sep))
			if resp.StatusCode != 400 || !closed {
				t.Fatalf("%s after a declined upgrade: %d, closed %v", name, resp.StatusCode, closed)
			}
		})
	}
	for _, r := range e.received() {
		if r.URL.Path == "/open/s" {
			t.Fatalf("the smuggled request reached the upstream: %s %s", r.Method, r.URL)
		}
	}
	if n := plainSeen.Load(); n != 0 {
		t.Fatalf("the smuggled request reached the plain upstream %d times", n)
	}
}

// plainUpstream is a plain-HTTP upstream on 127.0.0.1 that answers 200; it returns host:port.
func plainUpstream(t *testing.T) string {
	return plainUpstreamFunc(t, func(*http.Request) {})
}

func plainUpstreamFunc(t *testing.T, seen func(*http.Request)) string {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen(r)
		io.WriteString(w, "ok\n")
	}))
	t.Cleanup(s.Close)
	return s.Listener.Addr().String()
}

// TestAttackFake101: an upstream that answers 101 without completing a WebSocket handshake
// does not get an unframed stream to or from the agent.
func TestAttackFake101(t *testing.T) {
	fake := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		// A 101 without Sec-WebSocket-Accept, then an HTTP response carrying the key.
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nHTTP/1.1 200 OK\r\nX-Key: %s\r\n\r\n", r.Header.Get("Authorization"))
		brw.Flush()
	})
	e := newEnv(t, envOpts{handler: fake})
	conn := e.rawTunnel(t, "127.0.0.1")
	target := e.up.Listener.Addr().String()
	resp, _ := exchangeRaw(t, conn, "GET /api/custom/ws HTTP/1.1\r\nHost: "+target+"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("fake 101: %d, want 502", resp.StatusCode)
	}
	ev := e.broker.waitAudit(t, resp.Header.Get("X-Broker-Request-Id"))
	if !strings.Contains(fmt.Sprint(ev["error"]), "101") {
		t.Fatalf("audit error: %v", ev["error"])
	}
}

// TestAttackPlantAndReadBack: the agent has the upstream store the key through a request
// granted it, then reads it back through one that is not: it comes back scrubbed. Both the
// header-injected credential and a placeholder substituted into the body.
func TestAttackPlantAndReadBack(t *testing.T) {
	var mu sync.Mutex
	store := map[string]string{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
		switch {
		case strings.HasPrefix(r.URL.Path, "/api/custom/store/"):
			body, _ := io.ReadAll(r.Body)
			mu.Lock()
			store[key] = r.Header.Get("Authorization") + " " + string(body)
			mu.Unlock()
		case strings.HasPrefix(r.URL.Path, "/api/custom/read/"):
			mu.Lock()
			v := store[key]
			mu.Unlock()
			// Raw, base64 and URL-escaped, the forms an API reflects a value in.
			fmt.Fprintf(w, "%s|%s", v, base64.StdEncoding.EncodeToString([]byte(v)))
		}
	})
	policy := `package broker

decision := {"allow": true, "intercept": true} if input.phase == "connect"

decision := {"allow": true, "credentials": ["canary", "ph"]} if {
	input.phase == "request"
	startswith(input.request.path, "/api/custom/store/")
}

decision := {"allow": true} if {
	input.phase == "request"
	startswith(input.request.path, "/api/custom/read/")
}
`
	e := newEnv(t, envOpts{handler: h, policy: policy, extraCredentials: `  - name: ph
    hosts: ["127.0.0.1"]
    source: {env: CANARY_SECRET}
    inject: {placeholder: "PH_PLACEHOLDER_0123456789", body: true}
`})
	c := e.broker.client(t, agentID, e.token)
	resp, err := c.Post(e.url("/api/custom/store/k1"), "application/json", strings.NewReader(`{"note":"PH_PLACEHOLDER_0123456789"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	planted := store["k1"]
	mu.Unlock()
	if strings.Count(planted, e.canary) != 2 {
		t.Fatalf("the upstream did not get the key in the header and the body: %q", planted)
	}
	// A body carrying a substituted secret ends its connection: an upstream that ignored the
	// body could otherwise read it as a next request, one the policy never saw.
	for _, r := range e.received() {
		if strings.HasPrefix(r.URL.Path, "/api/custom/store/") && !r.Close {
			t.Fatal("the request whose body carried the key did not end its upstream connection")
		}
	}
	resp, err = c.Get(e.url("/api/custom/read/k1"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.Contains(string(body), e.canary) || !strings.Contains(string(body), "[REDACTED]") {
		t.Fatalf("read back without a credential: %d %q", resp.StatusCode, body)
	}
	ev := e.broker.waitAudit(t, resp.Header.Get("X-Broker-Request-Id"))
	if creds, _ := ev["credentials"].([]any); ev["decision"] != "allow" || len(creds) != 0 {
		t.Fatalf("the read was not an allowed request without credentials: %v", ev)
	}

	// The same service under another name, to which no credential is bound: the placeholder's
	// value, which the agent put where it liked, is scrubbed there too.
	other := strings.Replace(e.url("/api/custom/read/k1"), "127.0.0.1", "localhost", 1)
	resp, err = c.Get(other)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.Contains(string(body), e.canary) {
		t.Fatalf("read back through another name: %d %q", resp.StatusCode, body)
	}
}

// TestAttackKeyInMalformedResponseLine: an upstream that reflects the key into a malformed
// header line makes the broker fail the response; the key is in neither the agent's answer
// nor the audit event's error (assertNoCanaryLeaked checks the whole log).
func TestAttackKeyInMalformedResponseLine(t *testing.T) {
	bad := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprintf(brw, "HTTP/1.1 200 OK\r\nX-Reflect %s\r\nContent-Length: 0\r\n\r\n", r.Header.Get("Authorization"))
		brw.Flush()
	})
	e := newEnv(t, envOpts{handler: bad})
	out, _ := e.curl("-i", e.url("/api/custom/bad"))
	if !hasStatus(out, 502) || strings.Contains(out, e.canary) {
		t.Fatalf("want a 502 without the key:\n%s", out)
	}
	id := headerValue(out, "X-Broker-Request-Id")
	ev := e.broker.waitAudit(t, id)
	if msg := fmt.Sprint(ev["error"]); msg == "" || strings.Contains(msg, e.canary) {
		t.Fatalf("audit error: %q", msg)
	}
}

// TestAttackStreamsTimesTunnels: HTTP/2 streams count against the agent's cap on requests in
// flight, across all its tunnels: what reaches the upstream at once is bounded by the cap,
// not by tunnels times streams; the rest are refused with 429 at once.
func TestAttackStreamsTimesTunnels(t *testing.T) {
	arrived := make(chan struct{}, 64)
	release := make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		io.WriteString(w, "done\n")
	})
	e := newEnv(t, envOpts{handler: slow, proxy: "max_requests_per_agent: 3"})
	pu, _ := url.Parse(e.broker.proxyURL(agentID, e.token))
	var clients []*http.Client
	for range 2 { // two tunnels, each HTTP/2
		clients = append(clients, &http.Client{Timeout: waitTimeout, Transport: &http.Transport{
			Proxy: http.ProxyURL(pu), ForceAttemptHTTP2: true,
			TLSClientConfig: &tls.Config{RootCAs: e.broker.caPool(t), NextProtos: []string{"h2"}},
		}})
	}
	const n = 12
	codes := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			resp, err := clients[i%2].Get(e.url(fmt.Sprintf("/api/custom/slow/%d", i)))
			if err != nil {
				codes <- 0
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.ProtoMajor != 2 {
				t.Errorf("not HTTP/2: %s", resp.Proto)
			}
			codes <- resp.StatusCode
		})
	}
	// Three reach the upstream; the other nine are answered 429 while those three wait.
	for range 3 {
		<-arrived
	}
	got := map[int]int{}
	for range n - 3 {
		got[<-codes]++
	}
	close(release)
	wg.Wait()
	close(codes)
	for c := range codes {
		got[c]++
	}
	if got[429] != n-3 || got[200] != 3 {
		t.Fatalf("statuses: %v, want 3 x 200 and %d x 429", got, n-3)
	}
	if len(arrived) != 0 {
		t.Fatalf("%d more requests reached the upstream than the cap allows", len(arrived))
	}
}
