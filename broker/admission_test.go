package broker

import (
	"errors"
	"net"
	"net/netip"
	"testing"
)

// TestAdmission: connections are charged to their source address until claimed, then to
// their agent until released; every cap refuses without taking anything.
func TestAdmission(t *testing.T) {
	a := newAdmission(5, 2, 1)
	src := netip.MustParseAddr("10.0.0.1")
	other := netip.MustParseAddr("10.0.0.2")
	conn := func(from netip.Addr) *admittedConn {
		c1, c2 := net.Pipe()
		t.Cleanup(func() { c1.Close(); c2.Close() })
		return a.admit(c1, from)
	}
	p0, p1 := conn(src), conn(src)
	if p0 == nil || p1 == nil {
		t.Fatal("two connections from one address were refused")
	}
	p2 := conn(src) // takes the place of p0, the oldest still waiting for a request
	if p2 == nil || !p0.gone || len(a.pending[src]) != 2 || a.open != 2 {
		t.Fatalf("a third waiting connection: admitted %v, oldest gone %v, waiting %d, open %d", p2 != nil, p0.gone, len(a.pending[src]), a.open)
	}
	if err := p0.claim("a"); !errors.Is(err, errTooMany) {
		t.Fatalf("a connection whose slot was taken was claimed: %v", err)
	}
	if err := p1.claim("a"); err != nil {
		t.Fatal(err)
	}
	if err := p1.claim("b"); !errors.Is(err, errOtherAgent) {
		t.Fatalf("another agent on a claimed connection: %v", err)
	}
	p3 := conn(src) // p1 no longer counts against the address
	if p3 == nil {
		t.Fatal("a claimed connection still counts against its address")
	}
	if err := p2.claim("a"); err != nil {
		t.Fatal(err)
	}
	if err := p3.claim("a"); !errors.Is(err, errTooMany) {
		t.Fatalf("a third connection for agent a: %v", err)
	}
	if err := p3.claim("b"); err != nil {
		t.Fatalf("agent b was refused while a is at its cap: %v", err)
	}
	// 3 held; two more from elsewhere fill the broker.
	if conn(other) == nil || conn(other) == nil {
		t.Fatal("the broker refused before it was full")
	}
	if conn(netip.MustParseAddr("10.0.0.3")) != nil {
		t.Fatal("a sixth connection was admitted")
	}
	if conn(other) == nil || a.open != 5 {
		t.Fatal("a full broker did not take a waiting connection's place for one from its address")
	}
	p1.Close()
	p1.release() // twice: gives back once
	if conn(netip.MustParseAddr("10.0.0.3")) == nil {
		t.Fatal("a closed connection kept its slot")
	}
	if a.agents["a"] != 1 || a.open != 5 {
		t.Fatalf("after one close: agents %v, open %d", a.agents, a.open)
	}

	if err := a.request("a"); err != nil {
		t.Fatal(err)
	}
	if err := a.request("a"); !errors.Is(err, errTooManyRequests) {
		t.Fatalf("a second request in flight: %v", err)
	}
	a.requestDone("a")
	if err := a.request("a"); err != nil {
		t.Fatalf("after the first ended: %v", err)
	}
}
