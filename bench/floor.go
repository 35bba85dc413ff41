package main

import (
	"context"
	"os"
)

// floorPairs is -only floor: the bare intercepted path over the relay (the floor of an
// intercepting proxy on this machine) and the full pipeline over the bare intercepted path,
// each in pairs of adjacent slices at conns connections, with the broker's CPU per request
// over the relay's in the same pairs. It is what a change to the intercepted path's per-request
// work is measured by: the relay does not change with the broker, so the ratio to it moves
// with the broker alone, whatever the machine's state.
func floorPairs(ctx context.Context, up *upstream, p *pki, intercept, full *path, o options) error {
	relay, stop, err := startOnePeer(ctx, up, p, "relay")
	if err != nil {
		return err
	}
	defer stop()
	for _, pa := range []*path{relay, intercept, full} {
		pa.client = pa.withConns(p, o.conns)
	}
	n := max(o.pairs, 1)
	ir := pairedRatio(ctx, intercept, relay, o.conns, n, o.slice)
	fi := pairedRatio(ctx, full, intercept, o.conns, n, o.slice)
	ir.print(os.Stdout, "intercept/relay")
	fi.print(os.Stdout, "full/intercept")
	return nil
}
