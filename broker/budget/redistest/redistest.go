// Package redistest runs a real redis-server for tests: one process per Start, on a free
// loopback port, with an append-only file so that its counters survive Restart, killed when
// the test ends. It syncs its file every second, as a production server usually does. It is imported by tests only.
//
// redis-server (Debian's redis-server; scripts/install-test-tools.sh installs it) is looked up
// as $REDIS_BIN, then on PATH. Without it the test is skipped, unless CI is set or
// CAPBROKER_REQUIRE_VAULT=1, then it fails.
package redistest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capbroker/capbroker/internal/harness"
)

// Server is a running redis-server.
type Server struct {
	// Addr is host:port.
	Addr string

	t   testing.TB
	bin string
	dir string

	mu   sync.Mutex
	cmd  *exec.Cmd
	out  *bytes.Buffer
	exit chan struct{}
}

// Start runs a server and registers its shutdown with t.Cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := os.Getenv("REDIS_BIN")
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("redis-server"); err != nil {
			if os.Getenv("CI") != "" || os.Getenv("CAPBROKER_REQUIRE_VAULT") == "1" {
				t.Fatalf("redistest: redis-server not found: run scripts/install-test-tools.sh")
			}
			t.Skipf("redistest: redis-server not found (run scripts/install-test-tools.sh)")
		}
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir()}
	t.Cleanup(s.Stop)
	var last error
	for range 5 {
		addr, err := harness.FreeAddr()
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s.Addr = addr
		if last = s.run(); last == nil {
			return s
		}
	}
	t.Fatalf("redistest: %v", last)
	return nil
}

func (s *Server) run() error {
	_, port, _ := net.SplitHostPort(s.Addr)
	if _, err := strconv.Atoi(port); err != nil {
		return err
	}
	cmd := exec.Command(s.bin, "--bind", "127.0.0.1", "--port", port, "--dir", s.dir,
		"--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--protected-mode", "no",
		"--daemonize", "no", "--logfile", "")
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return err
	}
	exit := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exit) }()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exit:
			return fmt.Errorf("redis-server exited: %s", strings.TrimSpace(out.String()))
		default:
		}
		if pong(s.Addr) {
			s.mu.Lock()
			s.cmd, s.out, s.exit = cmd, out, exit
			s.mu.Unlock()
			return nil
		}
		time.Sleep(20 * time.Millisecond) // polling a starting process: there is nothing to wait on
	}
	_ = cmd.Process.Kill()
	<-exit
	return fmt.Errorf("redis-server did not answer within 20s: %s", out.String())
}

// pong reports whether a server at addr answers PING.
func pong(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	buf := make([]byte, 16)
	n, _ := c.Read(buf)
	return strings.HasPrefix(string(buf[:n]), "+PONG")
}

// Stop shuts the server down (SIGTERM: it writes its append-only file out, which stays for
// Restart), and kills it if it has not exited in 10 seconds.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, exit := s.cmd, s.exit
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exit:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-exit
	}
}

// Restart stops the server and starts it again on the same port, from its append-only file.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	if err := s.run(); err != nil {
		s.t.Fatalf("redistest: restart: %v", err)
	}
}
