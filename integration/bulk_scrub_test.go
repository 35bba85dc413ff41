package integration

// Bulk and many-keys attacks (issue 40): a hostile upstream on a host with forty keys bound to
// it streams a large response and places each key, raw and hex-encoded, across the 16 KiB
// boundaries of its writes (where the broker's reads, its scrubber's held-back bytes and the
// chunks it writes to the agent all split), and pauses after a large chunk until the agent
// has read everything sent so far (where the broker holds a chunk's last bytes for the next
// one). The agent must get every byte of the text between the keys, no key in either form,
// and each pause's bytes without more coming.

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestBulkScrubManyKeys(t *testing.T) {
	const keys, size, piece = 40, 2 << 20, 16 << 10
	var vals []string
	var creds strings.Builder
	var env []string
	for i := range keys {
		v := fmt.Sprintf("sk-perf-%02d-%s", i, randHex(16))
		vals = append(vals, v)
		fmt.Fprintf(&creds, "  - name: perf%d\n    hosts: [\"127.0.0.1\"]\n    source: {env: PERF_KEY_%d}\n    inject: {header: X-Perf-%d, value: \"{{secret}}\"}\n", i, i, i)
		env = append(env, fmt.Sprintf("PERF_KEY_%d=%s", i, v))
	}
	// The response: filler with a key (raw, then hex) straddling each piece's end, and what
	// the agent must get for it.
	var sent, want strings.Builder
	filler := func(n int) string { return strings.Repeat("perf filler text. ", n/18+1)[:n] }
	for i := 0; sent.Len() < size; i++ {
		form := vals[i%keys]
		if i%2 == 1 {
			form = hex.EncodeToString([]byte(form))
		}
		n := piece*(i+1) - sent.Len() - len(form)/2
		sent.WriteString(filler(n))
		want.WriteString(filler(n))
		sent.WriteString(form)
		want.WriteString("[REDACTED]")
	}
	body := sent.String()
	paused := make(chan int, 1) // the bytes sent before the upstream's pause
	resume := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		half := len(body) / 2
		for off := 0; off < len(body); off += piece {
			w.Write([]byte(body[off:min(off+piece, len(body))]))
			w.(http.Flusher).Flush()
			if off < half && off+piece >= half {
				paused <- off + piece
				select {
				case <-resume:
				case <-time.After(waitTimeout):
					return
				}
			}
		}
	})
	e := newEnv(t, envOpts{handler: h, extraCredentials: creds.String(), env: env})
	conn := e.dialTunnel(t, e.up.Listener.Addr().String())
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(waitTimeout))
	if _, err := io.WriteString(conn, e.get("/api/custom/bulk")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	upTo := <-paused
	// What the agent must have for the upstream's first upTo bytes: up to the last key that
	// ends in them (what follows may begin a key and is held back).
	cut := 0
	for i, rest := 0, body[:upTo]; ; i++ {
		form := vals[i%keys]
		if i%2 == 1 {
			form = hex.EncodeToString([]byte(form))
		}
		j := strings.Index(rest, form)
		if j < 0 {
			break
		}
		cut += j + len("[REDACTED]")
		rest = rest[j+len(form):]
	}
	first := make([]byte, cut)
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatalf("the agent did not get the %d bytes before the upstream's pause: %v", cut, err)
	}
	close(resume)
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	got := string(first) + string(rest)
	if got != want.String() {
		t.Fatalf("the agent got %d bytes, want %d (first difference at %d)", len(got), want.Len(), diffAt(got, want.String()))
	}
	for _, v := range vals {
		if strings.Contains(got, v) || strings.Contains(got, hex.EncodeToString([]byte(v))) {
			t.Fatalf("a key reached the agent")
		}
	}
}

func diffAt(a, b string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
