package testkit

import (
	"crypto/tls"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/capbroker/capbroker/internal/tcppair"
	"github.com/capbroker/capbroker/internal/testpki"
)

// RecordedTLS is a TLS 1.3 connection over loopback TCP, its handshake done: the agent's end,
// for "agent.test", and the server's, whose records rc counts once Count is called. The
// server writes full records from the first (crypto/tls otherwise starts small, and grows
// them) and sends no session ticket; alpn, when given, is what both offer.
func RecordedTLS(t *testing.T, alpn ...string) (agent, server *tls.Conn, rc *RecordConn) {
	t.Helper()
	pki := testpki.New(t, "recorded TLS")
	agentRaw, raw := tcppair.New(t)
	rc = &RecordConn{Conn: raw}
	server = tls.Server(rc, &tls.Config{
		Certificates:                []tls.Certificate{pki.Server(t, time.Now().Add(time.Hour), "agent.test")},
		MinVersion:                  tls.VersionTLS13,
		NextProtos:                  alpn,
		SessionTicketsDisabled:      true,
		DynamicRecordSizingDisabled: true,
	})
	agent = tls.Client(agentRaw, &tls.Config{RootCAs: pki.Pool, ServerName: "agent.test", NextProtos: alpn})
	errc := make(chan error, 1)
	go func() { errc <- server.Handshake() }()
	if err := agent.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return agent, server, rc
}

// RecordConn records the TLS 1.3 records written through it, once Count is called: the
// plaintext length of each application-data record (its length less the inner content type
// and the AEAD tag). Put it under a tls.Server to see how a server's writes are framed.
type RecordConn struct {
	net.Conn
	mu       sync.Mutex
	counting bool
	pending  []byte
	records  []int
}

const tls13Overhead = 1 + 16

// Count starts counting (after the handshake, say).
func (c *RecordConn) Count() {
	c.mu.Lock()
	c.counting = true
	c.mu.Unlock()
}

func (c *RecordConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.counting {
		c.pending = append(c.pending, p...)
		for len(c.pending) >= 5 {
			n := int(c.pending[3])<<8 | int(c.pending[4])
			if len(c.pending) < 5+n {
				break
			}
			if c.pending[0] == 23 { // application data
				c.records = append(c.records, n-tls13Overhead)
			}
			c.pending = c.pending[5+n:]
		}
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// Take returns the records counted since the last Take.
func (c *RecordConn) Take() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.records
	c.records = nil
	return r
}
