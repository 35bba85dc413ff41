package upstream

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// recordListener's connections parse the TLS records they read: the plaintext length of each
// application-data record (TLS 1.3: less the inner type and the AEAD tag).
type recordListener struct {
	net.Listener
	mu      sync.Mutex
	records []int
}

func (l *recordListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &recordReader{Conn: c, l: l}, nil
}

type recordReader struct {
	net.Conn
	l       *recordListener
	pending []byte
}

func (c *recordReader) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.pending = append(c.pending, p[:n]...)
	for len(c.pending) >= 5 {
		size := int(c.pending[3])<<8 | int(c.pending[4])
		if len(c.pending) < 5+size {
			break
		}
		if c.pending[0] == 23 {
			c.l.mu.Lock()
			c.l.records = append(c.l.records, size-17)
			c.l.mu.Unlock()
		}
		c.pending = c.pending[5+size:]
	}
	return n, err
}

// TestUploadFullRecords: a streamed request body goes upstream in full TLS records (16 KiB of
// plaintext), not in the 4 KiB a default bufio.Writer holds. crypto/tls starts a connection
// with small records and grows them over its first 128 KiB: the records after those are
// counted.
func TestUploadFullRecords(t *testing.T) {
	const size = 2 << 20
	got := make(chan int64, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		got <- n
	}))
	rl := &recordListener{Listener: srv.Listener}
	srv.Listener = rl
	srv.StartTLS()
	t.Cleanup(srv.Close)
	c := clientFor(t, srv)
	// A reader that is neither a bytes.Reader nor a strings.Reader: a streamed body.
	body := io.LimitReader(strings.NewReader(strings.Repeat("u", size)), size)
	req := request(t, http.MethodPost, srv.URL+"/upload", io.NopCloser(body))
	req.ContentLength = size
	req.Header.Set("Content-Length", strconv.Itoa(size))
	if code, _ := do(t, c, req); code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	if n := <-got; n != size {
		t.Fatalf("the server read %d bytes, want %d", n, size)
	}
	rl.mu.Lock()
	defer rl.mu.Unlock()
	var sent, full, short int
	for i, r := range rl.records {
		sent += r
		if sent <= 256<<10 || i == len(rl.records)-1 {
			continue // crypto/tls's small first records, and the body's last
		}
		if r == 16<<10 {
			full++
		} else {
			short++
		}
	}
	if short > 0 || full < (size-256<<10)/(16<<10)-1 {
		t.Fatalf("after the first 256 KiB: %d full records, %d shorter ones (%d records in all)", full, short, len(rl.records))
	}
}
