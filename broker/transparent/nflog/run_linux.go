package nflog

import (
	"context"
	"errors"
	"os"
	"time"
)

// Run reads r until ctx ends (then closes it), calling refuse with the first packet of each
// flow per Window, and onErr with read errors worth logging (lost messages). It returns when
// ctx ends or the socket fails.
func Run(ctx context.Context, r *Reader, refuse func(Packet), onErr func(error)) error {
	stop := context.AfterFunc(ctx, func() { r.Close() })
	defer stop()
	var flows Flows
	for {
		pkts, err := r.Read()
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrOverrun):
			onErr(err)
			continue
		case errors.Is(err, os.ErrClosed):
			return nil
		case err != nil:
			return err
		}
		now := time.Now()
		for _, p := range pkts {
			if flows.First(p, now) {
				refuse(p)
			}
		}
	}
}
