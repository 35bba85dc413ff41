package budget

import (
	"context"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// RoundTrips counts the round trips to the shared store: a command, a script run or a
// pipeline is one. Those made outside any request (heartbeats, syncs, the console) run with
// a Background context and are counted apart, so that what a request costs can be read off
// (capbroker_store_round_trips_total{kind="request"}; docs/fleet.md).
type RoundTrips struct {
	request, background atomic.Uint64
}

// Counts returns the round trips made for requests and in the background.
func (r *RoundTrips) Counts() (request, background uint64) {
	return r.request.Load(), r.background.Load()
}

type backgroundKey struct{}

// Background marks ctx as outside any request, for RoundTrips.
func Background(ctx context.Context) context.Context {
	return context.WithValue(ctx, backgroundKey{}, true)
}

func (r *RoundTrips) count(ctx context.Context) {
	if ctx.Value(backgroundKey{}) != nil {
		r.background.Add(1)
	} else {
		r.request.Add(1)
	}
}

func (r *RoundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *RoundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.count(ctx)
		return next(ctx, cmd)
	}
}

func (r *RoundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.count(ctx)
		return next(ctx, cmds)
	}
}

var _ redis.Hook = (*RoundTrips)(nil)
