package budget

import (
	"context"
	"testing"

	"github.com/capbroker/capbroker/broker/budget/redistest"
	"github.com/capbroker/capbroker/internal/svcdial/svcdialtest"
)

// RedisOptions.Dial makes every connection to Redis (cmd/broker passes DialService, so Redis
// reached by name follows upstream.proxy and no_proxy).
func TestRedisUsesInjectedDial(t *testing.T) {
	srv := redistest.Start(t)
	var rec svcdialtest.Recorder
	st := NewRedis(RedisOptions{Address: srv.Addr, KeyPrefix: "dial:", Dial: rec.Dial})
	t.Cleanup(func() { st.Close() })
	if _, err := st.Get(context.Background(), []string{"k"}); err != nil {
		t.Fatal(err)
	}
	if rec.Count() == 0 {
		t.Fatal("the Redis client did not dial through RedisOptions.Dial")
	}
}
