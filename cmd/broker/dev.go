package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/capbroker/capbroker/broker/certs"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/policies"
)

// devDir holds the dev CA and the dev agent's token, relative to the working directory.
const devDir = ".broker"

func cmdDev(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("dev", "dev [--listen ADDR] [--admin-listen ADDR] [--log-level LEVEL]", stderr)
	var sf serveFlags
	sf.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg := config.Dev()
	if err := sf.apply(cfg); err != nil {
		return err
	}
	if err := ensureDevCA(); err != nil {
		return err
	}
	token, err := ensureDevToken(filepath.Join(devDir, "dev-token"))
	if err != nil {
		return err
	}
	o := serveOptions{level: sf.logLevel, stdout: stdout, stderr: stderr}
	if st, err := os.Stat(cfg.Policy.Dir); err != nil || !st.IsDir() {
		o.policyFS = policies.FS // no ./policies: use the shipped copy
		cfg.Policy.Dir = "(embedded)"
	}
	caPath, err := filepath.Abs(cfg.CA.CertFile)
	if err != nil {
		return err
	}
	o.onListen = func(proxy, admin net.Addr) {
		printExports(stdout, cfg, token, proxy, admin, caPath, cfg.Policy.Dir)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return serve(ctx, cfg, o)
}

func ensureDevCA() error {
	_, errCrt := os.Stat(filepath.Join(devDir, "ca.crt"))
	_, errKey := os.Stat(filepath.Join(devDir, "ca.key"))
	switch {
	case errCrt == nil && errKey == nil:
		return nil
	case errors.Is(errCrt, fs.ErrNotExist) && errors.Is(errKey, fs.ErrNotExist):
		return certs.WriteCA(devDir, false)
	default:
		return fmt.Errorf("%s holds only half a CA (ca.crt or ca.key missing); remove it or run `broker ca init --out %s --force`", devDir, devDir)
	}
}

// ensureDevToken returns the dev agent's proxy password, creating it (0600) on first run.
func ensureDevToken(path string) (string, error) {
	if b, err := os.ReadFile(path); err == nil {
		if t := strings.TrimSpace(string(b)); t != "" {
			return t, nil
		}
	}
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	t := hex.EncodeToString(raw[:])
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	if err := os.WriteFile(path, []byte(t+"\n"), 0o600); err != nil {
		return "", err
	}
	return t, nil
}

// printExports prints what an agent shell needs to use the broker (agentEnv). NO_PROXY names
// the admin address's host (and the loopback names), so that `curl http://ADMIN/readyz` in
// that shell reaches the admin listener rather than the proxy, which refuses loopback
// destinations.
func printExports(w io.Writer, cfg *config.Config, token string, proxy, admin net.Addr, caPath, policyDir string) {
	fmt.Fprintf(w, "# capbroker dev: proxy %s, admin http://%s, policies %s\n# In the agent's shell (SDK keys are placeholders; the broker injects the real ones):\n",
		proxy, admin, policyDir)
	writeEnv(w, agentEnv(cfg, cfg.Agents[0], token, proxy.String(), admin, caPath), "sh")
	fmt.Fprintln(w, "# Audit events follow, one JSON line per decision.")
}

// noProxyHosts are the hosts an agent shell reaches directly: the admin listener's (127.0.0.1
// when it listens on every address), 127.0.0.1 and localhost.
func noProxyHosts(admin net.Addr) []string {
	hosts := []string{}
	if host, _, err := net.SplitHostPort(admin.String()); err == nil {
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			host = "127.0.0.1"
		}
		hosts = append(hosts, host)
	}
	for _, h := range []string{"127.0.0.1", "localhost"} {
		if !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	return hosts
}
