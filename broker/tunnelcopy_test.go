package broker

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capbroker/capbroker/broker/wire"
	"github.com/capbroker/capbroker/internal/tcppair"
)

// tcpPair is a connected pair of loopback TCP connections.
func tcpPair(t *testing.T) (a, b *net.TCPConn) { return tcppair.New(t) }

// testTunnel is an opaque tunnel as pipeConn runs it, between an agent's end and an
// upstream's end, with the bytes each way counted.
type testTunnel struct {
	agent, upstream *net.TCPConn
	in, out         atomic.Int64
	done            chan struct{}
}

func startTestTunnel(t *testing.T, idle time.Duration) *testTunnel {
	agent, brokerClient := tcpPair(t)
	brokerUp, upstream := tcpPair(t)
	tt := &testTunnel{agent: agent, upstream: upstream, done: make(chan struct{})}
	clock := newIdleClock(idle)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); copyHalf(brokerUp, brokerClient, &tt.in, clock) }()
	go func() { defer wg.Done(); copyHalf(brokerClient, brokerUp, &tt.out, clock) }()
	go func() { wg.Wait(); close(tt.done) }()
	return tt
}

func (tt *testTunnel) wait(t *testing.T) {
	t.Helper()
	select {
	case <-tt.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the tunnel did not end")
	}
}

// A tunnel in which neither side sends anything ends once it has been quiet for the idle
// timeout, and not before.
func TestTunnelIdleEndsQuietTunnel(t *testing.T) {
	const idle = 150 * time.Millisecond
	tt := startTestTunnel(t, idle)
	// The tunnel's last activity is its read of these bytes: after the write begins.
	last := time.Now()
	if _, err := tt.agent.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if _, err := io.ReadFull(tt.upstream, buf); err != nil {
		t.Fatal(err)
	}
	tt.wait(t)
	if quiet := time.Since(last); quiet < idle {
		t.Fatalf("the tunnel ended after %v quiet, want at least %v", quiet, idle)
	}
	// Both ends see the tunnel end.
	for _, c := range []net.Conn{tt.agent, tt.upstream} {
		if n, err := c.Read(buf); err == nil {
			t.Fatalf("read %d bytes after the tunnel ended", n)
		}
	}
	if got := tt.in.Load(); got != 2 {
		t.Fatalf("bytes in = %d, want 2", got)
	}
}

// A long download with a quiet agent is not ended: the upstream's activity keeps the agent's
// direction open for as long as it lasts, several idle timeouts, and the agent can still send
// afterwards.
func TestTunnelIdleKeepsOneWayDownload(t *testing.T) {
	const idle = 300 * time.Millisecond
	tt := startTestTunnel(t, idle)
	upEOF := make(chan []byte, 1)
	go func() { // the upstream reads what the agent sends, to its EOF
		b, _ := io.ReadAll(tt.upstream)
		upEOF <- b
	}()
	const chunks, size = 30, 1000 // one every idle/6: 1.5 s, five idle timeouts
	go func() {
		tick := time.NewTicker(idle / 6)
		defer tick.Stop()
		chunk := bytes.Repeat([]byte("d"), size)
		for range chunks {
			<-tick.C
			if _, err := tt.upstream.Write(chunk); err != nil {
				return
			}
		}
		_ = tt.upstream.CloseWrite()
	}()
	got, err := io.ReadAll(tt.agent) // to the upstream's half-close
	if err != nil || len(got) != chunks*size {
		t.Fatalf("agent read %d bytes (%v), want %d", len(got), err, chunks*size)
	}
	select {
	case b := <-upEOF:
		t.Fatalf("the agent's quiet direction was ended during the download (upstream read %q)", b)
	default:
	}
	if _, err := tt.agent.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	_ = tt.agent.CloseWrite()
	if b := <-upEOF; string(b) != "bye" {
		t.Fatalf("upstream read %q, want %q", b, "bye")
	}
	tt.wait(t)
	if in, out := tt.in.Load(), tt.out.Load(); in != 3 || out != chunks*size {
		t.Fatalf("bytes in/out = %d/%d, want 3/%d", in, out, chunks*size)
	}
}

// Bytes moved both ways at once arrive intact, and are counted exactly; each side's
// half-close reaches the other while the other direction still flows.
func TestTunnelCopyCountsExactly(t *testing.T) {
	tt := startTestTunnel(t, tunnelIdleTimeout)
	up := make([]byte, 3<<20+17)
	down := make([]byte, 5<<20+3)
	_, _ = rand.Read(up)
	_, _ = rand.Read(down)
	send := func(c *net.TCPConn, b []byte) {
		_, _ = c.Write(b)
		_ = c.CloseWrite()
	}
	go send(tt.agent, up)
	go send(tt.upstream, down)
	var gotUp, gotDown []byte
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); gotUp, _ = io.ReadAll(tt.upstream) }()
	go func() { defer wg.Done(); gotDown, _ = io.ReadAll(tt.agent) }()
	wg.Wait()
	tt.wait(t)
	if !bytes.Equal(gotUp, up) || !bytes.Equal(gotDown, down) {
		t.Fatalf("bytes differ: up %d of %d, down %d of %d", len(gotUp), len(up), len(gotDown), len(down))
	}
	if in, out := tt.in.Load(), tt.out.Load(); in != int64(len(up)) || out != int64(len(down)) {
		t.Fatalf("bytes in/out = %d/%d, want %d/%d", in, out, len(up), len(down))
	}
}

// The tunnel reads and writes the agent's socket below the admission's and the guard's
// wrappers (the guard has nothing to check in a tunnel: what passes is TLS, not requests),
// and closing it still closes through them: the admission's slot is given back.
func TestTunnelSideBelowWrappers(t *testing.T) {
	a := newAdmission(5, 2, 1)
	agent, brokerSide := tcpPair(t)
	ac := a.admit(wire.Guard(brokerSide, []byte("HTTP/1.1 400 Bad Request\r\n\r\n")), netip.MustParseAddr("127.0.0.1"))
	if ac == nil {
		t.Fatal("not admitted")
	}
	side := tunnelSide(ac)
	if _, ok := side.(interface{ CloseWrite() error }); ok {
		t.Fatal("the tunnel's side of the agent can half-close, which the wrappers it replaces cannot")
	}
	hello := []byte("\x16\x03\x01\x00\x05hello\n") // a bare LF: the guard refuses it
	if _, err := agent.Write(hello); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(hello))
	if _, err := io.ReadFull(side, got); err != nil || !bytes.Equal(got, hello) {
		t.Fatalf("read %q (%v), want %q", got, err, hello)
	}
	if _, err := side.Write([]byte("back")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(agent, got[:4]); err != nil || string(got[:4]) != "back" {
		t.Fatalf("agent read %q (%v)", got[:4], err)
	}
	if a.open != 1 {
		t.Fatalf("open = %d, want 1", a.open)
	}
	if err := side.Close(); err != nil {
		t.Fatal(err)
	}
	if a.open != 0 {
		t.Fatalf("closing the tunnel's side left the admission's slot taken (open = %d)", a.open)
	}
	if n, err := agent.Read(got); err != io.EOF {
		t.Fatalf("agent read %d bytes (%v) after the close, want EOF", n, err)
	}
}
