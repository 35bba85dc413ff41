package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"time"

	"github.com/capbroker/capbroker/internal/harness"
)

// The CONNECT floor is what the broker's CONNECT is measured against: about the least a Go
// program answering a CONNECT does, on the same kernel and runtime, in a process of its own.
// It accepts the connection on a goroutine of its own, reads until the end of the head (no
// parsing, no authentication, no decision, no audit), writes the 200 and then reads the tunnel
// until the client closes, as the broker's tunnel does, and closes. Accepting, the reads, the
// write, the close, the goroutine and the network poller are the kernel's and the runtime's
// and cost it what they cost the broker; what the broker spends beyond it is its own. The
// machine's load moves both alike, so the ratio of adjacent batches moves with the broker.
// It is the bench binary itself, run with -connect-floor.

// connectFloor is the CONNECT's broker CPU per connection over the floor's, in pairs of
// batches of the same connections, interleaved.
type connectFloor struct {
	BrokerUS []float64 `json:"broker_cpu_us"` // each pair's broker CPU per CONNECT
	FloorUS  []float64 `json:"floor_cpu_us"`  // each pair's floor CPU per CONNECT
	Ratios   []float64 `json:"ratios"`        // broker over floor, pair by pair
	Median   float64   `json:"median"`
	Min      float64   `json:"min"`
	Max      float64   `json:"max"`
	// BrokerMedianUS and FloorMedianUS are the medians of each side alone.
	BrokerMedianUS float64 `json:"broker_median_us"`
	FloorMedianUS  float64 `json:"floor_median_us"`
}

// floorRun is the floor's process and its half of the pairs.
type floorRun struct {
	proc *process
	addr string
	r    connectFloor
}

func startConnectFloor() (*floorRun, error) {
	bin, err := os.Executable()
	if err != nil {
		return nil, err
	}
	addr, err := harness.FreeAddr()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "-connect-floor", addr)
	cmd.Env = harness.Env()
	proc, err := startServing(cmd, addr)
	if err != nil {
		return nil, err
	}
	return &floorRun{proc: proc, addr: addr}, nil
}

func (f *floorRun) stop() { f.proc.stop() }

// pair is a batch of conns CONNECTs to the broker with as many to the floor interleaved, one
// beside each of the broker's (before it every other time), as the broker's batches send them
// (oneCommand up to the 200): the two processes' CPU time is measured over the same moments,
// whatever else the machine is doing. It reports false when a CONNECT failed. Without a floor
// (it did not start) it does nothing.
func (f *floorRun) pair(ctx context.Context, b *broker, target, auth string, conns, round int) bool {
	if f == nil {
		return true
	}
	b0, f0 := b.fineCPU(), f.proc.fineCPU()
	for i := range 2 * conns {
		addr := b.proxyAddr
		if (i+round)%2 == 1 {
			addr = f.addr
		}
		if _, err := oneCommand(ctx, addr, target, auth, nil, 0); err != nil {
			fmt.Fprintf(stderr, "  connection per request: a CONNECT beside the floor's: %v\n", err)
			return false
		}
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(conns) }
	f.r.BrokerUS = append(f.r.BrokerUS, per(b.fineCPU()-b0))
	f.r.FloorUS = append(f.r.FloorUS, per(f.proc.fineCPU()-f0))
	return true
}

// finish computes the pairs' ratios and medians from the batches so far.
func (c *connectFloor) finish() {
	if c == nil {
		return
	}
	n := min(len(c.BrokerUS), len(c.FloorUS))
	c.Ratios = c.Ratios[:0]
	for i := range n {
		if c.FloorUS[i] > 0 {
			c.Ratios = append(c.Ratios, c.BrokerUS[i]/c.FloorUS[i])
		}
	}
	if len(c.Ratios) == 0 {
		return
	}
	c.Median, c.Min, c.Max = median(c.Ratios), slices.Min(c.Ratios), slices.Max(c.Ratios)
	c.BrokerMedianUS, c.FloorMedianUS = median(c.BrokerUS[:n]), median(c.FloorUS[:n])
}

// serveConnectFloor is the floor's main.
func serveConnectFloor(addr string) error { return serveEach(addr, floorConnect) }

func floorConnect(c net.Conn) {
	defer c.Close()
	var buf [1024]byte
	n := 0
	for !bytes.Contains(buf[:n], []byte("\r\n\r\n")) {
		if n == len(buf) {
			return
		}
		m, err := c.Read(buf[n:])
		n += m
		if err != nil {
			return
		}
	}
	if _, err := c.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		return
	}
	for { // the tunnel, until the client closes
		if _, err := c.Read(buf[:]); err != nil {
			return
		}
	}
}

// measureConnectFloor starts the floor and measures pairs of batches of CONNECTs, the
// broker's and the floor's interleaved (floorRun.pair); nil when the floor did not start or a
// CONNECT failed.
func measureConnectFloor(ctx context.Context, bare *broker, target, auth string, pairs int) *connectFloor {
	fl, err := startConnectFloor()
	if err != nil {
		fmt.Fprintf(stderr, "  connection per request: the CONNECT floor: %v\n", err)
		return nil
	}
	defer fl.stop()
	for i := range pairs {
		if !fl.pair(ctx, bare, target, auth, perCommandConns, i) {
			return nil
		}
	}
	fl.r.finish()
	return &fl.r
}

// connectPairs is -only connect-pairs: the CONNECT's pairs with the floor alone, without the
// TLS handshake's and the request's batches of -only per-command.
func connectPairs(ctx context.Context, up *upstream, bare *broker, pairs int) error {
	target := net.JoinHostPort(hostIntercept, strconv.Itoa(up.port))
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte(agentID+":"+bare.token))
	f := measureConnectFloor(ctx, bare, target, auth, pairs)
	if f == nil {
		return errors.New("the CONNECT floor's pairs failed")
	}
	(&perCommand{Floor: f}).print(os.Stdout)
	if os.Getenv("CONNFAST_DEBUG") != "" {
		for i := range f.Ratios {
			fmt.Printf("    pair %d: %.0f / %.0f = %.2f\n", i, f.BrokerUS[i], f.FloorUS[i], f.Ratios[i])
		}
	}
	return nil
}
