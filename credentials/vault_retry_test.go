package credentials

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// lockedBuffer is a log destination safe for the auth loop's goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Split(strings.TrimSpace(l.b.String()), "\n")
}

// TestVaultLoginRetryHonoursRefreshInterval: failed logins are retried at most
// vault.refresh_interval apart (RetryMax), shorter or longer than the old fixed 30 s cap.
func TestVaultLoginRetryHonoursRefreshInterval(t *testing.T) {
	t.Parallel()
	// A port that refuses: every login fails at once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	addr := "http://" + ln.Addr().String()
	ln.Close()
	token := writeFile(t, "some-token")
	auth := VaultAuth{Method: AuthAppRole, RoleIDFile: token, SecretIDFile: token}

	var logs lockedBuffer
	const retryMax = 300 * time.Millisecond
	v, err := NewVault(VaultOptions{Dial: vaultDial.Dial, Address: addr, Auth: auth, RetryMax: retryMax, Log: zerolog.New(&logs)})
	must(t, err)
	defer func() { _ = v.Close(context.Background()) }()
	must(t, v.Start(ctxT(t)))
	var delays []time.Duration
	waitFor(t, 15*time.Second, "six failed logins", func() error {
		delays = delays[:0]
		for _, l := range logs.lines() {
			var ev struct {
				Msg     string `json:"message"`
				RetryIn string `json:"retry_in"`
			}
			if json.Unmarshal([]byte(l), &ev) != nil || ev.Msg != "vault login failed" {
				continue
			}
			d, err := time.ParseDuration(ev.RetryIn)
			must(t, err)
			delays = append(delays, d)
		}
		if len(delays) < 6 {
			return context.DeadlineExceeded
		}
		return nil
	})
	for i, d := range delays {
		if d > retryMax {
			t.Fatalf("retry %d after %s, longer than refresh_interval %s (all: %v)", i, d, retryMax, delays)
		}
	}

	// A longer refresh_interval is honoured too (the cap was 30 s whatever it said), and a
	// reload may change it.
	for _, d := range []time.Duration{5 * time.Minute, 2 * time.Second} {
		v.SetRetryMax(d)
		var b backoff
		v.loginBackoff(&b)
		if b.max != d || b.min != min(loginRetryMin, d) {
			t.Fatalf("RetryMax %s: login backoff %+v", d, b)
		}
	}
}
