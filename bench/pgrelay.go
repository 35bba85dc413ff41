package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// pgRelay is the floor the Postgres front door is measured against: a TLS-terminating byte
// relay that reads nothing of the protocol (it answers the client's SSLRequest, makes its own
// TLS connection to the server, then copies bytes both ways). Authentication passes through
// it end to end, so the client must not bind the channel (channel_binding=disable). It runs
// in the bench's own process; cpu is that process's CPU time, which is the relay's while
// pgbench runs.
type pgRelay struct {
	ln net.Listener
	wg sync.WaitGroup
}

const sslRequestCode = 80877103

func startPGRelay(upstream, certFile, keyFile string) (*pgRelay, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	pem, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &pgRelay{ln: ln}
	server := &tls.Config{Certificates: []tls.Certificate{cert}}
	client := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				r.serve(c, upstream, server, client)
			}()
		}
	}()
	return r, nil
}

func (r *pgRelay) addr() string { return r.ln.Addr().String() }

func (r *pgRelay) stop() {
	_ = r.ln.Close()
	r.wg.Wait()
}

func (r *pgRelay) cpu() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (r *pgRelay) serve(c net.Conn, upstream string, server, client *tls.Config) {
	defer c.Close()
	if err := sslRequest(c); err != nil {
		return
	}
	if _, err := c.Write([]byte{'S'}); err != nil {
		return
	}
	up, err := net.Dial("tcp", upstream)
	if err != nil {
		return
	}
	defer up.Close()
	var req [8]byte
	binary.BigEndian.PutUint32(req[0:4], 8)
	binary.BigEndian.PutUint32(req[4:8], sslRequestCode)
	var ok [1]byte
	if _, err := up.Write(req[:]); err != nil {
		return
	}
	if _, err := io.ReadFull(up, ok[:]); err != nil || ok[0] != 'S' {
		return
	}
	agent, server2 := tls.Server(c, server), tls.Client(up, client)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(server2, agent); _ = server2.Close(); done <- struct{}{} }()
	go func() { _, _ = io.Copy(agent, server2); _ = agent.Close(); done <- struct{}{} }()
	<-done
	_ = c.Close()
	_ = up.Close()
	<-done
}

// sslRequest reads the client's SSLRequest.
func sslRequest(c net.Conn) error {
	var b [8]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return err
	}
	if binary.BigEndian.Uint32(b[0:4]) != 8 || binary.BigEndian.Uint32(b[4:8]) != sslRequestCode {
		return errors.New("not an SSLRequest")
	}
	return nil
}
