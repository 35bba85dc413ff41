package dns

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker/transparent"
)

// fakePolicy allows names under allowed.test for the agent at 127.0.0.0/8 except 127.0.0.99,
// which no agent has; it records every decision and audit event.
type fakePolicy struct {
	mu      sync.Mutex
	decided []Query
	events  []Event
	audited chan Event
}

const denyReason = "example.invalid is not on the allow-list"

func (f *fakePolicy) Decide(_ context.Context, q Query) Verdict {
	f.mu.Lock()
	f.decided = append(f.decided, q)
	f.mu.Unlock()
	if q.Source == netip.MustParseAddr("127.0.0.99") {
		return Verdict{Reason: "no agent has this address"}
	}
	if q.Name == "allowed.test" || strings.HasSuffix(q.Name, ".allowed.test") {
		return Verdict{Agent: "coder", Allow: true, DecisionID: "d-1"}
	}
	return Verdict{Agent: "coder", Reason: denyReason, DecisionID: "d-2"}
}

func (f *fakePolicy) Audit(e Event) {
	f.mu.Lock()
	f.events = append(f.events, e)
	f.mu.Unlock()
	f.audited <- e
}

func (f *fakePolicy) snapshot() ([]Query, []Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Query(nil), f.decided...), append([]Event(nil), f.events...)
}

// clock is a settable time.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

type testServer struct {
	addr   string
	names  *transparent.Names
	policy *fakePolicy
	clock  *clock
	srv    *Server
}

func newTestServer(t testing.TB, qps int) *testServer {
	t.Helper()
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{
		addr:   l.Addr().String(),
		names:  transparent.NewNames([]netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("fd00:cb::/64")}),
		policy: &fakePolicy{audited: make(chan Event, 10000)},
		clock:  &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)},
	}
	ts.srv = Serve(l, Options{Policy: ts.policy, Names: ts.names, TTL: 30 * time.Second, QueriesPerSecond: qps,
		HostNames: []string{"ci-runner.example.com"}, Log: zerolog.Nop(), Now: ts.clock.now})
	t.Cleanup(func() { _ = ts.srv.Close() })
	return ts
}

// ask sends one query from source (a loopback address) over proto.
func (ts *testServer) ask(t *testing.T, proto, source, name string, qtype uint16, edns bool) *mdns.Msg {
	t.Helper()
	m := new(mdns.Msg)
	m.SetQuestion(mdns.Fqdn(name), qtype)
	if edns {
		m.SetEdns0(1232, false)
	}
	return ts.exchange(t, proto, source, m)
}

func (ts *testServer) exchange(t *testing.T, proto, source string, m *mdns.Msg) *mdns.Msg {
	t.Helper()
	local := net.Addr(&net.UDPAddr{IP: net.ParseIP(source)})
	if proto == "tcp" {
		local = &net.TCPAddr{IP: net.ParseIP(source)}
	}
	c := &mdns.Client{Net: proto, Timeout: 5 * time.Second, Dialer: &net.Dialer{LocalAddr: local, Timeout: 5 * time.Second}}
	resp, _, err := c.Exchange(m, ts.addr)
	if err != nil {
		t.Fatalf("%s query %s: %v", proto, m.Question[0].String(), err)
	}
	return resp
}

// raw sends bytes over UDP from 127.0.0.1 and returns the answer.
func (ts *testServer) rawUDP(t *testing.T, msg []byte) []byte {
	t.Helper()
	c, err := net.Dial("udp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 65536)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("no answer to a %d-byte UDP message: %v", len(msg), err)
	}
	return buf[:n]
}

func (ts *testServer) rawTCP(t *testing.T, msg []byte) []byte {
	t.Helper()
	c, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	frame := binary.BigEndian.AppendUint16(nil, uint16(len(msg)))
	if _, err := c.Write(append(frame, msg...)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		t.Fatalf("no answer to a %d-byte TCP message: %v", len(msg), err)
	}
	buf := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	return buf
}

// waitEvent returns the next audit event.
func (ts *testServer) waitEvent(t *testing.T) Event {
	t.Helper()
	select {
	case e := <-ts.policy.audited:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no audit event")
		return Event{}
	}
}

// noEvent fails if an audit event is pending.
func (ts *testServer) noEvent(t *testing.T) {
	t.Helper()
	select {
	case e := <-ts.policy.audited:
		t.Fatalf("unexpected audit event %+v", e)
	default:
	}
}

func ede(m *mdns.Msg) (uint16, string, bool) {
	if opt := m.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if e, ok := o.(*mdns.EDNS0_EDE); ok {
				return e.InfoCode, e.ExtraText, true
			}
		}
	}
	return 0, "", false
}

func TestAllowedNameGetsPoolAddresses(t *testing.T) {
	ts := newTestServer(t, 100)
	for _, proto := range []string{"udp", "tcp"} {
		for _, qt := range []uint16{mdns.TypeA, mdns.TypeAAAA} {
			resp := ts.ask(t, proto, "127.0.0.1", "API.Allowed.Test", qt, false)
			if resp.Rcode != mdns.RcodeSuccess || len(resp.Answer) != 1 || !resp.RecursionAvailable {
				t.Fatalf("%s %s: %v", proto, mdns.TypeToString[qt], resp)
			}
			var a netip.Addr
			switch rr := resp.Answer[0].(type) {
			case *mdns.A:
				a, _ = netip.AddrFromSlice(rr.A.To4())
			case *mdns.AAAA:
				a, _ = netip.AddrFromSlice(rr.AAAA)
			}
			if !ts.names.InPool(a) || a.Is4() != (qt == mdns.TypeA) {
				t.Fatalf("%s %s answered %v, not a pool address of the family", proto, mdns.TypeToString[qt], a)
			}
			if !ts.names.Matches("api.allowed.test", a) || ts.names.Matches("other.allowed.test", a) {
				t.Fatalf("the listener's table does not map %v back to api.allowed.test alone", a)
			}
			if ttl := resp.Answer[0].Header().Ttl; ttl != 30 {
				t.Fatalf("TTL %d, want 30", ttl)
			}
		}
	}
	// Four answers, one audit event: an allowed name is audited once per agent per TTL.
	e := ts.waitEvent(t)
	if !e.Allow || e.Agent != "coder" || e.Name != "api.allowed.test" || e.Type != "A" || e.Proto != "udp" || e.DecisionID != "d-1" {
		t.Fatalf("audit event %+v", e)
	}
	ts.noEvent(t)
	ts.clock.advance(31 * time.Second)
	ts.ask(t, "udp", "127.0.0.1", "api.allowed.test", mdns.TypeA, false)
	if e := ts.waitEvent(t); !e.Allow || e.Name != "api.allowed.test" {
		t.Fatalf("after the TTL: %+v", e)
	}
}

func TestDeniedNameRefusedWithReason(t *testing.T) {
	ts := newTestServer(t, 100)
	for _, proto := range []string{"udp", "tcp"} {
		for _, qt := range []uint16{mdns.TypeA, mdns.TypeAAAA, mdns.TypeTXT, mdns.TypeNULL, mdns.TypeANY, mdns.TypeHTTPS} {
			resp := ts.ask(t, proto, "127.0.0.1", "exfil.example.invalid", qt, true)
			code, text, ok := ede(resp)
			if resp.Rcode != mdns.RcodeRefused || len(resp.Answer) != 0 || !ok || code != mdns.ExtendedErrorCodeBlocked || text != denyReason {
				t.Fatalf("%s %s: %v", proto, mdns.TypeToString[qt], resp)
			}
			e := ts.waitEvent(t)
			if e.Allow || e.Agent != "coder" || e.Name != "exfil.example.invalid" || e.Type != mdns.TypeToString[qt] || e.Reason != denyReason {
				t.Fatalf("audit event %+v", e)
			}
		}
	}
	// Without EDNS there is no room for the reason; the refusal stands.
	resp := ts.ask(t, "udp", "127.0.0.1", "exfil.example.invalid", mdns.TypeA, false)
	if resp.Rcode != mdns.RcodeRefused || resp.IsEdns0() != nil {
		t.Fatalf("without EDNS: %v", resp)
	}
	ts.waitEvent(t)

	// A source no agent has.
	resp = ts.ask(t, "udp", "127.0.0.99", "api.allowed.test", mdns.TypeA, true)
	if code, _, _ := ede(resp); resp.Rcode != mdns.RcodeRefused || code != mdns.ExtendedErrorCodeProhibited {
		t.Fatalf("unknown source: %v", resp)
	}
	if e := ts.waitEvent(t); e.Allow || e.Agent != "" || e.Source != netip.MustParseAddr("127.0.0.99") {
		t.Fatalf("audit event %+v", e)
	}
}

// TestOwnNamesQuietlyUnknown: the sandbox's lookups of its own name (a single label, its
// host name, localhost) that the policy denies are NXDOMAIN, with no audit event; the same
// from a source no agent has, and any other denied name, are refused and audited.
func TestOwnNamesQuietlyUnknown(t *testing.T) {
	ts := newTestServer(t, 100)
	for _, name := range []string{"sandbox-7f3a", "ci-runner", "ci-runner.example.com", "localhost", "db.localhost"} {
		for _, qt := range []uint16{mdns.TypeA, mdns.TypeAAAA} {
			resp := ts.ask(t, "udp", "127.0.0.1", name, qt, true)
			if _, _, hasEDE := ede(resp); resp.Rcode != mdns.RcodeNameError || len(resp.Answer) != 0 || hasEDE {
				t.Errorf("%s %s: %v", name, mdns.TypeToString[qt], resp)
			}
		}
	}
	if _, events := ts.policy.snapshot(); len(events) != 0 {
		t.Errorf("the sandbox's own names were audited: %+v", events)
	}
	resp := ts.ask(t, "udp", "127.0.0.99", "sandbox-7f3a", mdns.TypeA, true)
	if resp.Rcode != mdns.RcodeRefused {
		t.Errorf("a source no agent has: %v", resp)
	}
	if e := ts.waitEvent(t); e.Name != "sandbox-7f3a" || e.Allow {
		t.Errorf("audit event %+v", e)
	}
	resp = ts.ask(t, "udp", "127.0.0.1", "example.com", mdns.TypeA, true)
	if resp.Rcode != mdns.RcodeRefused {
		t.Errorf("another name: %v", resp)
	}
	if e := ts.waitEvent(t); e.Name != "example.com" || e.Allow {
		t.Errorf("audit event %+v", e)
	}
}

func TestAllowedNameOtherTypesHaveNoData(t *testing.T) {
	ts := newTestServer(t, 100)
	for _, qt := range []uint16{mdns.TypeHTTPS, mdns.TypeSVCB, mdns.TypeTXT, mdns.TypeMX, mdns.TypeCNAME, mdns.TypeANY, mdns.TypeNULL} {
		resp := ts.ask(t, "udp", "127.0.0.1", "api.allowed.test", qt, true)
		if resp.Rcode != mdns.RcodeSuccess || len(resp.Answer)+len(resp.Ns) != 0 {
			t.Fatalf("%s: %v", mdns.TypeToString[qt], resp)
		}
	}
}

func TestReverseLookups(t *testing.T) {
	ts := newTestServer(t, 100)
	resp := ts.ask(t, "udp", "127.0.0.1", "api.allowed.test", mdns.TypeA, false)
	a := resp.Answer[0].(*mdns.A).A
	resp = ts.ask(t, "udp", "127.0.0.1", "api.allowed.test", mdns.TypeAAAA, false)
	a6 := resp.Answer[0].(*mdns.AAAA).AAAA
	for _, ip := range []net.IP{a, a6} {
		arpa, _ := mdns.ReverseAddr(ip.String())
		resp = ts.ask(t, "tcp", "127.0.0.1", arpa, mdns.TypePTR, false)
		if resp.Rcode != mdns.RcodeSuccess || len(resp.Answer) != 1 || resp.Answer[0].(*mdns.PTR).Ptr != "api.allowed.test." {
			t.Fatalf("PTR %s: %v", arpa, resp)
		}
	}
	// A pool address given to no name; an address outside the pool.
	arpa, _ := mdns.ReverseAddr("198.19.255.254")
	if _, ok := ts.names.Name(netip.MustParseAddr("198.19.255.254")); ok {
		t.Skip("the test's free pool address was taken")
	}
	if resp = ts.ask(t, "udp", "127.0.0.1", arpa, mdns.TypePTR, false); resp.Rcode != mdns.RcodeNameError {
		t.Fatalf("PTR of a free pool address: %v", resp)
	}
	arpa, _ = mdns.ReverseAddr("10.1.2.3")
	if resp = ts.ask(t, "udp", "127.0.0.1", arpa, mdns.TypePTR, true); resp.Rcode != mdns.RcodeRefused {
		t.Fatalf("PTR outside the pool: %v", resp)
	}
	for {
		e := ts.waitEvent(t)
		if !e.Allow {
			if e.Name != "3.2.1.10.in-addr.arpa" || e.Reason != ReasonReverse {
				t.Fatalf("refusal event %+v", e)
			}
			break
		}
	}
	arpa6, _ := mdns.ReverseAddr("fd00:cb::1")
	if got, ok := reverseAddr(transparent.Canonical(arpa6)); !ok || got != netip.MustParseAddr("fd00:cb::1") {
		t.Fatalf("reverseAddr ip6 = %v %v", got, ok)
	}
	for _, bad := range []string{"1.2.3.in-addr.arpa", "01.2.3.4.in-addr.arpa", "256.2.3.4.in-addr.arpa", "x.ip6.arpa"} {
		if _, ok := reverseAddr(bad); ok {
			t.Fatalf("reverseAddr(%q) accepted", bad)
		}
	}
}

func TestRateBound(t *testing.T) {
	ts := newTestServer(t, 5) // bursts of 10
	src := "127.0.0.3"
	for i := range 10 {
		if resp := ts.ask(t, "udp", src, "api.allowed.test", mdns.TypeA, true); resp.Rcode != mdns.RcodeSuccess {
			t.Fatalf("query %d within the burst: %v", i, resp)
		}
	}
	ts.waitEvent(t) // the answer's
	for i := range 5 {
		resp := ts.ask(t, "udp", src, "api.allowed.test", mdns.TypeA, true)
		if _, text, _ := ede(resp); resp.Rcode != mdns.RcodeRefused || !strings.Contains(text, "rate bound of 5 queries per second") {
			t.Fatalf("query %d over the rate: %v", i, resp)
		}
	}
	// Another source has its own bucket.
	if resp := ts.ask(t, "tcp", "127.0.0.4", "api.allowed.test", mdns.TypeA, false); resp.Rcode != mdns.RcodeSuccess {
		t.Fatalf("another source: %v", resp)
	}
	// The refusals are audited as a summary: the first at once, the other four together a
	// second after it.
	var counts []int
	for sum := 0; sum < 5; {
		e := ts.waitEvent(t)
		if e.Allow {
			continue // 127.0.0.4's answer
		}
		if e.Source != netip.MustParseAddr(src) || !strings.Contains(e.Reason, "rate bound") {
			t.Fatalf("summary %+v", e)
		}
		counts = append(counts, e.Count)
		sum += e.Count
	}
	if len(counts) != 2 || counts[0] != 1 || counts[1] != 4 {
		t.Fatalf("summaries counted %v, want [1 4]", counts)
	}
	decided, _ := ts.policy.snapshot()
	if len(decided) != 11 {
		t.Fatalf("%d decisions, want 11: a query over the bound must not reach the policy", len(decided))
	}
	ts.clock.advance(time.Second) // five tokens back
	for i := range 5 {
		if resp := ts.ask(t, "udp", src, "api.allowed.test", mdns.TypeA, true); resp.Rcode != mdns.RcodeSuccess {
			t.Fatalf("query %d a second later: %v", i, resp)
		}
	}
	if resp := ts.ask(t, "udp", src, "api.allowed.test", mdns.TypeA, true); resp.Rcode != mdns.RcodeRefused {
		t.Fatalf("the sixth query a second later: %v", resp)
	}
}

func TestMessageBounds(t *testing.T) {
	ts := newTestServer(t, 1000)
	big := func(edns bool, size int) []byte {
		m := new(mdns.Msg)
		m.SetQuestion("api.allowed.test.", mdns.TypeA)
		if edns {
			m.SetEdns0(4096, false)
		}
		txt := &mdns.TXT{Hdr: mdns.RR_Header{Name: "x.", Rrtype: mdns.TypeTXT, Class: mdns.ClassINET}}
		m.Extra = append(m.Extra, txt)
		for m.Len() < size {
			txt.Txt = append(txt.Txt, strings.Repeat("a", 200))
		}
		out, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	parse := func(b []byte) *mdns.Msg {
		m := new(mdns.Msg)
		if err := m.Unpack(b); err != nil {
			t.Fatalf("answer does not parse: %v", err)
		}
		return m
	}
	cases := map[string]struct {
		msg       []byte
		tcp       bool
		rcode     int
		reasonHas string
	}{
		"udp over 512 without EDNS":  {msg: big(false, 600), rcode: mdns.RcodeRefused, reasonHas: "without EDNS"},
		"udp over 512 with EDNS":     {msg: big(true, 600), rcode: mdns.RcodeFormatError, reasonHas: ReasonOneQ},
		"udp over 4096":              {msg: big(true, 5000), rcode: mdns.RcodeRefused, reasonHas: "more than 4096 bytes"},
		"tcp over 4096":              {msg: big(true, 5000), tcp: true, rcode: mdns.RcodeRefused, reasonHas: "more than 4096 bytes"},
		"tcp 600 bytes without EDNS": {msg: big(false, 600), tcp: true, rcode: mdns.RcodeFormatError, reasonHas: ReasonOneQ},
		"garbage":                    {msg: []byte("\x12\x34 this is not a DNS message"), rcode: mdns.RcodeFormatError, reasonHas: ReasonMalformed},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			var out []byte
			if c.tcp {
				out = ts.rawTCP(t, c.msg)
			} else {
				out = ts.rawUDP(t, c.msg)
			}
			resp := parse(out)
			if resp.Rcode != c.rcode || resp.Id != binary.BigEndian.Uint16(c.msg) || len(resp.Answer) != 0 {
				t.Fatalf("answer %v", resp)
			}
			if e := ts.waitEvent(t); e.Allow || !strings.Contains(e.Reason, c.reasonHas) {
				t.Fatalf("audit event %+v", e)
			}
		})
	}

	t.Run("one question, class IN, host names", func(t *testing.T) {
		m := new(mdns.Msg)
		m.SetQuestion("api.allowed.test.", mdns.TypeA)
		m.Question = append(m.Question, mdns.Question{Name: "b.allowed.test.", Qtype: mdns.TypeA, Qclass: mdns.ClassINET})
		if resp := ts.exchange(t, "udp", "127.0.0.1", m); resp.Rcode != mdns.RcodeFormatError || len(resp.Answer) != 0 {
			t.Fatalf("two questions: %v", resp)
		}
		m = new(mdns.Msg)
		m.SetQuestion("api.allowed.test.", mdns.TypeA)
		m.Question[0].Qclass = mdns.ClassCHAOS
		if resp := ts.exchange(t, "udp", "127.0.0.1", m); resp.Rcode != mdns.RcodeRefused {
			t.Fatalf("class CH: %v", resp)
		}
		if resp := ts.ask(t, "udp", "127.0.0.1", `a\000b.allowed.test`, mdns.TypeA, false); resp.Rcode != mdns.RcodeRefused {
			t.Fatalf("a binary label: %v", resp)
		}
		for range 3 {
			if e := ts.waitEvent(t); e.Allow {
				t.Fatalf("audit event %+v", e)
			}
		}
		decided, _ := ts.policy.snapshot()
		if len(decided) != 0 {
			t.Fatalf("malformed queries reached the policy: %v", decided)
		}
	})
}

// TestTunnellingAttempt sends what a DNS tunnel would: many queries whose names carry data in
// long random labels, of types that could carry data back (TXT, NULL), under a denied and
// under an allowed domain. Every one is refused or answered with no data, none is sent
// anywhere (the resolver has nowhere to send it), and past the burst they are refused
// without reaching the policy.
func TestTunnellingAttempt(t *testing.T) {
	ts := newTestServer(t, 20) // bursts of 40
	label := func() string {
		b := make([]byte, 31)
		_, _ = rand.Read(b)
		return hex.EncodeToString(b)[:62]
	}
	var answered, refused int
	for i := range 200 {
		domain, qt := "tunnel.example.invalid", uint16(mdns.TypeTXT)
		if i%2 == 1 {
			domain, qt = "t.allowed.test", mdns.TypeNULL
		}
		name := label() + "." + label() + "." + label() + "." + domain
		proto := "udp"
		if i%5 == 0 {
			proto = "tcp"
		}
		resp := ts.ask(t, proto, "127.0.0.5", name, qt, true)
		if len(resp.Answer)+len(resp.Ns) != 0 {
			t.Fatalf("query %d got data back: %v", i, resp)
		}
		for _, rr := range resp.Extra {
			if rr.Header().Rrtype != mdns.TypeOPT {
				t.Fatalf("query %d got a record back: %v", i, resp)
			}
		}
		switch {
		case resp.Rcode == mdns.RcodeSuccess && strings.HasSuffix(name, ".allowed.test"):
			answered++
		case resp.Rcode == mdns.RcodeRefused:
			refused++
		default:
			t.Fatalf("query %d (%s): %v", i, name, resp)
		}
	}
	decided, _ := ts.policy.snapshot()
	if len(decided) != 40 || answered != 20 || refused != 180 {
		t.Fatalf("%d decisions, %d no-data answers, %d refusals; want 40, 20, 180", len(decided), answered, refused)
	}
	_ = ts.srv.Close() // audits the pending summary
	_, events := ts.policy.snapshot()
	var overRate, denied, allowed int
	for _, e := range events {
		switch {
		case e.Allow:
			allowed++
		case strings.Contains(e.Reason, "rate bound"):
			overRate += e.Count
		default:
			denied++
		}
	}
	if allowed != 20 || denied != 20 || overRate != 160 || len(events) > 45 {
		t.Fatalf("audit: %d allowed, %d denied, %d over the rate in %d events", allowed, denied, overRate, len(events))
	}
}

func TestTCPConnectionsPerSource(t *testing.T) {
	ts := newTestServer(t, 1000)
	dial := func(src string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c, err := d.Dial("tcp", ts.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	for range maxTCPPerSource {
		dial("127.0.0.6")
	}
	// Those are accepted, in order, before the next: one more from the same source is closed
	// without an answer, while another source is served.
	query := func(c net.Conn) error {
		m := new(mdns.Msg)
		m.SetQuestion("api.allowed.test.", mdns.TypeA)
		out, _ := m.Pack()
		if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(out))), out...)); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		var l [2]byte
		_, err := io.ReadFull(c, l[:])
		return err
	}
	extra := dial("127.0.0.6")
	if err := query(extra); err == nil {
		t.Fatal("a connection over the per-source bound was served")
	}
	if err := query(dial("127.0.0.7")); err != nil {
		t.Fatalf("another source: %v", err)
	}
}
