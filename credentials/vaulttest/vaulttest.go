// Package vaulttest runs a real Vault dev server for tests: one process per Start, on a free
// loopback port, killed when the test ends. It is imported by tests only.
//
// The Vault binary is looked up as $VAULT_BIN, then `vault` on PATH, then by running the
// repository's shared/tools/vault-bin (found by walking up from the working directory), which
// unpacks a bundled build once. Without any of them the test is skipped, unless
// CAPBROKER_REQUIRE_VAULT=1, then it fails.
//
// Dev mode keeps everything in memory: after Restart the server is empty again (KV v2 at
// secret/, root token RootToken, nothing else), so a test that restarts Vault must seed it again.
package vaulttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"

	"github.com/capbroker/capbroker/internal/harness"
)

// RootToken is the dev server's root token.
const RootToken = "root"

const (
	startAttempts  = 5                      // ports tried before giving up (another process may take the port)
	readyTimeout   = 30 * time.Second       // for one server process to answer sys/health
	pollInterval   = 25 * time.Millisecond  // between readiness probes
	probeTimeout   = 500 * time.Millisecond // one readiness probe
	stopGrace      = 5 * time.Second        // after SIGKILL, how long Wait may take
	requireVarName = "CAPBROKER_REQUIRE_VAULT"
)

// Server is a running Vault dev server.
type Server struct {
	// Addr is the server's address, e.g. http://127.0.0.1:41234.
	Addr string
	// RootToken is the dev root token.
	RootToken string

	t       testing.TB
	bin     string
	listen  string // host:port, kept across Restart
	homeDir string

	mu   sync.Mutex
	cmd  *exec.Cmd
	out  *syncBuffer
	exit chan struct{} // closed when cmd has exited
}

// Start runs a dev server and registers its shutdown with t.Cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		if os.Getenv(requireVarName) == "1" {
			t.Fatalf("vaulttest: %v (%s=1 makes a missing Vault a failure)", err, requireVarName)
		}
		t.Skipf("vaulttest: %v", err)
	}
	s := &Server{RootToken: RootToken, t: t, bin: bin, homeDir: t.TempDir()}
	t.Cleanup(s.Stop)

	var lastErr error
	for range startAttempts {
		listen, err := harness.FreeAddr()
		if err != nil {
			t.Fatalf("vaulttest: %v", err)
		}
		if lastErr = s.start(listen); lastErr == nil {
			return s
		}
	}
	t.Fatalf("vaulttest: %v", lastErr)
	return nil
}

// Stop kills the server and waits for it to exit. It is safe to call more than once.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	select {
	case <-s.exit:
	case <-time.After(stopGrace):
		s.t.Errorf("vaulttest: vault (pid %d) did not exit after SIGKILL", s.cmd.Process.Pid)
	}
	s.cmd = nil
}

// Restart stops the server and starts a new one on the same address. The new server is empty:
// seed it again.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	// The port was ours a moment ago; another process may grab it in between, which fails the test.
	if err := s.start(s.listen); err != nil {
		s.t.Fatalf("vaulttest: restart on %s: %v", s.listen, err)
	}
}

// Client returns an API client for the server, authenticated with the root token. It is
// configured explicitly and ignores VAULT_* environment variables.
func (s *Server) Client() *api.Client {
	s.t.Helper()
	c, err := NewClient(s.Addr, s.RootToken)
	if err != nil {
		s.t.Fatalf("vaulttest: %v", err)
	}
	return c
}

// NewClient builds an API client for addr with token, without retries and ignoring the
// VAULT_* environment variables that api.NewClient would otherwise apply.
func NewClient(addr, token string) (*api.Client, error) {
	c, err := api.NewClient(&api.Config{
		Address:    addr,
		HttpClient: &http.Client{Transport: &http.Transport{Proxy: nil}},
		Timeout:    10 * time.Second,
		MaxRetries: 0,
	})
	if err != nil {
		return nil, err
	}
	c.SetHeaders(http.Header{api.RequestHeaderName: []string{"true"}})
	c.SetWrappingLookupFunc(func(string, string) string { return "" })
	c.SetToken(token)
	return c, nil
}

// Log returns what the server has printed so far, for failure messages.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.out == nil {
		return ""
	}
	return s.out.String()
}

// start runs one server process on listen and waits until it is ready. On failure the process
// is gone when it returns.
func (s *Server) start(listen string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &syncBuffer{}
	cmd := exec.Command(s.bin, "server", "-dev",
		"-dev-root-token-id="+RootToken,
		"-dev-listen-address="+listen,
		"-dev-no-store-token")
	cmd.Env = serverEnv(s.homeDir)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr()
	// The kernel sends the parent-death signal when the thread that started the child exits,
	// not the process: a test that ends a locked thread (one that entered a network namespace)
	// could kill a server another thread started. So the server is started and waited for by a
	// goroutine locked to its thread for the server's life.
	exit := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the server
		err := cmd.Start()
		started <- err
		if err == nil {
			_ = cmd.Wait()
		}
		close(exit)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("starting %s: %w", s.bin, err)
	}

	addr := "http://" + listen
	if err := waitReady(addr, exit); err != nil {
		_ = cmd.Process.Kill()
		<-exit
		return fmt.Errorf("vault on %s: %w\n%s", listen, err, out.String())
	}
	s.Addr, s.listen, s.cmd, s.out, s.exit = addr, listen, cmd, out, exit
	return nil
}

// waitReady polls sys/health until the server reports itself initialised, unsealed and active,
// the process exits, or readyTimeout passes.
func waitReady(addr string, exit <-chan struct{}) error {
	c, err := NewClient(addr, "")
	if err != nil {
		return err
	}
	deadline := time.Now().Add(readyTimeout)
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		h, err := c.Sys().HealthWithContext(ctx)
		cancel()
		switch {
		case err != nil:
			last = err
		case !h.Initialized || h.Sealed || h.Standby:
			last = fmt.Errorf("health: initialized=%v sealed=%v standby=%v", h.Initialized, h.Sealed, h.Standby)
		default:
			return nil
		}
		select {
		case <-exit:
			return errors.New("the server exited before it was ready")
		case <-tick.C:
		}
	}
	return fmt.Errorf("not ready after %s: %v", readyTimeout, last)
}

// serverEnv is the test process's environment without VAULT_* variables (the server must not
// pick up a developer's settings) and with a private HOME.
func serverEnv(home string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "VAULT_") || strings.HasPrefix(kv, "HOME=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "HOME="+home)
}

var binary struct {
	once sync.Once
	path string
	err  error
}

// Binary returns the path of a Vault server binary, or an error saying why there is none.
func Binary() (string, error) {
	binary.once.Do(func() { binary.path, binary.err = findBinary() })
	return binary.path, binary.err
}

func findBinary() (string, error) {
	if p := os.Getenv("VAULT_BIN"); p != "" {
		if fi, err := os.Stat(p); err != nil || fi.IsDir() {
			return "", fmt.Errorf("VAULT_BIN=%s is not a file", p)
		}
		return p, nil
	}
	if p, err := exec.LookPath("vault"); err == nil {
		return p, nil
	}
	tool, err := findTool()
	if err != nil {
		return "", err
	}
	cmd := exec.Command(tool)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s: %v: %s", tool, err, strings.TrimSpace(stderr.String()))
	}
	p := strings.TrimSpace(string(out))
	if p == "" {
		return "", fmt.Errorf("%s printed no path", tool)
	}
	return p, nil
}

// findTool looks for shared/tools/vault-bin in the working directory and its parents.
func findTool() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, "shared", "tools", "vault-bin")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no Vault binary: set VAULT_BIN, put vault on PATH, or provide shared/tools/vault-bin")
		}
		dir = parent
	}
}

// syncBuffer collects the server's output; the process writes it while tests read it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
