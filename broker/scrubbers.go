package broker

import (
	"github.com/capbroker/capbroker/broker/scrub"
)

// responseScrubber returns the Replacer for a response from host: it redacts every value the
// broker has sent that may come back from host, in every form its binding reveals it, whether
// or not this request was granted any, and whatever the config says now (inject.Known). A
// response is where an agent would read back a secret it had an upstream store or reflect
// through an earlier request that was granted it; and an upstream connection whose framing
// went wrong could answer one request with another's response. A host no value was sent for
// gets the empty Replacer: nothing to scrub.
//
// The values the credential store holds of the credentials bound to host, and of every
// placeholder credential (inject.Set.Exposed), join the registry first, sent or not: the
// upstream that issued a key may show it unasked. One the registry has no room for is
// refused when it is about to be sent (generation.inject).
//
// When a value may still be sent to host (a binding is exposed there), the Replacer follows
// the registry (scrub.Following): a response that is still being read when a token is minted
// or a new value first sent (a stream, a WebSocket, a slow body) is scrubbed of it from then
// on. The value is recorded before it leaves, so before the upstream can write it back.
func (g *generation) responseScrubber(host string) *scrub.Replacer {
	exposed := g.bindings.Exposed(host)
	for _, b := range exposed {
		for _, v := range g.secrets.Known(b.Name) {
			g.known.Hold(b, v)
		}
	}
	if len(exposed) == 0 {
		return g.known.Scrubber(host)
	}
	return g.known.Following(host)
}

// redactor returns the Replacer that replaces each of patterns with redacted.
func redactor(patterns []string) *scrub.Replacer {
	pairs := make([]string, 0, 2*len(patterns))
	for _, p := range patterns {
		pairs = append(pairs, p, redacted)
	}
	return scrub.New(pairs...)
}
