package dns

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	mdns "github.com/miekg/dns"

	"github.com/capbroker/capbroker/broker/transparent"
)

// Reasons of the resolver's own refusals (the policy's come from Policy.Decide).
const (
	ReasonMalformed = "not a well-formed DNS query"
	ReasonOneQ      = "a query must carry exactly one question and no records"
	ReasonNotHost   = "not a host name (letters, digits, '-' and '_' in labels)"
	ReasonReverse   = "reverse lookups are answered only for the resolver's own addresses"
)

// maxEDEText bounds the reason text in a refusal.
const maxEDEText = 240

// answer answers one message of size bytes on the wire (raw holds it, or its first
// maxMessage+1 bytes) from src; nil sends nothing.
func (s *Server) answer(raw []byte, size int, src netip.Addr, proto string) []byte {
	if len(raw) < 12 {
		return nil // not even a header: there is no ID to answer
	}
	q := Query{Source: src, Proto: proto}
	var req *mdns.Msg // nil: too large to read, or not a DNS message
	parseErr := error(nil)
	if size <= maxMessage {
		m := new(mdns.Msg)
		if parseErr = m.Unpack(raw); parseErr == nil {
			req = m
		}
	}
	if req != nil {
		if req.Response {
			return nil // never answer an answer
		}
		if len(req.Question) > 0 {
			q.Name, q.Type = transparent.Canonical(req.Question[0].Name), typeName(req.Question[0].Qtype)
		}
	}
	// The rate bound comes first: it bounds everything else, audit events included.
	if !s.rate.take(q) {
		return s.refuse(req, raw, q, mdns.ExtendedErrorCodeOther, s.rate.reason(), false)
	}
	switch {
	case size > maxMessage:
		return s.refuse(nil, raw, q, mdns.ExtendedErrorCodeOther,
			fmt.Sprintf("a DNS message of more than %d bytes", maxMessage), true)
	case parseErr != nil:
		return s.reply(nil, raw, q, mdns.RcodeFormatError, mdns.ExtendedErrorCodeOther, ReasonMalformed, true)
	case proto == "udp" && size > maxPlainUDP && req.IsEdns0() == nil:
		return s.refuse(req, raw, q, mdns.ExtendedErrorCodeOther,
			fmt.Sprintf("a UDP query of %d bytes without EDNS (more than %d)", size, maxPlainUDP), true)
	case req.Opcode != mdns.OpcodeQuery:
		return s.reply(req, raw, q, mdns.RcodeNotImplemented, mdns.ExtendedErrorCodeNotSupported,
			"opcode "+opcodeName(req.Opcode)+" is not served", true)
	case len(req.Question) != 1 || len(req.Answer) > 0 || len(req.Ns) > 0 || extraRecords(req) > 0:
		return s.reply(req, raw, q, mdns.RcodeFormatError, mdns.ExtendedErrorCodeOther, ReasonOneQ, true)
	case req.Question[0].Qclass != mdns.ClassINET:
		return s.refuse(req, raw, q, mdns.ExtendedErrorCodeNotSupported,
			"class "+className(req.Question[0].Qclass)+" is not served (IN only)", true)
	case !isHostName(q.Name):
		return s.refuse(req, raw, q, mdns.ExtendedErrorCodeBlocked, ReasonNotHost, true)
	}

	qtype := req.Question[0].Qtype
	if qtype == mdns.TypePTR {
		return s.answerPTR(req, raw, q)
	}
	v := s.decide(q)
	if (!v.Allow || v.WouldDeny) && v.Agent != "" && s.ownName(q.Name) {
		// The sandbox asking about itself (its host name, as getaddrinfo and sudo do): no
		// such name, and no audit event for what is not an attempt to go anywhere.
		s.o.Log.Debug().Str("agent", v.Agent).Str("host", q.Name).Msg("resolver: the sandbox's own name answered NXDOMAIN")
		return s.pack(s.newReply(req, mdns.RcodeNameError), req, proto)
	}
	if !v.Allow {
		return s.denied(req, raw, q, v)
	}
	s.answered(q, v)
	resp := s.newReply(req, mdns.RcodeSuccess)
	if qtype == mdns.TypeA || qtype == mdns.TypeAAAA {
		if a, ok := s.o.Names.Assign(q.Name, qtype == mdns.TypeAAAA); ok {
			resp.Answer = append(resp.Answer, addrRecord(req.Question[0].Name, a, s.ttl()))
		}
	}
	// Any other type of an allowed name (HTTPS, SVCB, TXT, MX...) has no data: no QUIC or
	// ECH hints, nothing a client could use to go around the pool address.
	return s.pack(resp, req, proto)
}

// answerPTR answers a reverse lookup of a pool address with the name it was answered for,
// when the agent could be answered that name.
func (s *Server) answerPTR(req *mdns.Msg, raw []byte, q Query) []byte {
	a, ok := reverseAddr(q.Name)
	if !ok || !s.o.Names.InPool(a) {
		return s.refuse(req, raw, q, mdns.ExtendedErrorCodeBlocked, ReasonReverse, true)
	}
	name, ok := s.o.Names.Name(a)
	if !ok {
		return s.pack(s.newReply(req, mdns.RcodeNameError), req, q.Proto) // ours, not (or no longer) given out
	}
	arpa := q.Name
	q.Name = name
	v := s.decide(q)
	if !v.Allow {
		return s.denied(req, raw, q, v)
	}
	s.answered(q, v)
	resp := s.newReply(req, mdns.RcodeSuccess)
	resp.Answer = append(resp.Answer, &mdns.PTR{
		Hdr: mdns.RR_Header{Name: mdns.Fqdn(arpa), Rrtype: mdns.TypePTR, Class: mdns.ClassINET, Ttl: s.ttl()},
		Ptr: mdns.Fqdn(name),
	})
	return s.pack(resp, req, q.Proto)
}

func (s *Server) decide(q Query) Verdict {
	ctx, cancel := context.WithTimeout(s.ctx, decideTimeout)
	defer cancel()
	return s.o.Policy.Decide(ctx, q)
}

// answered audits an answer, once per agent and name per TTL.
func (s *Server) answered(q Query, v Verdict) {
	if s.seen.first(v.Agent, q.Name, s.o.Now(), s.o.TTL) {
		s.o.Policy.Audit(Event{Query: q, Verdict: v, Count: 1})
	}
}

// denied refuses a name the policy denied, or asked about by a source no agent has.
func (s *Server) denied(req *mdns.Msg, raw []byte, q Query, v Verdict) []byte {
	code := uint16(mdns.ExtendedErrorCodeBlocked)
	if v.Agent == "" {
		code = mdns.ExtendedErrorCodeProhibited
	}
	s.o.Policy.Audit(Event{Query: q, Verdict: v, Count: 1})
	return s.reply(req, raw, q, mdns.RcodeRefused, code, v.Reason, false)
}

// refuse answers REFUSED with reason as the EDE text, and audits the refusal (audit false:
// the caller has).
func (s *Server) refuse(req *mdns.Msg, raw []byte, q Query, code uint16, reason string, audit bool) []byte {
	return s.reply(req, raw, q, mdns.RcodeRefused, code, reason, audit)
}

func (s *Server) reply(req *mdns.Msg, raw []byte, q Query, rcode int, code uint16, reason string, audit bool) []byte {
	if audit {
		s.o.Policy.Audit(Event{Query: q, Verdict: Verdict{Reason: reason}, Count: 1})
	}
	if req == nil || len(req.Question) == 0 {
		// No question to echo: the header alone, with the query's ID.
		resp := &mdns.Msg{MsgHdr: mdns.MsgHdr{Id: binary.BigEndian.Uint16(raw), Response: true, Rcode: rcode}}
		out, err := resp.Pack()
		if err != nil {
			return nil
		}
		return out
	}
	resp := s.newReply(req, rcode)
	if opt := resp.IsEdns0(); opt != nil {
		if len(reason) > maxEDEText {
			reason = reason[:maxEDEText]
		}
		opt.Option = append(opt.Option, &mdns.EDNS0_EDE{InfoCode: code, ExtraText: reason})
	}
	return s.pack(resp, req, q.Proto)
}

// newReply is the reply to req: its ID and question, recursion available (stub resolvers
// ignore answers without it), and an OPT record when req had one.
func (s *Server) newReply(req *mdns.Msg, rcode int) *mdns.Msg {
	resp := new(mdns.Msg)
	resp.SetRcode(req, rcode)
	resp.RecursionAvailable = true
	if req.IsEdns0() != nil {
		resp.SetEdns0(maxMessage, false)
	}
	return resp
}

// pack packs resp, truncated to what the client said it can take over UDP.
func (s *Server) pack(resp, req *mdns.Msg, proto string) []byte {
	limit := maxMessage
	if proto == "udp" {
		limit = maxPlainUDP
		if opt := req.IsEdns0(); opt != nil && int(opt.UDPSize()) > limit {
			limit = min(int(opt.UDPSize()), maxMessage)
		}
	}
	resp.Compress = true
	if resp.Len() > limit {
		resp.Truncate(limit)
	}
	out, err := resp.Pack()
	if err != nil {
		s.o.Log.Warn().Err(err).Msg("resolver: packing an answer")
		return nil
	}
	return out
}

func (s *Server) ttl() uint32 {
	secs := int64(s.o.TTL.Seconds())
	if secs < 1 {
		secs = 1
	}
	return uint32(secs)
}

func addrRecord(name string, a netip.Addr, ttl uint32) mdns.RR {
	hdr := mdns.RR_Header{Name: name, Class: mdns.ClassINET, Ttl: ttl}
	if a.Is4() {
		hdr.Rrtype = mdns.TypeA
		return &mdns.A{Hdr: hdr, A: a.AsSlice()}
	}
	hdr.Rrtype = mdns.TypeAAAA
	return &mdns.AAAA{Hdr: hdr, AAAA: a.AsSlice()}
}

// extraRecords counts the additional section's records other than OPT.
func extraRecords(m *mdns.Msg) int {
	n := 0
	for _, rr := range m.Extra {
		if rr.Header().Rrtype != mdns.TypeOPT {
			n++
		}
	}
	return n
}

// ownName reports whether name (canonical) is one a sandbox looks up about itself: a single
// label (a container's host name; search domains are not the resolver's), localhost or a name
// under it, or one of Options.HostNames. The policy is asked first: such a name it allows is
// answered as any other.
func (s *Server) ownName(name string) bool {
	if !strings.Contains(name, ".") || name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	for _, h := range s.o.HostNames {
		if name == h {
			return true
		}
	}
	return false
}

// isHostName reports whether name (canonical) is a host name: labels of letters, digits,
// '-' and '_' (as in _service labels). Anything else (escaped bytes, spaces) is refused: no
// binary data in names, and nothing odd reaches the policy or the audit log.
func isHostName(name string) bool {
	if name == "" || len(name) > 253 {
		return false
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// reverseAddr is the address of a reverse-lookup name (canonical, e.g.
// "7.0.18.198.in-addr.arpa", or 32 nibbles under "ip6.arpa").
func reverseAddr(name string) (netip.Addr, bool) {
	if rest, ok := strings.CutSuffix(name, ".in-addr.arpa"); ok {
		parts := strings.Split(rest, ".")
		if len(parts) != 4 {
			return netip.Addr{}, false
		}
		var b [4]byte
		for i, p := range parts {
			v, err := strconv.ParseUint(p, 10, 8)
			if err != nil || (len(p) > 1 && p[0] == '0') {
				return netip.Addr{}, false
			}
			b[3-i] = byte(v)
		}
		return netip.AddrFrom4(b), true
	}
	if rest, ok := strings.CutSuffix(name, ".ip6.arpa"); ok {
		parts := strings.Split(rest, ".")
		if len(parts) != 32 {
			return netip.Addr{}, false
		}
		var b [16]byte
		for i, p := range parts {
			v, err := strconv.ParseUint(p, 16, 8)
			if err != nil || len(p) != 1 {
				return netip.Addr{}, false
			}
			nib := 31 - i // parts run from the lowest nibble
			if nib%2 == 0 {
				b[nib/2] |= byte(v) << 4
			} else {
				b[nib/2] |= byte(v)
			}
		}
		return netip.AddrFrom16(b), true
	}
	return netip.Addr{}, false
}

func typeName(t uint16) string {
	if s, ok := mdns.TypeToString[t]; ok {
		return s
	}
	return "TYPE" + strconv.Itoa(int(t))
}

func className(c uint16) string {
	if s, ok := mdns.ClassToString[c]; ok {
		return s
	}
	return "CLASS" + strconv.Itoa(int(c))
}

func opcodeName(o int) string {
	if s, ok := mdns.OpcodeToString[o]; ok {
		return s
	}
	return strconv.Itoa(o)
}
