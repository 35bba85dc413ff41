package dns

import (
	"net/netip"
	"testing"

	mdns "github.com/miekg/dns"
)

// BenchmarkAnswer is one query's work without the sockets: parse, bound, decide (a fake
// policy), answer. allowed: an A query for an allowed name (audited once); denied: a TXT
// query for a denied one (audited every time, into a channel drained here).
func BenchmarkAnswer(b *testing.B) {
	for name, c := range map[string]struct {
		qname string
		qtype uint16
	}{"allowed": {"api.allowed.test.", mdns.TypeA}, "denied": {"x.example.invalid.", mdns.TypeTXT}} {
		b.Run(name, func(b *testing.B) {
			ts := newTestServer(b, 1<<30)
			go func() {
				for range ts.policy.audited {
				}
			}()
			m := new(mdns.Msg)
			m.SetQuestion(c.qname, c.qtype)
			m.SetEdns0(1232, false)
			raw, _ := m.Pack()
			src := netip.MustParseAddr("127.0.0.1")
			b.ReportAllocs()
			for b.Loop() {
				if out := ts.srv.answer(raw, len(raw), src, "udp"); out == nil {
					b.Fatal("no answer")
				}
			}
		})
	}
}
