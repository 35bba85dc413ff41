package broker

import (
	"iter"
	"slices"
	"sync/atomic"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/inject"
	"github.com/capbroker/capbroker/broker/scrub"
)

// responseScrubber returns the Replacer for a response from host: it redacts every known
// value (Secrets.Known) of every credential bound to host, and of every placeholder
// credential (inject.Set.Exposed), in every form its binding reveals, whether or not the
// request was granted any. A response is where an agent would read back a secret it had an
// upstream store or reflect through an earlier request that was granted it; and an upstream
// connection whose framing went wrong could answer one request with another's response. A
// host no such credential is bound to gets the empty Replacer: nothing to scrub.
//
// A bound credential this broker has never read has no value to scrub; it cannot have been
// sent by this broker either.
func (g *generation) responseScrubber(host string) *scrub.Replacer {
	exposed := g.bindings.Exposed(host)
	if len(exposed) == 0 {
		return scrub.New()
	}
	if c := g.scrubbers.last(exposed[0].Name); c != nil && g.revealsJust(exposed, c.patterns) {
		return c.r // the usual answer: no pattern has changed, and none was collected
	}
	return g.scrubbers.get(exposed[0].Name, slices.Collect(g.patterns(exposed)))
}

// patterns yields what a response from a host exposed is bound to is scrubbed of: the forms
// its bindings reveal of each known value of each, in order.
func (g *generation) patterns(exposed []*inject.Binding) iter.Seq[string] {
	return func(yield func(string) bool) {
		for _, bd := range exposed {
			for _, v := range g.secrets.Known(bd.Name) {
				for _, part := range v.Values() { // each field of a secret with several
					for _, p := range bd.Reveals(part) {
						if !yield(p) {
							return
						}
					}
				}
			}
		}
	}
}

// scrubbers keeps, for each credential, the Replacer built for the last response from a host
// it is the first bound credential of, so that responses from hosts with the same secrets
// share one instead of each building its own (three allocations and a copy of every secret).
// It is checked against every pattern, so a rotated secret, or another set of bound
// credentials, builds anew.
type scrubbers map[string]*atomic.Pointer[scrubber]

type scrubber struct {
	patterns []string
	r        *scrub.Replacer
}

func newScrubbers(creds []config.Credential) scrubbers {
	s := make(scrubbers, len(creds))
	for _, c := range creds {
		s[c.Name] = new(atomic.Pointer[scrubber])
	}
	return s
}

// revealsJust reports whether g.patterns(exposed) are patterns.
func (g *generation) revealsJust(exposed []*inject.Binding, patterns []string) bool {
	i := 0
	for p := range g.patterns(exposed) {
		if i == len(patterns) || patterns[i] != p {
			return false
		}
		i++
	}
	return i == len(patterns)
}

// last returns the scrubber last built for first, or nil.
func (s scrubbers) last(first string) *scrubber {
	if last := s[first]; last != nil {
		return last.Load()
	}
	return nil
}

// get returns the Replacer that redacts patterns, the forms of the secrets bound to a host
// whose first bound credential is first.
func (s scrubbers) get(first string, patterns []string) *scrub.Replacer {
	last := s[first]
	if last == nil {
		return redactor(patterns)
	}
	if c := last.Load(); c != nil && slices.Equal(c.patterns, patterns) {
		return c.r
	}
	r := redactor(patterns)
	last.Store(&scrubber{patterns: patterns, r: r})
	return r
}

// redactor returns the Replacer that replaces each of patterns with redacted.
func redactor(patterns []string) *scrub.Replacer {
	pairs := make([]string, 0, 2*len(patterns))
	for _, p := range patterns {
		pairs = append(pairs, p, redacted)
	}
	return scrub.New(pairs...)
}
