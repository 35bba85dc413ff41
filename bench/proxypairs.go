package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"

	"github.com/capbroker/capbroker/internal/harness"
)

// proxyPairs is -only proxy-pairs: the cost of chaining through a corporate proxy (issue 35),
// in pairs of adjacent slices at conns connections. A plain forwarding squid (no bump, no
// auth, nothing cached) is the corporate proxy; the full pipeline chained through it is
// measured against the full pipeline direct, and the opaque tunnel chained through it against
// an agent using squid alone as its proxy.
func proxyPairs(ctx context.Context, bin, dir string, up *upstream, p *pki, full, tunnel *path, o options) error {
	sq, addr, err := startForwardSquid(filepath.Join(dir, "corp-squid"))
	if err != nil {
		return err
	}
	defer sq.stop()
	chain := "upstream:\n  proxy:\n    proxies:\n      - {name: corp, url: \"http://" + addr + "\"}\n"
	fullChained, err := startBrokerWith(bin, filepath.Join(dir, "full-chained"), up, p, true, "", chain)
	if err != nil {
		return err
	}
	defer fullChained.stop()
	bareChained, err := startBrokerWith(bin, filepath.Join(dir, "bare-chained"), up, p, false, "", chain)
	if err != nil {
		return err
	}
	defer bareChained.stop()
	viaSquid := &path{name: "full-via-squid", url: full.url, via: fullChained.intercepting(), proc: fullChained.process}
	tunnelViaSquid := &path{name: "tunnel-via-squid", url: tunnel.url, via: bareChained.tunnelling(p), proc: bareChained.process}
	squidAlone := &path{name: "squid-alone", url: tunnel.url, via: &via{addr: addr, roots: p.pool}, proc: sq}
	for _, pa := range []*path{full, viaSquid, tunnelViaSquid, squidAlone} {
		pa.client = pa.withConns(p, o.conns)
		if err := pa.check(ctx); err != nil {
			return fmt.Errorf("%s: %w", pa.name, err)
		}
	}
	fmt.Fprintln(os.Stderr, "full pipeline through squid over direct, and tunnel through squid over squid alone, paired...")
	pairedRatio(ctx, viaSquid, full, o.conns, max(o.pairs, 1), o.slice).print(os.Stdout, "full via squid/full direct")
	pairedRatio(ctx, tunnelViaSquid, squidAlone, o.conns, max(o.pairs, 1), o.slice).print(os.Stdout, "tunnel via squid/squid alone")
	return nil
}

// startForwardSquid runs squid as a plain forwarding proxy on a free loopback port: CONNECT
// and absolute-form requests from loopback, nothing cached, no access log.
func startForwardSquid(dir string) (*process, string, error) {
	bin, err := findSquid()
	if err != nil {
		return nil, "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	addr, err := harness.FreeAddr()
	if err != nil {
		return nil, "", err
	}
	conf := fmt.Sprintf(`http_port %s
http_access allow localhost
http_access deny all
cache deny all
access_log none
cache_log %s
pid_filename %s
coredump_dir %s
pinger_enable off
shutdown_lifetime 0 seconds
`, addr, filepath.Join(dir, "cache.log"), filepath.Join(dir, "squid.pid"), dir)
	if os.Geteuid() == 0 {
		name := "proxy" // Debian's squid user
		if _, err := user.Lookup(name); err != nil {
			name = "nobody"
		}
		if err := chownTree(dir, name); err != nil {
			return nil, "", err
		}
		conf += "cache_effective_user " + name + "\n"
	}
	confFile := filepath.Join(dir, "squid.conf")
	if err := os.WriteFile(confFile, []byte(conf), 0o644); err != nil {
		return nil, "", err
	}
	cmd := exec.Command(bin, "-N", "-d", "1", "-f", confFile)
	cmd.Env = harness.Env()
	proc, err := startServing(cmd, addr)
	return proc, addr, err
}
