package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/capbroker/capbroker/internal/harness"
)

// The relay is the floor the intercepted path is measured against: about the least an
// intercepting proxy written in Go does per request. It answers CONNECT, terminates the
// client's TLS with one certificate, opens one verified TLS connection to the CONNECT host for
// the tunnel, and then, for each request, adds a header (as the other intercepting peers do),
// writes the request upstream and copies the response back, all on the tunnel's goroutine.
// No policy, no pool, no audit, no scrubbing, no timeouts, no limits: not a proxy to deploy.
// It is the bench binary itself, run with -relay, in a process of its own like the broker.

// startRelay runs the relay on a free loopback port; it writes its CA to dir.
func startRelay(bin, dir string, p *pki) (*process, *via, error) {
	addr, err := harness.FreeAddr()
	if err != nil {
		return nil, nil, err
	}
	caFile := filepath.Join(dir, "relay-ca.pem")
	cmd := exec.Command(bin, "-relay", addr, "-relay-ca", caFile, "-relay-upstream-ca", p.caFile)
	cmd.Env = harness.Env()
	proc, err := startServing(cmd, addr)
	if err != nil {
		return nil, nil, err
	}
	roots, err := poolFromFile(caFile)
	if err != nil {
		proc.stop()
		return nil, nil, err
	}
	return proc, &via{addr: addr, roots: roots}, nil
}

func findRelay() (string, error) { return os.Executable() }

// serveRelay is the relay's main: it writes the CA of the certificate it serves (see newPKI)
// to caFile, and trusts upstreamCA for the upstream.
func serveRelay(addr, caFile, upstreamCA string) error {
	p, err := newPKI("brokerbench relay CA", caFile, 0)
	if err != nil {
		return err
	}
	roots, err := poolFromFile(upstreamCA)
	if err != nil {
		return err
	}
	server := &tls.Config{Certificates: []tls.Certificate{p.leaf}, NextProtos: []string{"http/1.1"}}
	return serveEach(addr, func(c net.Conn) { relayTunnel(c, server, roots) })
}

// serveEach listens on addr and runs handle on a goroutine of its own for each connection it
// accepts, until accepting fails: the main of the bench's own servers (the relay, the
// CONNECT floor).
func serveEach(addr string, handle func(net.Conn)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go handle(c)
	}
}

func relayTunnel(c net.Conn, server *tls.Config, roots *x509.CertPool) {
	defer c.Close()
	connect, err := http.ReadRequest(bufio.NewReader(c))
	if err != nil || connect.Method != http.MethodConnect {
		return
	}
	host, _, _ := net.SplitHostPort(connect.Host)
	up, err := tls.Dial("tcp", connect.Host, &tls.Config{RootCAs: roots, ServerName: host, NextProtos: []string{"http/1.1"}})
	if err != nil {
		return
	}
	defer up.Close()
	if _, err := c.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		return
	}
	agent := tls.Server(c, server)
	ar, aw := bufio.NewReader(agent), bufio.NewWriter(agent)
	ur, uw := bufio.NewReader(up), bufio.NewWriter(up)
	for {
		req, err := http.ReadRequest(ar)
		if err != nil {
			return
		}
		req.Header.Set("X-Bench", "1")
		if req.Write(uw) != nil || uw.Flush() != nil {
			return
		}
		resp, err := http.ReadResponse(ur, req)
		if err != nil {
			return
		}
		err = resp.Write(aw)
		resp.Body.Close()
		if err != nil || aw.Flush() != nil {
			return
		}
	}
}
