package broker

import (
	"slices"
	"sync/atomic"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/scrub"
)

// scrubbers keeps, for each credential, the Replacer built for the last request granted it, so
// that requests carrying the same secrets share one instead of each building its own (three
// allocations and a copy of every secret). It is keyed by the first granted credential and
// checked against every pattern, so a rotated secret, or another set of grants, builds anew.
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

// get returns the Replacer that redacts patterns, the forms of the secrets of a request whose
// first granted credential is first.
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
