package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/capbroker/capbroker/internal/harness"
)

// peer is another proxy measured beside the broker, against the same upstream in the same run.
// scripts/install-bench-peers.sh installs them (`make bench` runs it first); a peer that is
// missing, fails to start or fails its check is skipped with the reason.
type peer struct {
	name    string
	like    string   // the broker path it compares with: intercept or tunnel
	version []string // the arguments that print its version
	// find returns the executable, or why the peer cannot be measured.
	find func() (string, error)
	// start runs the peer in dir, listening on loopback, trusting the upstream's CA.
	start func(bin, dir string, p *pki) (*process, *via, error)
}

var peerList = []peer{
	{name: "relay", like: "intercept", find: findRelay, start: startRelay},
	{name: "mitmproxy", like: "intercept", version: []string{"--version"}, find: findMitmdump, start: startMitmproxy},
	{name: "squid", like: "intercept", version: []string{"-v"}, find: findSquid, start: startSquid},
	{name: "smokescreen", like: "tunnel", version: []string{"--version"}, find: findSmokescreen, start: startSmokescreen},
}

// peerResult is a peer's entry in the summary.
type peerResult struct {
	Version      string `json:"version,omitempty"`
	ComparedWith string `json:"compared_with"` // the broker path
	Skipped      string `json:"skipped,omitempty"`
}

const installHint = "not installed (scripts/install-bench-peers.sh installs it)"

// startOnePeer starts the peer name alone (see startPeers), or says why it could not.
func startOnePeer(ctx context.Context, up *upstream, p *pki, name string) (*path, func(), error) {
	peers, results, stop := startPeers(ctx, up, p, []string{name})
	if len(peers) == 0 {
		stop()
		return nil, nil, fmt.Errorf("%s did not start: %s", name, results[name].Skipped)
	}
	return peers[0], stop, nil
}

// startPeers starts the named peers and checks each once through the path the bench measures.
// It returns a path for each peer that works, every peer's result, and a function stopping them.
func startPeers(ctx context.Context, up *upstream, p *pki, names []string) ([]*path, map[string]peerResult, func()) {
	var paths []*path
	var procs []*process
	results := map[string]peerResult{}
	// The peers get a directory of their own, outside the brokers' (which holds their CA keys):
	// squid started as root works as an unprivileged user that must reach its subdirectory.
	dir, dirErr := os.MkdirTemp("", "brokerbench-peers-")
	if dirErr == nil {
		dirErr = os.Chmod(dir, 0o711)
	}
	stop := func() {
		for _, pr := range procs {
			pr.stop()
		}
		if dir != "" {
			os.RemoveAll(dir)
		}
	}
	for _, pe := range peerList {
		r := peerResult{ComparedWith: pe.like}
		switch {
		case !slices.Contains(names, pe.name):
			r.Skipped = "not selected (-peers)"
		case dirErr != nil:
			r.Skipped = dirErr.Error()
		default:
			pa, proc, version, err := startPeer(ctx, pe, filepath.Join(dir, pe.name), up, p)
			r.Version = version
			if err != nil {
				r.Skipped = err.Error()
				break
			}
			fmt.Fprintf(stderr, "peer %s (%s): checked\n", pe.name, version)
			paths = append(paths, &pa)
			procs = append(procs, proc)
		}
		if r.Skipped != "" {
			fmt.Fprintf(stderr, "skipped: %s: %s\n", pe.name, r.Skipped)
		}
		results[pe.name] = r
	}
	return paths, results, stop
}

func startPeer(ctx context.Context, pe peer, dir string, up *upstream, p *pki) (path, *process, string, error) {
	bin, err := pe.find()
	if err != nil {
		return path{}, nil, "", err
	}
	version := "part of the bench, " + runtime.Version() // the relay
	if pe.version != nil {
		version = firstLine(bin, pe.version...)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return path{}, nil, version, err
	}
	proc, v, err := pe.start(bin, dir, p)
	if err != nil {
		return path{}, nil, version, fmt.Errorf("start: %w", err)
	}
	host := hostIntercept
	if pe.like == "tunnel" {
		host = hostTunnel
	}
	pa := path{name: pe.name, url: up.url(host, chatPath), via: v, proc: proc}
	pa.client = pa.withConns(p, 1)
	if err := pa.check(ctx); err != nil {
		out := lastLines(proc.output(), 5)
		proc.stop()
		return path{}, nil, version, fmt.Errorf("check: %w; output ends: %s", err, out)
	}
	if pe.like == "intercept" {
		if err := checkHeader(ctx, pa.client, up.url(host, headerPath)); err != nil {
			proc.stop()
			return path{}, nil, version, fmt.Errorf("check: %w", err)
		}
	}
	return pa, proc, version, nil
}

// checkHeader asks the upstream which X-Bench header it received: an intercepting peer adds one.
func checkHeader(ctx context.Context, c *http.Client, u string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(b) != "1" {
		return fmt.Errorf("the upstream did not receive the added header X-Bench: 1 (status %d, got %q)", resp.StatusCode, b)
	}
	return nil
}

// mitmAddon adds the header, as the broker adds a credential.
const mitmAddon = `def request(flow):
    flow.request.headers["X-Bench"] = "1"
`

func findMitmdump() (string, error) {
	bin, err := exec.LookPath("mitmdump")
	if err != nil {
		return "", errors.New("mitmdump " + installHint)
	}
	return bin, nil
}

// startMitmproxy runs mitmdump as an explicit proxy with its own CA in dir (generated at its
// first start), the header addon, and no flow output.
func startMitmproxy(bin, dir string, p *pki) (*process, *via, error) {
	addon := filepath.Join(dir, "xbench.py")
	if err := os.WriteFile(addon, []byte(mitmAddon), 0o644); err != nil {
		return nil, nil, err
	}
	addr, err := harness.FreeAddr()
	if err != nil {
		return nil, nil, err
	}
	host, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(bin, "-q", "--listen-host", host, "--listen-port", port, "-s", addon,
		"--set", "confdir="+dir, "--set", "ssl_verify_upstream_trusted_ca="+p.caFile)
	cmd.Env = harness.Env()
	proc, err := startServing(cmd, addr)
	if err != nil {
		return nil, nil, err
	}
	// mitmproxy writes its CA before it listens.
	roots, err := poolFromFile(filepath.Join(dir, "mitmproxy-ca-cert.pem"))
	if err != nil {
		proc.stop()
		return nil, nil, err
	}
	return proc, &via{addr: addr, roots: roots}, nil
}

// squidCertgen is where Debian and others install squid's certificate generator.
var squidCertgen = []string{"/usr/lib/squid/security_file_certgen", "/usr/lib64/squid/security_file_certgen", "/usr/libexec/squid/security_file_certgen"}

func findSquid() (string, error) {
	bin, err := exec.LookPath("squid")
	if err != nil {
		if _, err := os.Stat("/usr/sbin/squid"); err != nil {
			return "", errors.New("squid (squid-openssl) " + installHint)
		}
		bin = "/usr/sbin/squid"
	}
	out, _ := exec.Command(bin, "-v").CombinedOutput()
	if !strings.Contains(string(out), "--with-openssl") {
		return "", errors.New(bin + " is built without OpenSSL, so cannot bump TLS (install squid-openssl)")
	}
	return bin, nil
}

// startSquid runs squid in the foreground with ssl-bump: its own CA, certificates generated
// per host, every CONNECT bumped, the header added to every request, nothing cached. It stares
// at the client and the server and bumps last, so its certificates mimic the upstream's (Go
// clients send no SNI to an IP address, and squid's client-first certificates carry no IP SAN).
func startSquid(bin, dir string, p *pki) (*process, *via, error) {
	certgen := ""
	for _, c := range squidCertgen {
		if _, err := os.Stat(c); err == nil {
			certgen = c
			break
		}
	}
	if certgen == "" {
		return nil, nil, errors.New("security_file_certgen not found in " + strings.Join(squidCertgen, ", "))
	}
	ca, key, err := newCA("brokerbench squid CA")
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	caFile := filepath.Join(dir, "ca.pem")
	caPEM := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})...)
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		return nil, nil, err
	}
	upstreamCA := filepath.Join(dir, "upstream-ca.pem")
	if err := copyFile(p.caFile, upstreamCA); err != nil {
		return nil, nil, err
	}
	db := filepath.Join(dir, "ssl_db")
	if out, err := exec.Command(certgen, "-c", "-s", db, "-M", "4MB").CombinedOutput(); err != nil {
		return nil, nil, fmt.Errorf("%s -c: %v: %s", certgen, err, out)
	}
	addr, err := harness.FreeAddr()
	if err != nil {
		return nil, nil, err
	}
	conf := fmt.Sprintf(`http_port %s ssl-bump tls-cert=%s generate-host-certificates=on
sslcrtd_program %s -s %s -M 4MB
acl step3 at_step SslBump3
ssl_bump bump step3
ssl_bump stare all
tls_outgoing_options cafile=%s
request_header_add X-Bench 1 all
http_access allow localhost
http_access deny all
cache deny all
access_log stdio:%s
cache_log %s
pid_filename %s
coredump_dir %s
pinger_enable off
shutdown_lifetime 0 seconds
`, addr, caFile, certgen, db, upstreamCA, filepath.Join(dir, "access.log"), filepath.Join(dir, "cache.log"),
		filepath.Join(dir, "squid.pid"), dir)
	if os.Geteuid() == 0 {
		// Squid started as root works as an unprivileged user, which must own its files.
		name := "proxy" // Debian's squid user
		if _, err := user.Lookup(name); err != nil {
			name = "nobody"
		}
		if err := chownTree(dir, name); err != nil {
			return nil, nil, err
		}
		conf += "cache_effective_user " + name + "\n"
	}
	confFile := filepath.Join(dir, "squid.conf")
	if err := os.WriteFile(confFile, []byte(conf), 0o644); err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(bin, "-N", "-d", "1", "-f", confFile)
	cmd.Env = harness.Env()
	proc, err := startServing(cmd, addr)
	if err != nil {
		return nil, nil, err
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	return proc, &via{addr: addr, roots: roots}, nil
}

func chownTree(dir, name string) error {
	u, err := user.Lookup(name)
	if err != nil {
		return err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// findSmokescreen looks on PATH, then where `go install` puts it.
func findSmokescreen() (string, error) {
	if bin, err := exec.LookPath("smokescreen"); err == nil {
		return bin, nil
	}
	out, err := exec.Command("go", "env", "GOBIN", "GOPATH").Output()
	if err == nil {
		lines := strings.Split(string(out), "\n")
		dirs := []string{strings.TrimSpace(lines[0])}
		if len(lines) > 1 {
			dirs = append(dirs, filepath.Join(strings.Split(strings.TrimSpace(lines[1]), string(os.PathListSeparator))[0], "bin"))
		}
		for _, d := range dirs {
			bin := filepath.Join(d, "smokescreen")
			if d != "" && d != "bin" {
				if _, err := os.Stat(bin); err == nil {
					return bin, nil
				}
			}
		}
	}
	return "", errors.New("smokescreen " + installHint)
}

// startSmokescreen runs smokescreen, which only tunnels CONNECT to TLS upstreams, with
// loopback allowed (it refuses private and loopback ranges by default).
func startSmokescreen(bin, _ string, p *pki) (*process, *via, error) {
	addr, err := harness.FreeAddr()
	if err != nil {
		return nil, nil, err
	}
	host, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(bin, "--listen-ip", host, "--listen-port", port, "--allow-range", "127.0.0.0/8")
	cmd.Env = harness.Env()
	proc, err := startServing(cmd, addr)
	if err != nil {
		return nil, nil, err
	}
	return proc, &via{addr: addr, roots: p.pool}, nil
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o644)
}

func poolFromFile(name string) (*x509.CertPool, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, errors.New("no certificate in " + name)
	}
	return pool, nil
}

// firstLine is the first line bin prints for args: a version.
func firstLine(bin string, args ...string) string {
	out, _ := exec.Command(bin, args...).CombinedOutput()
	l, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(l)
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
