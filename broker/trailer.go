package broker

import (
	"io"
	"net/http"
	"strings"

	"github.com/capbroker/capbroker/broker/scrub"
	"github.com/capbroker/capbroker/broker/wire"
)

// Trailers are header fields sent after a body: gRPC carries its status in them (grpc-status,
// grpc-message). They travel both ways through an intercepted tunnel, held to the same rules
// as headers: a response trailer is scrubbed like a response header, and a request trailer
// can carry neither a hop-by-hop field nor a credential-bearing one.

// forwardTrailers makes out carry r's allowed trailers. Their values exist only once r's body
// has been read to its end (the server fills r.Trailer just before the body's io.EOF), so out
// gets its own map declaring the allowed names now, and the values are copied into it at that
// io.EOF: the transport reads the body, then sends out.Trailer.
func (g *generation) forwardTrailers(r, out *http.Request) {
	out.Trailer = nil
	if len(r.Trailer) == 0 || out.Body == nil || out.Body == http.NoBody {
		return
	}
	out.Trailer = make(http.Header, len(r.Trailer))
	for k := range r.Trailer {
		if g.trailerAllowed(k) {
			out.Trailer[k] = nil
		}
	}
	out.Body = &trailerCopier{ReadCloser: out.Body, src: r, dst: out, allowed: g.trailerAllowed}
}

// trailerAllowed reports whether an agent's request trailer may be forwarded: never a
// hop-by-hop field, nor one that carries credentials (which could duplicate an injected one),
// nor a decision-relevant one (the policy never saw it: wire.IsDecisionHeader).
func (g *generation) trailerAllowed(name string) bool {
	return !isHopByHop(name) && !g.bindings.CredentialHeader(strings.ToLower(name)) && !wire.IsDecisionHeader(name)
}

// trailerCopier copies src's trailer values into dst when the body reaches its end.
type trailerCopier struct {
	io.ReadCloser
	src, dst *http.Request
	allowed  func(string) bool
	copied   bool
}

func (t *trailerCopier) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	if err == io.EOF && !t.copied {
		t.copied = true
		for k, vs := range t.src.Trailer {
			if len(vs) > 0 && t.allowed(k) {
				t.dst.Trailer[k] = vs
			}
		}
	}
	return n, err
}

// trailerScrubber scrubs resp's trailers when its body reaches the end: that is when the
// transport fills in their values, and before anyone can copy them to the agent.
type trailerScrubber struct {
	io.ReadCloser
	resp *http.Response
	s    *scrub.Replacer
}

func (t *trailerScrubber) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	if err == io.EOF {
		t.s.Header(t.resp.Trailer)
	}
	return n, err
}
