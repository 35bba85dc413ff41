package testkit

import (
	"net"
	"sync"
)

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
