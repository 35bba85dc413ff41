package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// cmdHealthcheck asks a running broker's admin endpoint whether it is ready (or, with
// --path /healthz, alive) and exits 0 or 1: the health check of an image with no shell and
// no curl (distroless), as a Docker HEALTHCHECK or a Kubernetes exec probe.
func cmdHealthcheck(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("healthcheck", "healthcheck [--admin ADDR] [--path /readyz|/healthz] [--url URL] [--timeout DUR]", stderr)
	admin := fs.String("admin", "127.0.0.1:9090", "the broker's admin address (admin.listen; 0.0.0.0 or :port mean loopback)")
	path := fs.String("path", "/readyz", "endpoint to ask: /readyz (ready to serve) or /healthz (process up)")
	rawURL := fs.String("url", "", "full URL to GET instead of --admin and --path")
	timeout := fs.Duration("timeout", 3*time.Second, "give up after this long")
	if err := parse(fs, args); err != nil {
		return err
	}
	u := *rawURL
	if u == "" {
		host, port, err := net.SplitHostPort(*admin)
		if err != nil {
			return fmt.Errorf("--admin %q: %w", *admin, err)
		}
		if host == "" || host == "0.0.0.0" || host == "::" {
			host = "127.0.0.1"
		}
		u = "http://" + net.JoinHostPort(host, port) + *path
	}
	if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		return fmt.Errorf("--url %q: want http://host:port/path", u)
	}
	// No proxy: the admin endpoint is local, and a proxy variable in the image (an agent's
	// HTTPS_PROXY pointing at this broker) must not route the check through the proxy.
	client := &http.Client{Timeout: *timeout, Transport: &http.Transport{Proxy: nil}}
	resp, err := client.Get(u)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	line := strings.TrimSpace(string(body))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: %s: %s %s", u, resp.Status, line)
	}
	fmt.Fprintf(stdout, "%s: %s %s\n", u, resp.Status, line)
	return nil
}
