package main

import (
	"context"
	"os"
)

// tunnelPairs is -only tunnel-pairs: the opaque tunnel over smokescreen's, in pairs of
// adjacent slices at conns connections, with the broker's CPU per request over smokescreen's
// in the same pairs. It is what a change to the tunnel's copy is measured by (issue 25's
// target: the tunnel at least smokescreen's, 1.0x), without the rest of the bench.
func tunnelPairs(ctx context.Context, up *upstream, p *pki, tunnel *path, o options) error {
	smokescreen, stop, err := startOnePeer(ctx, up, p, "smokescreen")
	if err != nil {
		return err
	}
	defer stop()
	for _, pa := range []*path{tunnel, smokescreen} {
		pa.client = pa.withConns(p, o.conns)
	}
	r := pairedRatio(ctx, tunnel, smokescreen, o.conns, max(o.pairs, 1), o.slice)
	r.print(os.Stdout, "tunnel/smokescreen")
	return nil
}
