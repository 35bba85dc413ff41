package broker

import (
	"slices"
	"strings"

	"github.com/capbroker/capbroker/broker/inject"
	"github.com/capbroker/capbroker/broker/upstream"
)

// poolFor is the upstream pool of a request: its agent and the set of credentials granted to
// it. Requests share upstream connections only within a pool, so that a response that crosses
// over on a connection the upstream read differently from the broker reaches neither another
// agent nor a request scrubbed for other secrets (or none). Agent ids and credential names
// cannot hold a NUL (config validation), so the joined form is unambiguous.
func poolFor(agent string, granted []*inject.Binding) upstream.Pool {
	switch len(granted) {
	case 0:
		return upstream.Pool(agent)
	case 1:
		return upstream.Pool(agent + "\x00" + granted[0].Name)
	}
	names := make([]string, len(granted))
	for i, g := range granted {
		names[i] = g.Name
	}
	slices.Sort(names)
	return upstream.Pool(agent + "\x00" + strings.Join(slices.Compact(names), "\x00"))
}
