package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/capbroker/capbroker/internal/harness"
	"github.com/capbroker/capbroker/policies"
)

// Loopback addresses the upstream listens on. Each is a distinct host name to the broker.
const (
	hostIntercept = "127.0.0.1" // intercepted; the llm concern in the full pipeline
	hostTunnel    = "127.0.0.2" // opaque CONNECT tunnel
	hostGit       = "127.0.0.3" // the git concern in the full pipeline (uploads)
	firstNewHost  = 10          // 127.0.0.10 onwards: hosts the broker has not seen

	chatPath   = "/v1/chat/completions" // every small request
	headerPath = "/bench/x-bench"       // answers with the request's X-Bench header
)

// pki is the upstream's private CA and its leaf, valid for every loopback host used.
type pki struct {
	caFile string
	pool   *x509.CertPool
	leaf   tls.Certificate
}

// newPKI makes a CA named name, writes its certificate to caFile, and issues it a leaf for
// 127.0.0.1 up to the last new host.
func newPKI(name, caFile string, hosts int) (*pki, error) {
	ca, caKey, err := newCA(name)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	ips := []net.IP{}
	for i := 1; i < firstNewHost+hosts; i++ {
		ips = append(ips, net.IPv4(127, 0, 0, byte(i)))
	}
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leafTmpl := &x509.Certificate{
		// Squid 5 matches an IP address against the common name, not the IP SANs.
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: hostIntercept},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: ips, DNSNames: []string{transparentHost}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &leafKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	p := &pki{caFile: caFile, pool: x509.NewCertPool(),
		leaf: tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: leafKey}}
	p.pool.AddCert(ca)
	return p, os.WriteFile(p.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}), 0o644)
}

// newCA makes a self-signed CA valid for a day.
func newCA(name string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	return ca, key, err
}

// upstream is one HTTPS server listening on the same port of several loopback addresses.
type upstream struct {
	port int
	srv  *http.Server
	lns  []net.Listener
	h2   *upstream // the same handler offering h2 (startH2), or nil
	// h2Requests counts the requests that reached h2 over HTTP/2.
	h2Requests atomic.Int64
}

// smallBody is the response to every small request: about the size of a short API answer.
var smallBody = []byte(`{"id":"chatcmpl-bench","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}`)

const (
	sseEvents   = 20
	sseInterval = 50 * time.Millisecond
	bigSize     = 256 << 20
)

func startUpstream(p *pki, hosts int) (*upstream, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(smallBody)))
		_, _ = w.Write(smallBody)
	})
	// headerPath shows whether an intercepting peer added its header on the way.
	mux.HandleFunc(headerPath, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, r.Header.Get("X-Bench"))
	})
	// /v1/models/sse sends events carrying their send time, sseInterval apart.
	mux.HandleFunc("/v1/models/sse", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for i := 0; i < sseEvents; i++ {
			fmt.Fprintf(w, "data: %d\n\n", time.Now().UnixNano())
			f.Flush()
			time.Sleep(sseInterval)
		}
	})
	mux.HandleFunc("/v1/models/download", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(bigSize))
		buf := make([]byte, 64<<10)
		for i := range buf {
			buf[i] = 'a' + byte(i%26)
		}
		for n := 0; n < bigSize; n += len(buf) {
			if _, err := w.Write(buf); err != nil {
				return
			}
		}
	})
	u := &upstream{srv: &http.Server{Handler: mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{p.leaf}},
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){}}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u.port = ln.Addr().(*net.TCPAddr).Port
	u.lns = append(u.lns, ln)
	for i := 2; i < firstNewHost+hosts; i++ {
		if i > 3 && i < firstNewHost {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.%d:%d", i, u.port))
		if err != nil {
			u.close()
			return nil, fmt.Errorf("upstream on 127.0.0.%d: %w", i, err)
		}
		u.lns = append(u.lns, l)
	}
	for _, l := range u.lns {
		go func() { _ = u.srv.Serve(tls.NewListener(l, u.srv.TLSConfig)) }()
	}
	return u, nil
}

func (u *upstream) close() {
	_ = u.srv.Close()
	if u.h2 != nil {
		u.h2.close()
	}
}

func (u *upstream) url(host, path string) string {
	return fmt.Sprintf("https://%s:%d%s", host, u.port, path)
}

// broker is a running broker binary.
type broker struct {
	*process
	proxyAddr string
	caPool    *x509.CertPool
	token     string
	auditFile string
}

const (
	agentID = "bench-agent"
	secret  = "sk-bench-0123456789abcdef0123456789abcdef"
)

// allowAllPolicy allows everything, intercepting every tunnel but the opaque one.
const allowAllPolicy = `package broker

decision := {"allow": true, "intercept": input.request.host != "` + hostTunnel + `"}
`

// writeAllowAll writes the bare policy.
func writeAllowAll(dir string) error {
	return os.WriteFile(filepath.Join(dir, "broker.rego"), []byte(allowAllPolicy), 0o644)
}

// writeShipped writes the shipped policies (policies/), with the bench upstream added as one
// LLM API (127.0.0.1, credential openai) and one git host (127.0.0.3), on the upstreams'
// ports (Rego set members).
func writeShipped(dir string, ports string) error {
	return fs.WalkDir(policies.FS, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(name, "_test.rego") {
			return err
		}
		b, err := fs.ReadFile(policies.FS, name)
		if err != nil {
			return err
		}
		s := string(b)
		switch name {
		case "broker.rego":
			old := "input.request.port == 443"
			if !strings.Contains(s, old) {
				return errors.New("policies/broker.rego no longer has " + old)
			}
			s = strings.Replace(s, old, "input.request.port in {"+ports+"}", 1)
		case "data.yaml":
			for _, kv := range [][2]string{
				{"  git:\n", "  git:\n    " + hostGit + ": true\n"},
				{"  llm:\n", "  llm:\n    " + hostIntercept + ":\n      credential: openai\n      endpoints: [/v1/chat/completions]\n      models: [gpt-4.1*]\n      read_paths: [/v1/models]\n"},
			} {
				if !strings.Contains(s, kv[0]) {
					return errors.New("policies/data.yaml no longer has " + strings.TrimSpace(kv[0]))
				}
				s = strings.Replace(s, kv[0], kv[1], 1)
			}
		}
		return os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644)
	})
}

// proxyLimits are the proxy limits of the brokers started; a curve that holds more
// connections or requests raises them for its own brokers (see withLimits).
var proxyLimits = "max_connections_per_agent: 1024"

// startBroker initialises a CA, writes the config and starts `broker run`. full selects the
// realistic pipeline: shipped policy, a credential for the upstream, audit to a file.
func startBroker(bin, dir string, up *upstream, p *pki, full bool) (*broker, error) {
	return startBrokerWith(bin, dir, up, p, full, "", "")
}

// startBrokerWith is startBroker with agentYAML added to the agent's entry in the config and
// topYAML to its top level; a topYAML that starts with "upstream:" is merged into the
// upstream section instead.
func startBrokerWith(bin, dir string, up *upstream, p *pki, full bool, agentYAML, topYAML string) (*broker, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if out, err := exec.Command(bin, "ca", "init", "--out", filepath.Join(dir, "ca")).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ca init: %v: %s", err, out)
	}
	polDir := filepath.Join(dir, "policies")
	if err := os.MkdirAll(polDir, 0o755); err != nil {
		return nil, err
	}
	b := &broker{token: "bench-token"}
	cfg := fmt.Sprintf(`proxy: {listen: "127.0.0.1:0", %s}
admin: {listen: "127.0.0.1:0", token_env: BENCH_ADMIN_TOKEN}
ca: {cert_file: %q, key_file: %q}
policy: {dir: %q, mode: enforce}
upstream:
  ca_file: %q
  allow_private: ["127.0.0.0/8"]
agents:
  - id: %s
    token_env: BENCH_AGENT_TOKEN
`, proxyLimits, filepath.Join(dir, "ca", "ca.crt"), filepath.Join(dir, "ca", "ca.key"), polDir, p.caFile, agentID)
	if rest, ok := strings.CutPrefix(topYAML, "upstream:\n"); ok {
		cfg, topYAML = strings.Replace(cfg, "upstream:\n", "upstream:\n"+rest, 1), ""
	}
	cfg += agentYAML
	if full {
		if err := writeShipped(polDir, up.policyPorts()); err != nil {
			return nil, err
		}
		// Not beside broker.yaml: the config watcher watches that directory, and would wake
		// on every audit write (as it would in a deployment that put them together).
		if err := os.MkdirAll(filepath.Join(dir, "log"), 0o755); err != nil {
			return nil, err
		}
		b.auditFile = filepath.Join(dir, "log", "audit.log")
		cfg += fmt.Sprintf(`    labels: {team: bench}
credentials:
  - name: openai
    hosts: [%q, %q]
    source: {env: BENCH_SECRET}
    inject: {header: Authorization, value: "Bearer {{secret}}"}
audit: {file: %q}
`, hostIntercept, hostGit, b.auditFile)
	} else if err := writeAllowAll(polDir); err != nil {
		return nil, err
	}
	cfg += topYAML
	cfgFile := filepath.Join(dir, "broker.yaml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	// The admin API takes a token: in transparent mode, with its listener and agent on
	// loopback, the broker refuses to start without one (an agent there could approve).
	if err := b.run(bin, cfgFile, "BENCH_AGENT_TOKEN="+b.token, "BENCH_SECRET="+secret, "BENCH_ADMIN_TOKEN="+rand.Text()); err != nil {
		return nil, err
	}
	pool, err := poolFromFile(filepath.Join(dir, "ca", "ca.crt"))
	if err != nil {
		b.stop()
		return nil, err
	}
	b.caPool = pool
	return b, nil
}

// intercepting is the broker as a proxy the client trusts to intercept.
func (b *broker) intercepting() *via {
	return &via{addr: b.proxyAddr, user: url.UserPassword(agentID, b.token), roots: b.caPool}
}

// tunnelling is the broker as a proxy the client trusts only to pass TLS through.
func (b *broker) tunnelling(p *pki) *via {
	return &via{addr: b.proxyAddr, user: url.UserPassword(agentID, b.token), roots: p.pool}
}

// run starts the broker on cfgFile with env added to the bench's environment, its audit
// events to /dev/null, and waits until it says it is listening (b.proxyAddr).
func (b *broker) run(bin, cfgFile string, env ...string) error {
	cmd := exec.Command(bin, "run", "--config", cfgFile)
	cmd.Env = append(harness.Env(), env...)
	// The broker's audit events go to /dev/null as a file: through a pipe, reading them
	// would cost the bench process (the clients and the upstream) CPU.
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer devNull.Close() // the child has its own copy
	cmd.Stdout = devNull
	listening := make(chan string, 1)
	proc, err := startProcess(cmd, func(line string) {
		if strings.Contains(line, `"message":"listening"`) {
			listening <- line
		}
	})
	if err != nil {
		return err
	}
	b.process = proc
	select {
	case line := <-listening:
		var l struct{ Proxy string }
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			b.stop()
			return err
		}
		b.proxyAddr = l.Proxy
		return nil
	case <-b.exited:
		return fmt.Errorf("broker exited at start: %s", b.output())
	case <-time.After(30 * time.Second):
		b.stop()
		return errors.New("broker did not start listening within 30s")
	}
}
