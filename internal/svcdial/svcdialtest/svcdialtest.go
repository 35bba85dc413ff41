// Package svcdialtest has a recording dial function for the tests of the broker's own clients.
package svcdialtest

import (
	"context"
	"net"
	"sync/atomic"
)

// Recorder is a dial function for tests that dials directly and counts its dials: a test
// passes Recorder.Dial as a client's injected dial and checks Count to prove it was used.
type Recorder struct{ n atomic.Int64 }

// Dial dials addr directly and counts it.
func (r *Recorder) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	r.n.Add(1)
	return (&net.Dialer{}).DialContext(ctx, network, addr)
}

// Count is the number of dials so far.
func (r *Recorder) Count() int64 { return r.n.Load() }
