package integration

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/capbroker/capbroker/broker/budget/redistest"
	"github.com/capbroker/capbroker/internal/harness"
)

// fleetPolicy: tunnels to 127.0.0.1 are intercepted; /open/ is allowed, /ask/ asks a person,
// /mcp is decided by the shipped MCP policy.
const fleetPolicy = `package broker

import data.mcp

default decision := {"allow": false, "reason": "not allowed by the test policy"}

decision := {"allow": true, "intercept": true} if {
	input.phase == "connect"
	input.request.host == "127.0.0.1"
}

decision := {"allow": true} if {
	input.phase == "request"
	startswith(input.request.path, "/open/")
}

decision := {"ask": {"reason": "writes need a person", "timeout": "1m"}} if {
	input.phase == "request"
	startswith(input.request.path, "/ask/")
}

decision := mcp.decision if {
	input.phase == "request"
	input.request.path == "/mcp"
}
`

// fleetRig is three brokers (the built binary) sharing one CA, one policy directory and a
// real redis-server, behind Debian's haproxy in TCP mode as the Service: round robin over the
// replicas whose /readyz answers 200, a connection that fails retried on another.
type fleetRig struct {
	t         *testing.T
	dir       string
	redis     *redistest.Server
	caFile    string
	policyDir string
	config    string // the part of the config every replica shares
	env       []string
	replicas  []*fleetReplica
	lb        string // haproxy's address: the Service
	lbStats   string // haproxy's stats socket
	tokens    map[string]string
	canary    string // the canary credential's value
}

type fleetReplica struct {
	name, listen, admin, cfgFile string
	proc                         *brokerProc
}

func haproxyBin(t *testing.T) string {
	for _, p := range []string{os.Getenv("HAPROXY_BIN"), "/usr/sbin/haproxy"} {
		if p != "" {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	if p, err := exec.LookPath("haproxy"); err == nil {
		return p
	}
	requireTool(t, "haproxy is missing")
	return ""
}

func newFleetRig(t *testing.T, upstreamCA string, files map[string]string, extra string) *fleetRig {
	t.Helper()
	hap := haproxyBin(t)
	dir, err := os.MkdirTemp("", "capbroker-fleet-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	r := &fleetRig{t: t, dir: dir, redis: redistest.Start(t), caFile: filepath.Join(dir, "ca", "ca.crt"),
		policyDir: filepath.Join(dir, "policies"), tokens: map[string]string{}}
	if out, err := exec.Command(brokerBin, "ca", "init", "--out", filepath.Join(dir, "ca")).CombinedOutput(); err != nil {
		t.Fatalf("ca init: %v\n%s", err, out)
	}
	if err := os.MkdirAll(r.policyDir, 0o755); err != nil {
		t.Fatal(err)
	}
	files["broker.rego"] = fleetPolicy
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(r.policyDir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	agents := []string{"fleet-a", "fleet-b", "fleet-c"}
	for _, a := range agents {
		r.tokens[a] = randHex(16)
		r.env = append(r.env, tokenEnv(a)+"="+r.tokens[a])
	}
	r.canary = "sk-canary-" + randHex(8)
	r.env = append(r.env, "CANARY_SECRET="+r.canary)
	r.config = canaryConfig(upstreamCA, agents, fmt.Sprintf(`budgets:
  store: {redis: {address: %q, key_prefix: "fleet:"}}
protocols:
  mcp: [{hosts: [127.0.0.1], path: /mcp}]
`, r.redis.Addr)+extra)
	var servers strings.Builder
	for i := range 3 {
		rp := &fleetReplica{name: fmt.Sprintf("replica-%d", i+1), listen: freeAddr(t), admin: freeAddr(t)}
		rp.cfgFile = filepath.Join(dir, rp.name+".yaml")
		cfg := fmt.Sprintf("proxy: {listen: %q}\nadmin: {listen: %q}\nca: {cert_file: %q, key_file: %q}\npolicy: {dir: %q, mode: enforce}\n"+
			"approvals: {state_file: %q}\nfleet: {drain_delay: 400ms, drain_hold: 3s, learn: true, agent_connections: 12}\naudit: {include_input: metadata, instance: %s}\n",
			rp.listen, rp.admin, r.caFile, filepath.Join(dir, "ca", "ca.key"), r.policyDir,
			filepath.Join(dir, rp.name+"-approvals.json"), rp.name) + r.config
		if err := os.WriteFile(rp.cfgFile, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		r.replicas = append(r.replicas, rp)
		_, adminPort, _ := net.SplitHostPort(rp.admin)
		fmt.Fprintf(&servers, "  server %s %s check port %s\n", rp.name, rp.listen, adminPort)
	}
	for _, rp := range r.replicas {
		r.start(rp)
	}
	r.lb, r.lbStats = freeAddr(t), filepath.Join(dir, "haproxy.sock")
	hcfg := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(hcfg, []byte(fmt.Sprintf(`global
  stats socket %s level admin
  maxconn 2000
defaults
  mode tcp
  timeout connect 2s
  timeout client 60s
  timeout server 60s
  retries 3
  option redispatch 1
frontend service
  bind %s
  default_backend brokers
backend brokers
  balance roundrobin
  option httpchk GET /readyz
  http-check expect status 200
  default-server inter 100ms fall 1 rise 1
%s`, r.lbStats, r.lb, servers.String())), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(hap, "-db", "-f", hcfg)
	cmd.Env = harness.Env()
	logs := newLogTail()
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for _, rp := range r.replicas {
		r.waitLB(rp, "UP")
	}
	return r
}

func freeAddr(t *testing.T) string {
	t.Helper()
	a, err := harness.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// start runs a replica (again) on its addresses and waits until it listens.
func (r *fleetRig) start(rp *fleetReplica) {
	t := r.t
	t.Helper()
	b := &brokerProc{dir: r.dir, caFile: r.caFile, policyDir: r.policyDir, logs: newLogTail(), auditLog: newLogTail(), done: make(chan error, 1)}
	b.cmd = exec.Command(brokerBin, "run", "--config", rp.cfgFile)
	b.cmd.Env = append(harness.Env(), r.env...)
	b.cmd.Stdout, b.cmd.Stderr = b.auditLog, b.logs
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := b.cmd.Wait()
		b.logs.Write([]byte(fmt.Sprintf("broker process exited: %v\n", err)))
		b.done <- err
	}()
	t.Cleanup(func() { b.stop(t) })
	b.logs.wait(t, `"message":"listening"`)
	b.proxyAddr, b.adminAddr = rp.listen, rp.admin
	rp.proc = b
}

// lbStatus is haproxy's view of a replica (UP, DOWN, ...), from its stats socket.
func (r *fleetRig) lbStatus(rp *fleetReplica) string {
	c, err := net.Dial("unix", r.lbStats)
	if err != nil {
		return ""
	}
	defer c.Close()
	_, _ = io.WriteString(c, "show stat\n")
	sc := bufio.NewScanner(c)
	col := -1
	for sc.Scan() {
		f := strings.Split(sc.Text(), ",")
		if strings.HasPrefix(sc.Text(), "# ") {
			for i, n := range f {
				if n == "status" {
					col = i
				}
			}
			continue
		}
		if len(f) > col && col >= 0 && f[0] == "brokers" && f[1] == rp.name {
			return strings.Fields(f[col] + " ")[0]
		}
	}
	return ""
}

// waitLB waits until haproxy reports the replica in state (its checks run every 100ms).
func (r *fleetRig) waitLB(rp *fleetReplica, state string) {
	r.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for r.lbStatus(rp) != state {
		if time.Now().After(deadline) {
			r.t.Fatalf("haproxy never saw %s %s (now %q)", rp.name, state, r.lbStatus(rp))
		}
		time.Sleep(20 * time.Millisecond) // polling another process's health checks
	}
}

// client is an agent's HTTP client through the Service, one connection per request, so that
// successive requests land on successive replicas.
func (r *fleetRig) client(agent string) *http.Client {
	return r.clientVia(r.lb, agent)
}

func (r *fleetRig) clientVia(addr, agent string) *http.Client {
	pu, _ := url.Parse(fmt.Sprintf("http://%s:%s@%s", agent, r.tokens[agent], addr))
	b := &brokerProc{caFile: r.caFile}
	return &http.Client{Timeout: waitTimeout, Transport: &http.Transport{Proxy: http.ProxyURL(pu), DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: b.caPool(r.t)}}}
}

func (r *fleetRig) admin(rp *fleetReplica) *admin { return newAdmin(r.t, rp.proc) }

// instances counts the decision events of each replica whose path starts with prefix.
func (r *fleetRig) instances(prefix string) map[string]int {
	out := map[string]int{}
	for _, rp := range r.replicas {
		for _, ev := range rp.proc.audit(r.t) {
			if p, _ := ev["path"].(string); ev["msg"] == "decision" && strings.HasPrefix(p, prefix) {
				out[fmt.Sprint(ev["instance"])]++
			}
		}
	}
	return out
}

// countingUpstream counts the requests it is sent, by path; /open/slow/ waits for release.
type countingUpstream struct {
	// fixedSession, when set, is the Mcp-Session-Id /mcp issues to every client: a hostile
	// MCP server handing one agent's session to another.
	fixedSession string

	mu      sync.Mutex
	seen    map[string]int
	arrived chan string
	release chan struct{}
}

func (u *countingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.seen[r.URL.Path]++
	u.mu.Unlock()
	if r.URL.Path == "/mcp" {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Mcp-Session-Id", u.fixedSession)
		_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-06-18","capabilities":{},"serverInfo":{"name":"hostile","version":"1"}}}`)
		return
	}
	if strings.HasPrefix(r.URL.Path, "/open/slow/") {
		u.arrived <- r.URL.Path
		select {
		case <-u.release:
		case <-r.Context().Done():
			return
		}
	}
	_, _ = io.WriteString(w, "ok "+r.URL.Path)
}

func (u *countingUpstream) count(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.seen[path]
}

// TestFleetBehindHAProxy: three replicas behind haproxy share one budget exactly, show a
// request held on one replica on another's console, which decides it, with a grant that a
// third replica honours; continue an MCP session through other replicas, never for another
// agent; roll all three under load with no failed request; and, when one is killed, lose
// only its requests in flight, each sent upstream once, the held one reported by a survivor.
func TestFleetBehindHAProxy(t *testing.T) {
	modules := nodeModules(t)
	mcpAddr := startMCPEverything(t, modules)
	pki := newUpstreamPKI(t)
	up := &countingUpstream{fixedSession: "fixed-" + randHex(8), seen: map[string]int{}, arrived: make(chan string, 16), release: make(chan struct{})}
	upSrv := pki.serve(t, up, false, nil)
	mcpSrv := pki.serve(t, httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: mcpAddr}), false, nil)
	r := newFleetRig(t, pki.File, map[string]string{
		"mcp.rego":     readShipped(t, "mcp.rego"),
		"data.yaml":    mcpData,
		"budgets.json": `{"budgets": {"fleet-day": {"agent": "fleet-b", "requests": 20, "window": "day"}}}`,
	}, "")

	t.Run("spread", func(t *testing.T) {
		c := r.client("fleet-a")
		for i := range 6 {
			resp, err := c.Get(fmt.Sprintf("%s/open/spread/%d", upSrv.URL, i))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
		}
		// Python's urllib, as an agent's script would, through the Service.
		for i := range 3 {
			py := exec.Command("python3", "-c", "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())",
				fmt.Sprintf("%s/open/spread/py-%d", upSrv.URL, i))
			py.Env = append(harness.Env(), fmt.Sprintf("https_proxy=http://fleet-a:%s@%s", r.tokens["fleet-a"], r.lb), "SSL_CERT_FILE="+r.caFile, "no_proxy=")
			if out, err := py.CombinedOutput(); err != nil || !strings.Contains(string(out), fmt.Sprintf("ok /open/spread/py-%d", i)) {
				t.Fatalf("python through the Service: %v\n%s", err, out)
			}
		}
		got := r.instances("/open/spread/")
		for _, rp := range r.replicas {
			if got[rp.name] == 0 {
				t.Fatalf("replica %s served none of the requests (audit instance field): %v", rp.name, got)
			}
		}
	})

	t.Run("learn records of every replica", func(t *testing.T) {
		out := t.TempDir()
		deadline := time.Now().Add(waitTimeout)
		for {
			got, err := exec.Command(brokerBin, "policy", "learn", "--from", "fleet", "--config", r.replicas[0].cfgFile, "--out", out, "--force").CombinedOutput()
			var events int
			fmt.Sscanf(string(got), "learn: %d events", &events)
			// The nine requests of "spread", three on each replica (haproxy's round robin
			// over nine connections): a connect and a request event each, all eighteen only
			// if every replica recorded its own.
			if err == nil && events >= 18 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("broker policy learn --from fleet: %v\n%s", err, got)
			}
			time.Sleep(50 * time.Millisecond) // the replicas send their records every 100ms
		}
		data, err := os.ReadFile(filepath.Join(out, "learned.json"))
		if err != nil {
			entries, _ := os.ReadDir(out)
			t.Fatalf("the draft: %v (%v)", err, entries)
		}
		if !strings.Contains(string(data), "fleet-a") {
			t.Fatalf("the draft names no agent fleet-a:\n%s", data)
		}
	})

	t.Run("budget exact across three", func(t *testing.T) {
		var ok, refused atomic.Int64
		var wg sync.WaitGroup
		for g := range 6 {
			wg.Go(func() {
				c := r.client("fleet-b")
				for i := range 5 {
					resp, err := c.Get(fmt.Sprintf("%s/open/budget/%d-%d", upSrv.URL, g, i))
					if err != nil {
						t.Error(err)
						return
					}
					resp.Body.Close()
					switch resp.StatusCode {
					case 200:
						ok.Add(1)
					case 429:
						refused.Add(1)
					default:
						t.Errorf("status %d", resp.StatusCode)
					}
				}
			})
		}
		wg.Wait()
		reached := 0
		up.mu.Lock()
		for p, n := range up.seen {
			if strings.HasPrefix(p, "/open/budget/") {
				reached += n
			}
		}
		up.mu.Unlock()
		if ok.Load() != 20 || refused.Load() != 10 || reached != 20 {
			t.Fatalf("30 requests for a budget of 20 over 3 replicas: %d allowed, %d refused, %d reached the upstream", ok.Load(), refused.Load(), reached)
		}
		if got := r.instances("/open/budget/"); len(got) != 3 {
			t.Fatalf("the requests did not spread over the three replicas: %v", got)
		}
	})

	t.Run("approval held on one decided on another, grant used on a third", func(t *testing.T) {
		// curl, as the agent, through the Service.
		proxy := fmt.Sprintf("http://fleet-c:%s@%s", r.tokens["fleet-c"], r.lb)
		cmd := exec.Command("curl", "-sS", "--max-time", "60", "-o", "-", "-w", "\n%{http_code}", upSrv.URL+"/ask/deploy/1")
		cmd.Env = append(harness.Env(), "HTTPS_PROXY="+proxy, "CURL_CA_BUNDLE="+r.caFile, "NO_PROXY=")
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		// Any replica's API lists it, with the replica that holds it.
		lister := r.replicas[0]
		held := r.waitHeld(lister, "/ask/deploy/1")
		holder, _ := held["instance"].(string)
		if holder == "" {
			holder = lister.name // held on the replica listing it
		}
		var decider, third *fleetReplica
		for _, rp := range r.replicas {
			if rp.name == holder {
				continue
			}
			if decider == nil {
				decider = rp
			} else {
				third = rp
			}
		}
		// Every replica lists it, once.
		for _, rp := range r.replicas {
			_, list := r.admin(rp).call("GET", "/api/approvals", "", nil)
			n := 0
			for _, p := range list["pending"].([]any) {
				if p.(map[string]any)["id"] == held["id"] {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("%s lists the held request %d times", rp.name, n)
			}
		}
		// The CLI against the decider lists it too.
		if cli, err := exec.Command(brokerBin, "approvals", "list", "--admin", "http://"+decider.admin).CombinedOutput(); err != nil || !strings.Contains(string(cli), held["id"].(string)) {
			t.Fatalf("broker approvals list on %s: %v\n%s", decider.name, err, cli)
		}
		res := r.admin(decider).approve(held["id"].(string), `{"scope": "agent", "path_prefix": "/ask/deploy/"}`)
		if res["grant"] == nil {
			t.Fatalf("the approval from %s made no grant: %v", decider.name, res)
		}
		<-done
		if !strings.HasSuffix(strings.TrimSpace(out.String()), "200") || up.count("/ask/deploy/1") != 1 {
			t.Fatalf("held on %s, approved on %s: curl got %q, upstream saw it %d times", holder, decider.name, out.String(), up.count("/ask/deploy/1"))
		}
		// The grant, made on the holder, lets the next request through the third replica at once.
		resp, err := r.clientVia(third.listen, "fleet-c").Get(upSrv.URL + "/ask/deploy/2")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || up.count("/ask/deploy/2") != 1 {
			t.Fatalf("the grant made on %s, used on %s: %d", holder, third.name, resp.StatusCode)
		}
		// The audit names the replica that decided each.
		third.proc.waitAuditWhere(t, 1, "the third replica's decision", func(ev auditEvent) bool {
			return ev["path"] == "/ask/deploy/2" && ev["instance"] == third.name && ev["status"] == float64(200)
		})
		// Another replica's console cannot decide what is no longer held.
		if code, _ := r.admin(decider).call("POST", "/api/approvals/"+held["id"].(string)+"/deny", "{}", nil); code != 404 {
			t.Fatalf("denying a request already approved: %d, want 404", code)
		}
	})

	t.Run("a held request's secrets never reach Redis", func(t *testing.T) {
		// A hostile agent puts the credential's value in what every console is shown.
		res := make(chan int, 1)
		go func() {
			req, _ := http.NewRequest(http.MethodPost, upSrv.URL+"/ask/leak?k="+r.canary, strings.NewReader(`{"note": "`+r.canary+`"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Note", r.canary)
			resp, err := r.clientVia(r.replicas[1].listen, "fleet-a").Do(req)
			if err != nil {
				res <- 0
				return
			}
			resp.Body.Close()
			res <- resp.StatusCode
		}()
		held := r.waitHeld(r.replicas[2], "/ask/leak")
		dump, err := redisDump(r.redis.Addr)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(dump, held["id"].(string)) {
			t.Fatalf("the held request is not in Redis:\n%s", dump)
		}
		if strings.Contains(dump, r.canary) || strings.Contains(dump, r.tokens["fleet-a"]) {
			t.Fatalf("a secret reached Redis:\n%s", dump)
		}
		if code, _ := r.admin(r.replicas[2]).call("POST", "/api/approvals/"+held["id"].(string)+"/deny", `{"comment": "no"}`, nil); code != 200 {
			t.Fatalf("deny from replica-3: %d", code)
		}
		if code := <-res; code != http.StatusForbidden {
			t.Fatalf("the denied request: %d", code)
		}
		if n := up.count("/ask/leak"); n != 0 {
			t.Fatalf("the denied request reached the upstream %d times", n)
		}
	})

	t.Run("MCP session continued through other replicas", func(t *testing.T) {
		var last string
		post := func(c *http.Client, body, session string) *http.Response {
			t.Helper()
			req, _ := http.NewRequest(http.MethodPost, mcpSrv.URL+"/mcp", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
			if session != "" {
				req.Header.Set("Mcp-Session-Id", session)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			last = string(b)
			return resp
		}
		via := func(i int, agent string) *http.Client { return r.clientVia(r.replicas[i].listen, agent) }
		resp := post(via(0, "fleet-a"), `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`, "")
		session := resp.Header.Get("Mcp-Session-Id")
		if resp.StatusCode != 200 || session == "" {
			t.Fatalf("initialize through replica-1: %d, session %q", resp.StatusCode, session)
		}
		if resp := post(via(1, "fleet-a"), `{"jsonrpc":"2.0","method":"notifications/initialized"}`, session); resp.StatusCode != 202 {
			t.Fatalf("initialized through replica-2: %d %s", resp.StatusCode, last)
		}
		if resp := post(via(2, "fleet-a"), `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, session); resp.StatusCode != 200 || !strings.Contains(last, `"echo"`) {
			t.Fatalf("tools/list through replica-3: %d %s", resp.StatusCode, last)
		}
		// Another agent, through a replica that has not seen the session: refused.
		if resp := post(via(1, "fleet-c"), `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, session); resp.StatusCode != 200 ||
			!strings.Contains(last, "this MCP session was issued to another agent") {
			t.Fatalf("fleet-c in fleet-a's session through replica-2: %d %s", resp.StatusCode, last)
		}
		if resp := post(via(2, "fleet-a"), `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`, "made-up-"+randHex(8)); resp.StatusCode != 404 {
			t.Fatalf("a session never issued: %d", resp.StatusCode)
		}
		// The session id itself is never written to the store: only its digest.
		keys, err := redisKeys(r.redis.Addr, "fleet:mcp:session:*")
		if err != nil || len(keys) == 0 {
			t.Fatalf("no MCP session key in Redis: %v", err)
		}
		for _, k := range keys {
			if strings.Contains(k, session) {
				t.Fatalf("the session id is in a Redis key: %s", k)
			}
		}
	})

	t.Run("a hostile MCP server cannot hand a session to another agent", func(t *testing.T) {
		initialize := func(rp *fleetReplica, agent, session string) (int, string) {
			req, _ := http.NewRequest(http.MethodPost, upSrv.URL+"/mcp", strings.NewReader(
				`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if session != "" {
				req.Header.Set("Mcp-Session-Id", session)
			}
			resp, err := r.clientVia(rp.listen, agent).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return resp.StatusCode, string(b)
		}
		// The server issues its one session id to fleet-a through replica-1, then to fleet-c
		// through replica-2: the session stays fleet-a's on every replica.
		if code, body := initialize(r.replicas[0], "fleet-a", ""); code != 200 {
			t.Fatalf("fleet-a: %d %s", code, body)
		}
		if code, body := initialize(r.replicas[1], "fleet-c", ""); code != 200 {
			t.Fatalf("fleet-c: %d %s", code, body)
		}
		if _, body := initialize(r.replicas[2], "fleet-c", up.fixedSession); !strings.Contains(body, "this MCP session was issued to another agent") {
			t.Fatalf("fleet-c in the session the server handed it, through replica-3: %s", body)
		}
		if _, body := initialize(r.replicas[1], "fleet-c", up.fixedSession); !strings.Contains(body, "this MCP session was issued to another agent") {
			t.Fatalf("fleet-c in the session the server handed it, through replica-2: %s", body)
		}
		if code, body := initialize(r.replicas[2], "fleet-a", up.fixedSession); code != 200 {
			t.Fatalf("fleet-a in its own session through replica-3: %d %s", code, body)
		}
	})

	t.Run("MCP SDK through the Service", func(t *testing.T) {
		// The SDK's client, its connections spread over the replicas by haproxy.
		out := runNodeFleet(t, modules, fmt.Sprintf("http://fleet-a:%s@%s", r.tokens["fleet-a"], r.lb), r.caFile, mcpSrv.URL+"/mcp")
		if !strings.Contains(out, "echo Echo: hello") {
			t.Fatalf("MCP SDK client through haproxy:\n%s", out)
		}
		got := r.instances("/mcp")
		if len(got) < 2 {
			t.Fatalf("the MCP requests did not spread over replicas: %v", got)
		}
	})

	t.Run("connection cap across the fleet", func(t *testing.T) {
		// fleet-c keeps 12 connections open, spread over the three replicas by haproxy: the
		// fleet's cap. A 13th is refused by whichever replica it reaches, once the replicas
		// have synced their counts (every 100ms); when they close, a new one is let in.
		keep := func() (*http.Client, string) {
			pu, _ := url.Parse(fmt.Sprintf("http://fleet-c:%s@%s", r.tokens["fleet-c"], r.lb))
			c := &http.Client{Timeout: waitTimeout, Transport: &http.Transport{Proxy: http.ProxyURL(pu), MaxConnsPerHost: 1,
				TLSClientConfig: &tls.Config{RootCAs: (&brokerProc{caFile: r.caFile}).caPool(t)}}}
			resp, err := c.Get(upSrv.URL + "/open/cap")
			if err != nil {
				// Refused at the CONNECT: Go reports the proxy's answer as an error.
				if strings.Contains(err.Error(), "too_many_connections") {
					return c, "capped"
				}
				return c, err.Error()
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusTooManyRequests && strings.Contains(string(body), `"too_many_connections"`) {
				return c, "capped"
			}
			return c, resp.Status
		}
		var open []*http.Client
		defer func() {
			for _, c := range open {
				c.CloseIdleConnections()
			}
		}()
		for range 12 {
			c, got := keep()
			if got != "200 OK" {
				t.Fatalf("connection %d of 12: %s", len(open)+1, got)
			}
			open = append(open, c)
		}
		refused := func() bool {
			time.Sleep(20 * time.Millisecond) // the replicas sync their counts every 100ms
			c, got := keep()
			c.CloseIdleConnections()
			return got == "capped"
		}
		deadline := time.Now().Add(waitTimeout)
		for !refused() {
			if time.Now().After(deadline) {
				t.Fatal("a 13th connection of fleet-c was never refused")
			}
		}
		for _, c := range open {
			c.CloseIdleConnections()
		}
		open = nil
		for refused() {
			if time.Now().After(deadline) {
				t.Fatal("fleet-c's connections, closed, still count")
			}
		}
	})

	t.Run("round trips to Redis per request", func(t *testing.T) {
		mcpPost := func(rp *fleetReplica, body, session string) string {
			req, _ := http.NewRequest(http.MethodPost, mcpSrv.URL+"/mcp", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
			if session != "" {
				req.Header.Set("Mcp-Session-Id", session)
			}
			resp, err := r.clientVia(rp.listen, "fleet-a").Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode/100 != 2 {
				t.Fatalf("MCP through %s: %d", rp.name, resp.StatusCode)
			}
			return resp.Header.Get("Mcp-Session-Id")
		}
		get := func(rp *fleetReplica, agent, path string) func() {
			return func() {
				resp, err := r.clientVia(rp.listen, agent).Get(upSrv.URL + path)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}
		}
		one, two := r.replicas[0], r.replicas[1]
		var session string
		cases := []struct {
			name string
			rp   *fleetReplica
			do   func()
			want float64
		}{
			{"allowed, no budget, grant or MCP session", one, get(one, "fleet-a", "/open/rt/1"), 0},
			// The first run of the budget's script on a Redis loads it (EVALSHA, then EVAL).
			{"a budget, its script loaded", one, get(one, "fleet-b", "/open/rt/2"), -1},
			{"a budget", one, get(one, "fleet-b", "/open/rt/3"), 1},
			{"an ask covered by a grant", one, get(one, "fleet-c", "/ask/deploy/3"), 1},
			{"an MCP session issued", one, func() {
				session = mcpPost(one, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`, "")
			}, 1},
			{"an MCP session used where it was issued", one, func() { mcpPost(one, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, session) }, 0},
			{"an MCP session first used on another replica", two, func() { mcpPost(two, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, session) }, 1},
			{"an MCP session used again there", two, func() { mcpPost(two, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, session) }, 0},
		}
		for _, c := range cases {
			before := roundTrips(t, c.rp)
			c.do()
			if got := roundTrips(t, c.rp) - before; c.want >= 0 && got != c.want {
				t.Errorf("%s: %v round trips to Redis, want %v", c.name, got, c.want)
			} else {
				t.Logf("%s: %v round trips", c.name, got)
			}
		}
	})

	t.Run("rolling restart under load", func(t *testing.T) {
		stop := make(chan struct{})
		var sent, failed atomic.Int64
		var fails sync.Map
		var wg sync.WaitGroup
		for g := range 6 {
			wg.Go(func() {
				c := r.client("fleet-a")
				if g >= 4 {
					// Two clients keep their connections (a tunnel each) between requests: a
					// drain closes them when idle, and the client opens another.
					c.Transport.(*http.Transport).DisableKeepAlives = false
				}
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					sent.Add(1)
					resp, err := c.Get(fmt.Sprintf("%s/open/roll/%d-%d", upSrv.URL, g, i))
					if err != nil {
						failed.Add(1)
						fails.Store(fmt.Sprintf("%d-%d", g, i), err.Error())
						continue
					}
					resp.Body.Close()
					if resp.StatusCode != 200 {
						failed.Add(1)
						fails.Store(fmt.Sprintf("%d-%d", g, i), resp.Status)
					}
				}
			})
		}
		for _, rp := range r.replicas {
			if err := rp.proc.stop(t); err != nil {
				t.Fatalf("%s did not drain cleanly: %v\n%s", rp.name, err, rp.proc.logs.String())
			}
			if !strings.Contains(rp.proc.logs.String(), "draining: not ready") {
				t.Fatalf("%s did not report draining", rp.name)
			}
			r.start(rp)
			r.waitLB(rp, "UP")
		}
		close(stop)
		wg.Wait()
		fails.Range(func(k, v any) bool { t.Errorf("request %s failed: %s", k, v); return true })
		t.Logf("rolling restart of 3 replicas: %d requests, %d failed", sent.Load(), failed.Load())
		if sent.Load() < 20 {
			t.Fatalf("only %d requests ran during the roll", sent.Load())
		}
	})

	t.Run("a draining replica's held request is decided from another", func(t *testing.T) {
		drained, decider := r.replicas[2], r.replicas[0]
		res := make(chan string, 1)
		go func() {
			resp, err := r.clientVia(drained.listen, "fleet-c").Get(upSrv.URL + "/ask/drain/1")
			if err != nil {
				res <- err.Error()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			res <- fmt.Sprintf("%d %s", resp.StatusCode, b)
		}()
		held := r.waitHeld(decider, "/ask/drain/1")
		stopped := make(chan error, 1)
		go func() { stopped <- drained.proc.stop(t) }()
		drained.proc.logs.wait(t, "draining: not ready")
		r.waitLB(drained, "DOWN") // readiness went false first
		r.admin(decider).approve(held["id"].(string), `{}`)
		if got := <-res; !strings.HasPrefix(got, "200 ") {
			t.Fatalf("held on %s as it drained, approved on %s: %s", drained.name, decider.name, got)
		}
		if err := <-stopped; err != nil {
			t.Fatalf("%s did not drain cleanly: %v", drained.name, err)
		}
		if n := up.count("/ask/drain/1"); n != 1 {
			t.Fatalf("the upstream saw the approved request %d times", n)
		}
		r.start(drained)
		r.waitLB(drained, "UP")
	})

	t.Run("SIGKILL of one replica", func(t *testing.T) {
		victim, survivor := r.replicas[0], r.replicas[1]
		// Two requests in flight on the victim (waiting at the upstream), and one held.
		errs := make(chan error, 2)
		for i := range 2 {
			go func() {
				resp, err := r.clientVia(victim.listen, "fleet-a").Get(fmt.Sprintf("%s/open/slow/%d", upSrv.URL, i))
				if err == nil {
					resp.Body.Close()
				}
				errs <- err
			}()
		}
		for range 2 {
			<-up.arrived
		}
		heldErr := make(chan error, 1)
		go func() {
			resp, err := r.clientVia(victim.listen, "fleet-c").Get(upSrv.URL + "/ask/kill/1")
			if err == nil {
				resp.Body.Close()
			}
			heldErr <- err
		}()
		lost := r.waitHeld(survivor, "/ask/kill/1")
		if lost["instance"] != victim.name {
			t.Fatalf("the held request is listed on %s as held by %v", survivor.name, lost["instance"])
		}
		_ = victim.proc.cmd.Process.Signal(syscall.SIGKILL)
		for range 2 {
			if err := <-errs; err == nil {
				t.Fatal("a request in flight on the killed replica succeeded")
			}
		}
		if err := <-heldErr; err == nil {
			t.Fatal("the held request on the killed replica succeeded")
		}
		r.waitLB(victim, "DOWN")
		// The service goes on through the survivors.
		resp, err := r.client("fleet-a").Get(upSrv.URL + "/open/after-kill")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		// A survivor reports the held request lost once the killed replica's heartbeat has
		// expired: each sweeps the queue every second, no console needed.
		deadline := time.Now().Add(waitTimeout)
		var reports []string
		for len(reports) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("no survivor reported the killed replica's held request")
			}
			time.Sleep(100 * time.Millisecond) // the heartbeat's TTL runs out
			for _, s := range r.replicas[1:] {
				for _, ev := range s.proc.audit(t) {
					c, _ := ev["comment"].(string)
					if ev["msg"] == "approval" && ev["action"] == "interrupted" && ev["id"] == lost["id"] {
						if ev["instance"] != s.name || !strings.Contains(c, victim.name) {
							t.Fatalf("the report: %v", ev)
						}
						reports = append(reports, s.name)
					}
				}
			}
		}
		if len(reports) != 1 {
			t.Fatalf("the lost request was reported by %v: want one survivor", reports)
		}
		if r.isHeld(survivor, "/ask/kill/1") {
			t.Fatal("the killed replica's held request is still listed")
		}
		// Nothing was sent twice: each request in flight reached the upstream once.
		close(up.release)
		for i := range 2 {
			if n := up.count(fmt.Sprintf("/open/slow/%d", i)); n != 1 {
				t.Fatalf("request %d in flight on the killed replica reached the upstream %d times", i, n)
			}
		}
		if n := up.count("/ask/kill/1"); n != 0 {
			t.Fatalf("the held request reached the upstream %d times", n)
		}
		r.start(victim)
	})
}

// waitHeld waits until rp's API lists a held request for path, and returns it.
func (r *fleetRig) waitHeld(rp *fleetReplica, path string) map[string]any {
	r.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		if h := r.held(rp, path); h != nil {
			return h
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("no request for %s held on %s's API", path, rp.name)
		}
		time.Sleep(20 * time.Millisecond) // polling the API as a console does
	}
}

func (r *fleetRig) isHeld(rp *fleetReplica, path string) bool { return r.held(rp, path) != nil }

func (r *fleetRig) held(rp *fleetReplica, path string) map[string]any {
	_, list := r.admin(rp).call("GET", "/api/approvals", "", nil)
	pending, _ := list["pending"].([]any)
	for _, p := range pending {
		if m := p.(map[string]any); m["path"] == path {
			return m
		}
	}
	return nil
}

// roundTrips reads capbroker_store_round_trips_total{kind="request"} off a replica's metrics.
func roundTrips(t *testing.T, rp *fleetReplica) float64 {
	t.Helper()
	resp, err := http.Get("http://" + rp.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), `capbroker_store_round_trips_total{kind="request"} `); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	t.Fatal("no capbroker_store_round_trips_total in the metrics")
	return 0
}

// redisDump is every key of the Redis at addr with its value, as redis-cli prints them.
func redisDump(addr string) (string, error) {
	keys, err := redisKeys(addr, "*")
	if err != nil {
		return "", err
	}
	host, port, _ := net.SplitHostPort(addr)
	var b strings.Builder
	for _, k := range keys {
		typ, _ := exec.Command("redis-cli", "-h", host, "-p", port, "TYPE", k).Output()
		var args []string
		switch strings.TrimSpace(string(typ)) {
		case "string":
			args = []string{"GET", k}
		case "hash":
			args = []string{"HGETALL", k}
		case "set":
			args = []string{"SMEMBERS", k}
		case "zset":
			args = []string{"ZRANGE", k, "0", "-1"}
		case "stream":
			args = []string{"XRANGE", k, "-", "+"}
		default:
			continue
		}
		out, err := exec.Command("redis-cli", append([]string{"-h", host, "-p", port}, args...)...).Output()
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "%s: %s\n", k, out)
	}
	return b.String(), nil
}

// redisKeys lists the keys matching pattern (KEYS, over RESP by hand).
func redisKeys(addr, pattern string) ([]string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(c, "*2\r\n$4\r\nKEYS\r\n$%d\r\n%s\r\n", len(pattern), pattern)
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "*") {
		return nil, fmt.Errorf("KEYS: %q %v", line, err)
	}
	var n int
	fmt.Sscanf(line, "*%d", &n)
	out := make([]string, 0, n)
	for range n {
		if _, err := br.ReadString('\n'); err != nil { // $len
			return nil, err
		}
		k, err := br.ReadString('\n')
		if err != nil {
			return nil, err
		}
		out = append(out, strings.TrimRight(k, "\r\n"))
	}
	return out, nil
}

// runNodeFleet runs testdata/node/mcp-fleet.mjs: the MCP SDK's client, one connection per
// request, through proxy.
func runNodeFleet(t *testing.T, modules, proxy, caFile, target string) string {
	t.Helper()
	cmd := exec.Command("node", "mcp-fleet.mjs", target)
	cmd.Dir = filepath.Dir(modules)
	cmd.Env = append(harness.Env(), "HTTPS_PROXY="+proxy, "NODE_EXTRA_CA_CERTS="+caFile, "NO_PROXY=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node mcp-fleet.mjs: %v\n%s", err, out)
	}
	return string(out)
}
