package budget

import (
	"context"
	"testing"

	"github.com/capbroker/capbroker/broker/budget/redistest"
	"github.com/capbroker/capbroker/broker/usage"
)

// BenchmarkCheck is the decision path alone: one Check against a budget never spent, in
// memory and in a real redis-server on loopback, for a requests budget (counted at the check)
// only and a tokens budget only (read at the check); "record" is the end of a metered call (Record).
func BenchmarkCheck(b *testing.B) {
	const requests = `{"budgets": {"req": {"agent": "a", "requests": 1000000000000, "window": "day"}}}`
	const tokens = `{"budgets": {"tok": {"agent": "a", "provider": "openai", "tokens": 1000000000000, "window": "day"}}}`
	srv := redistest.Start(b)
	ctx := context.Background()
	for _, store := range []string{"memory", "redis"} {
		bu := func(b *testing.B, doc string) *Budgets {
			if store == "memory" {
				return newBudgets(b, doc, Options{})
			}
			st := NewRedis(RedisOptions{Address: srv.Addr, KeyPrefix: "bench:"})
			b.Cleanup(func() { st.Close() })
			return newBudgets(b, doc, Options{Store: st})
		}
		b.Run(store+"/requests", func(b *testing.B) {
			x := bu(b, requests)
			for b.Loop() {
				if err := x.Check(ctx, Request{Agent: "a"}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(store+"/tokens", func(b *testing.B) {
			x := bu(b, tokens)
			for b.Loop() {
				if err := x.Check(ctx, Request{Agent: "a", Provider: "openai"}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(store+"/record", func(b *testing.B) {
			x := bu(b, tokens)
			for b.Loop() {
				x.Record(usage.Call{Agent: "a", Provider: "openai", Model: "m", In: 10, Out: 5, Reported: true})
			}
		})
	}
}
