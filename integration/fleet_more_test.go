package integration

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	vaultapi "github.com/hashicorp/vault/api"

	"github.com/capbroker/capbroker/credentials/vaulttest"
	"github.com/capbroker/capbroker/internal/harness"
)

// fleetAlwaysPolicy: /always/ asks a person, who may answer "once" or "always".
const fleetAlwaysPolicy = `package broker

decision := {"ask": {"reason": "a first time needs a person", "timeout": "1m", "scopes": ["once", "always"]}} if {
	input.phase == "request"
	startswith(input.request.path, "/always/")
}
`

// fleetMoreRate is fleet.agent_requests_per_second in TestFleetMore.
const fleetMoreRate = 5

// reconfigure rewrites every replica's config with edit and restarts the replicas one by
// one, each back in haproxy before the next: a rollout of a new config.
func (r *fleetRig) reconfigure(env []string, edit func(string) string) {
	r.t.Helper()
	r.env = append(r.env, env...)
	for _, rp := range r.replicas {
		b, err := os.ReadFile(rp.cfgFile)
		if err != nil {
			r.t.Fatal(err)
		}
		cfg := edit(string(b))
		if cfg == string(b) {
			r.t.Fatalf("%s: the edit changed nothing", rp.name)
		}
		if err := os.WriteFile(rp.cfgFile, []byte(cfg), 0o600); err != nil {
			r.t.Fatal(err)
		}
		if err := rp.proc.stop(r.t); err != nil {
			r.t.Fatalf("%s: %v", rp.name, err)
		}
		r.start(rp)
		r.waitLB(rp, "UP")
	}
}

// TestFleetMore: behind haproxy, an "always" approval given on one replica's console for a
// request another holds is kept in Redis, not in the (read-only in Kubernetes) policy
// directory, and lets the request through every replica; Redis down, "always" is refused
// and the request stays held for another answer. The per-agent request rate is capped
// across the three replicas, not per replica.
func TestFleetMore(t *testing.T) {
	pki := newUpstreamPKI(t)
	up := &countingUpstream{seen: map[string]int{}, arrived: make(chan string, 16), release: make(chan struct{})}
	upSrv := pki.serve(t, up, false, nil)
	r := newFleetRig(t, pki.File, map[string]string{"always.rego": fleetAlwaysPolicy}, "")
	r.reconfigure(nil, func(cfg string) string {
		return strings.Replace(cfg, "agent_connections: 12}", fmt.Sprintf("agent_connections: 12, agent_requests_per_second: %d}", fleetMoreRate), 1)
	})
	get := func(t *testing.T, c *http.Client, path string) (int, string) {
		t.Helper()
		resp, err := c.Get(upSrv.URL + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	// holdOn sends path as agent through replica rp in the background, and returns the held
	// request as rp's API lists it, and the agent's answer to come.
	holdOn := func(rp *fleetReplica, agent, path string) (map[string]any, chan string) {
		t.Helper()
		got := make(chan string, 1)
		go func() {
			resp, err := r.clientVia(rp.listen, agent).Get(upSrv.URL + path)
			if err != nil {
				got <- err.Error()
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got <- fmt.Sprintf("%d %s", resp.StatusCode, body)
		}()
		return r.waitHeld(rp, path), got
	}
	holder, decider := r.replicas[0], r.replicas[1]

	var grantID string
	t.Run("always approval decided on another replica holds on every replica", func(t *testing.T) {
		held, got := holdOn(holder, "fleet-a", "/always/x/1")
		if held["instance"] != nil && held["instance"] != holder.name {
			t.Fatalf("held on %v, sent through %s", held["instance"], holder.name)
		}
		res := r.admin(decider).approve(held["id"].(string), `{"scope": "always", "method": "*", "path_prefix": "/always/x/"}`)
		g, _ := res["grant"].(map[string]any)
		if g == nil || g["kind"] != "always" || g["expires"] != nil {
			t.Fatalf("approving always from %s: %v", decider.name, res)
		}
		grantID = g["id"].(string)
		if a := <-got; !strings.HasPrefix(a, "200 ") {
			t.Fatalf("the held request, approved always: %s", a)
		}
		// Not written to the policy directory every replica mounts (a ConfigMap, read-only):
		// kept in the fleet's grants hash.
		if _, err := os.Stat(filepath.Join(r.policyDir, "approved.json")); !os.IsNotExist(err) {
			t.Fatalf("approved.json in the shared policy directory: %v", err)
		}
		dump, err := redisDump(r.redis.Addr)
		if err != nil || !strings.Contains(dump, "fleet:grants: ") || !strings.Contains(dump, grantID) {
			t.Fatalf("the always grant is not in fleet:grants: %v\n%s", err, dump)
		}
		for _, rp := range r.replicas {
			path := "/always/x/" + rp.name
			if code, body := get(t, r.clientVia(rp.listen, "fleet-a"), path); code != 200 || up.count(path) != 1 {
				t.Fatalf("through %s after the always approval: %d %s", rp.name, code, body)
			}
			rp.proc.waitAuditWhere(t, 1, "the grant answering the ask", func(ev auditEvent) bool {
				ap, _ := ev["approval"].(map[string]any)
				return ev["path"] == path && ap != nil && ap["outcome"] == "granted" && ap["scope"] == "always" && ap["grant"] == grantID
			})
		}
		// Every console lists it as a grant.
		for _, rp := range r.replicas {
			if _, list := r.admin(rp).call("GET", "/api/grants", "", nil); !strings.Contains(fmt.Sprint(list), grantID) {
				t.Fatalf("%s does not list the always grant: %v", rp.name, list)
			}
		}
	})

	t.Run("an always grant covers only its agent, until revoked anywhere", func(t *testing.T) {
		if grantID == "" {
			t.Skip("no grant")
		}
		held, got := holdOn(decider, "fleet-b", "/always/x/other-agent")
		if code, _ := r.admin(holder).call("POST", "/api/approvals/"+held["id"].(string)+"/deny", "{}", nil); code != 200 {
			t.Fatalf("deny: %d", code)
		}
		if a := <-got; !strings.HasPrefix(a, "403 ") || up.count("/always/x/other-agent") != 0 {
			t.Fatalf("another agent's request, denied: %s", a)
		}
		if code, out := r.admin(r.replicas[2]).call("DELETE", "/api/grants/"+grantID, "", nil); code != 200 && code != 204 {
			t.Fatalf("revoke on %s: %d %v", r.replicas[2].name, code, out)
		}
		held, got = holdOn(holder, "fleet-a", "/always/x/revoked")
		if code, _ := r.admin(holder).call("POST", "/api/approvals/"+held["id"].(string)+"/deny", "{}", nil); code != 200 {
			t.Fatalf("deny: %d", code)
		}
		if a := <-got; !strings.HasPrefix(a, "403 ") {
			t.Fatalf("after the revoke: %s", a)
		}
	})

	t.Run("request rate capped across the fleet", func(t *testing.T) {
		// Six keep-alive connections of fleet-c, two on each replica (haproxy's round robin),
		// each asking every 200ms: 30 requests a second, 10 per replica. A cap counted per
		// replica would let 3 x 5 through each second; the fleet's lets 5 through, plus what
		// the others admit before a replica sees their counts (100ms).
		const workers, every, run = 6, 200 * time.Millisecond, 3200 * time.Millisecond
		type result struct {
			second int64
			code   int
			body   string
		}
		var mu sync.Mutex
		var results []result
		var wg sync.WaitGroup
		start := time.Now()
		for range workers {
			c := r.client("fleet-c")
			c.Transport.(*http.Transport).DisableKeepAlives = false
			if code, _ := get(t, c, "/open/rate/warm"); code != 200 && code != 429 {
				t.Fatalf("warm-up: %d", code)
			}
			wg.Go(func() {
				defer c.CloseIdleConnections()
				tick := time.NewTicker(every) // the load's pace, not a synchronisation
				defer tick.Stop()
				for i := 0; time.Since(start) < run; i++ {
					sent := time.Now().Unix()
					resp, err := c.Get(fmt.Sprintf("%s/open/rate/%d", upSrv.URL, i))
					res := result{second: sent}
					if err != nil {
						res.body = err.Error()
					} else {
						b, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						res.code, res.body = resp.StatusCode, string(b)
					}
					mu.Lock()
					results = append(results, res)
					mu.Unlock()
					<-tick.C
				}
			})
		}
		wg.Wait()
		admitted, refused := map[int64]int{}, 0
		for _, res := range results {
			switch {
			case res.code == 200:
				admitted[res.second]++
			case res.code == 429 && strings.Contains(res.body, `"too_many_requests"`):
				refused++
			default:
				t.Fatalf("a request answered %d %q", res.code, res.body)
			}
		}
		first, last := start.Unix(), time.Now().Unix()
		full := 0
		for s := first + 1; s < last; s++ { // whole seconds only
			full++
			if n := admitted[s]; n > fleetMoreRate+6 || n == 0 {
				t.Errorf("second %d: %d requests of fleet-c let through by the fleet, cap %d (per-replica caps: %d)", s-first, n, fleetMoreRate, 3*fleetMoreRate)
			}
		}
		t.Logf("%d requests, %d refused; admitted per second %v", len(results), refused, admitted)
		if full < 2 || refused == 0 {
			t.Fatalf("%d whole seconds, %d refused: the cap was not exercised", full, refused)
		}
		// Every replica refused some: each applies the fleet's count, not its own.
		for _, rp := range r.replicas {
			rp.proc.waitAuditWhere(t, 1, "a request refused by the fleet's rate cap", func(ev auditEvent) bool {
				return ev["status"] == float64(429) && strings.Contains(fmt.Sprint(ev), "fleet-c")
			})
		}
	})

	t.Run("Redis down: always refused, the request stays held, caps fail closed", func(t *testing.T) {
		held, got := holdOn(holder, "fleet-a", "/always/y/1")
		kept := r.clientVia(holder.listen, "fleet-b") // a connection open before
		kept.Transport.(*http.Transport).DisableKeepAlives = false
		defer kept.CloseIdleConnections()
		if code, body := get(t, kept, "/open/rate/before"); code != 200 {
			t.Fatalf("before: %d %s", code, body)
		}
		r.redis.Stop()
		t.Cleanup(r.redis.Restart)
		code, out := r.admin(holder).call("POST", "/api/approvals/"+held["id"].(string)+"/approve", `{"scope": "always"}`, nil)
		if code == 200 || !strings.Contains(fmt.Sprint(out), "grants store") {
			t.Fatalf("always with Redis down: %d %v", code, out)
		}
		if !r.isHeld(holder, "/always/y/1") {
			t.Fatal("the request was dropped by a failed always approval")
		}
		r.admin(holder).approve(held["id"].(string), `{"scope": "once"}`)
		if a := <-got; !strings.HasPrefix(a, "200 ") {
			t.Fatalf("approved once with Redis down: %s", a)
		}
		// fail_closed (the default): once the last sync is over a second old, an agent's
		// requests and new connections are refused, as the store's fault, rather than
		// counted by each replica alone.
		deadline := time.Now().Add(waitTimeout)
		for {
			code, body := get(t, kept, "/open/rate/redis-down")
			if code == 503 && strings.Contains(body, `"fleet_store_unavailable"`) {
				break
			}
			if code != 200 || time.Now().After(deadline) {
				t.Fatalf("with Redis down, fleet-b gets %d %s", code, body)
			}
			time.Sleep(100 * time.Millisecond) // polling until the last sync is stale
		}
		code, body := fleetConnect(t, holder.listen, "fleet-b", r.tokens["fleet-b"], strings.TrimPrefix(upSrv.URL, "https://"))
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "fleet_store_unavailable") {
			t.Fatalf("a new connection of fleet-b with Redis down: %d %s", code, body)
		}
	})
}

// fleetVaultPKITTL is the life of each replica's intermediate in TestFleetVaultPKI: the
// shortest allowed, renewed at half life, signing until a tenth of it is left.
const fleetVaultPKITTL = 10 * time.Second

// TestFleetVaultPKI: three replicas behind haproxy, each with ca.vault_pki and its own
// intermediate from one Vault PKI; an agent trusting only the Vault root gets through each.
// With Vault down past the intermediates' life every replica refuses interception
// (ca_unavailable), its /readyz says so, and haproxy takes it out of the Service.
func TestFleetVaultPKI(t *testing.T) {
	haproxyBin(t)
	vault := vaulttest.Start(t)
	vc := vault.Client()
	if err := vc.Sys().Mount("pki", &vaultapi.MountInput{Type: "pki", Config: vaultapi.MountConfigInput{MaxLeaseTTL: "87600h"}}); err != nil {
		t.Fatal(err)
	}
	root, err := vc.Logical().Write("pki/root/generate/internal", map[string]any{"common_name": "capbroker-fleet2 root", "ttl": "87600h", "key_type": "ec"})
	if err != nil {
		t.Fatal(err)
	}
	rootPEM := root.Data["certificate"].(string)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(rootPEM))
	rootFile := filepath.Join(t.TempDir(), "vault-root.pem")
	if err := os.WriteFile(rootFile, []byte(rootPEM), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := vc.Sys().PutPolicy("capbroker-fleet2", `path "pki/root/sign-intermediate" { capabilities = ["update"] }`); err != nil {
		t.Fatal(err)
	}
	tok, err := vc.Auth().Token().Create(&vaultapi.TokenCreateRequest{Policies: []string{"capbroker-fleet2"}, TTL: "1h"})
	if err != nil {
		t.Fatal(err)
	}

	pki := newUpstreamPKI(t)
	up := &countingUpstream{seen: map[string]int{}, arrived: make(chan string, 16), release: make(chan struct{})}
	upSrv := pki.serve(t, up, false, nil)
	r := newFleetRig(t, pki.File, map[string]string{}, "")
	caLine := fmt.Sprintf("ca: {cert_file: %q, key_file: %q}\n", r.caFile, filepath.Join(r.dir, "ca", "ca.key"))
	r.reconfigure([]string{"BROKER_VAULT_TOKEN=" + tok.Auth.ClientToken}, func(cfg string) string {
		cfg = strings.Replace(cfg, caLine, fmt.Sprintf("ca: {vault_pki: {mount: pki, ttl: %s, common_name: capbroker-fleet2}}\n", fleetVaultPKITTL), 1)
		return cfg + fmt.Sprintf("vault:\n  address: %s\n  auth: {method: token, token_env: BROKER_VAULT_TOKEN}\n", vault.Addr)
	})
	if err := os.RemoveAll(filepath.Join(r.dir, "ca")); err != nil { // no CA key on disk at all
		t.Fatal(err)
	}
	serials := map[string]string{}
	for _, rp := range r.replicas {
		ready := waitVaultPKI(t, rp.proc, 10*time.Second, "the first intermediate", func(v vaultPKIReady) bool { return v.CA.Renewals >= 1 })
		if ready.CA.Source != "vault_pki" {
			t.Fatalf("%s: /readyz %+v", rp.name, ready)
		}
		serials[rp.name] = ready.CA.Serial
	}

	t.Run("an agent trusting only the Vault root gets through each replica", func(t *testing.T) {
		seen := map[string]bool{}
		for _, rp := range r.replicas {
			pu, _ := url.Parse(fmt.Sprintf("http://fleet-a:%s@%s", r.tokens["fleet-a"], rp.listen))
			c := &http.Client{Timeout: waitTimeout, Transport: &http.Transport{Proxy: http.ProxyURL(pu), DisableKeepAlives: true,
				TLSClientConfig: &tls.Config{RootCAs: roots}}}
			resp, err := c.Get(upSrv.URL + "/open/vault/" + rp.name)
			if err != nil {
				t.Fatalf("through %s, trusting only the Vault root: %v", rp.name, err)
			}
			resp.Body.Close()
			chain := resp.TLS.PeerCertificates
			if resp.StatusCode != 200 || len(chain) != 2 {
				t.Fatalf("through %s: %d, chain of %d", rp.name, resp.StatusCode, len(chain))
			}
			// Served under the replica's own intermediate, the one its /readyz names.
			if got := hex.EncodeToString(chain[1].SerialNumber.Bytes()); got != serials[rp.name] {
				t.Fatalf("%s's leaf signed by %s, its /readyz names %s", rp.name, got, serials[rp.name])
			}
			seen[serials[rp.name]] = true
		}
		if len(seen) != 3 {
			t.Fatalf("the three replicas share intermediates: %v", serials)
		}
		// curl through the Service: whichever replica answers, it verifies.
		for i := range 3 {
			c := exec.Command("curl", "-sS", "--max-time", "20", "-o", "/dev/null", "-w", "%{http_code}", fmt.Sprintf("%s/open/vault/curl-%d", upSrv.URL, i))
			c.Env = append(harness.Env(), fmt.Sprintf("HTTPS_PROXY=http://fleet-a:%s@%s", r.tokens["fleet-a"], r.lb), "CURL_CA_BUNDLE="+rootFile, "NO_PROXY=")
			if out, err := c.CombinedOutput(); err != nil || string(out) != "200" {
				t.Fatalf("curl through the Service: %v %q", err, out)
			}
		}
	})

	t.Run("Vault down past the intermediates' life", func(t *testing.T) {
		vault.Stop()
		for _, rp := range r.replicas {
			down := waitVaultPKI(t, rp.proc, 2*fleetVaultPKITTL, "the CA unavailable", func(v vaultPKIReady) bool { return v.code == http.StatusServiceUnavailable })
			if down.CA.Error == "" || down.CA.RenewError == "" || down.Status != "not ready" {
				t.Fatalf("%s: /readyz with the intermediate lapsed: %+v", rp.name, down)
			}
			r.waitLB(rp, "DOWN")
			code, body := fleetConnect(t, rp.listen, "fleet-a", r.tokens["fleet-a"], strings.TrimPrefix(upSrv.URL, "https://"))
			if code != http.StatusServiceUnavailable || !strings.Contains(body, "ca_unavailable") {
				t.Fatalf("%s: CONNECT with the CA lapsed: %d %s", rp.name, code, body)
			}
		}
		if strings.Contains(fmt.Sprint(r.replicas[0].proc.logs.String(), r.replicas[0].proc.auditLog.String()), tok.Auth.ClientToken) {
			t.Fatal("the Vault token is in a replica's log or audit")
		}
	})
}

// fleetConnect sends a CONNECT for hostPort to a replica's proxy listener as agent, and
// returns the status and the body.
func fleetConnect(t *testing.T, proxy, agent, token, hostPort string) (int, string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", proxy, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(waitTimeout))
	auth := base64.StdEncoding.EncodeToString([]byte(agent + ":" + token))
	fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", hostPort, hostPort, auth)
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode == http.StatusOK {
		return resp.StatusCode, ""
	}
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
