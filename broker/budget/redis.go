package budget

import (
	"context"
	"crypto/tls"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisOptions configure the shared store.
type RedisOptions struct {
	Address  string
	Password string
	TLS      bool
	// KeyPrefix starts every key (default "capbroker:").
	KeyPrefix string
	// Timeout bounds each round trip, dial included (default 250ms): a store that does not
	// answer costs a request at most this, then the budget's on_store_error applies.
	Timeout time.Duration
}

// Redis keeps counters in Redis (or Valkey): one key per budget, scope and window, removed
// by its TTL after the window ends. A check is one script run (EVALSHA): read every counter,
// and add only when none is over.
type Redis struct {
	c      *redis.Client
	prefix string
}

// quiet drops the client's own log lines (a failed dial, say): the broker logs and counts
// store errors itself, without the client's wording.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

var setLogger sync.Once

// NewRedis returns the store; it does not dial until it is used.
func NewRedis(o RedisOptions) *Redis {
	setLogger.Do(func() { redis.SetLogger(quiet{}) })
	if o.KeyPrefix == "" {
		o.KeyPrefix = "capbroker:"
	}
	if o.Timeout == 0 {
		o.Timeout = 250 * time.Millisecond
	}
	ro := &redis.Options{
		Addr: o.Address, Password: o.Password,
		DialTimeout: o.Timeout, ReadTimeout: o.Timeout, WriteTimeout: o.Timeout,
		// One retry: after a Redis restart the first command finds its pooled connection closed.
		MaxRetries: 1, ContextTimeoutEnabled: true,
		DisableIdentity: true,
	}
	if o.TLS {
		ro.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return &Redis{c: redis.NewClient(ro), prefix: o.KeyPrefix}
}

// Client is the Redis client, for the approvals grants kept beside the counters.
func (s *Redis) Client() *redis.Client { return s.c }

// Prefix is the key prefix.
func (s *Redis) Prefix() string { return s.prefix }

// Close closes the client's connections.
func (s *Redis) Close() error { return s.c.Close() }

// takeScript: KEYS are the counters; ARGV, for each, its limit, add and TTL in ms. It returns
// the index (1-based) of the first counter at or over its limit, 0 for none, then the values.
var takeScript = redis.NewScript(`
local vals = {}
for i = 1, #KEYS do
  vals[i] = tonumber(redis.call('GET', KEYS[i]) or '0')
end
for i = 1, #KEYS do
  if vals[i] >= tonumber(ARGV[3*i-2]) then
    local out = {i}
    for j = 1, #KEYS do out[j+1] = vals[j] end
    return out
  end
end
local out = {0}
for i = 1, #KEYS do
  local add = tonumber(ARGV[3*i-1])
  if add ~= 0 then
    vals[i] = redis.call('INCRBY', KEYS[i], add)
    redis.call('PEXPIRE', KEYS[i], ARGV[3*i])
  end
  out[i+1] = vals[i]
end
return out
`)

func (s *Redis) Take(ctx context.Context, cs []Counter) ([]int64, int, error) {
	keys := make([]string, len(cs))
	args := make([]any, 0, 3*len(cs))
	for i, c := range cs {
		keys[i] = s.prefix + c.Key
		args = append(args, c.Limit, c.Add, c.TTL.Milliseconds())
	}
	res, err := takeScript.Run(ctx, s.c, keys, args...).Int64Slice()
	if err != nil {
		return nil, 0, err
	}
	if len(res) != len(cs)+1 {
		return nil, 0, fmt.Errorf("budget store: the script answered %d values for %d counters", len(res), len(cs))
	}
	return res[1:], int(res[0]) - 1, nil
}

func (s *Redis) Add(ctx context.Context, key string, n int64, ttl time.Duration) error {
	_, err := s.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.IncrBy(ctx, s.prefix+key, n)
		p.PExpire(ctx, s.prefix+key, ttl)
		return nil
	})
	return err
}

func (s *Redis) Get(ctx context.Context, keys []string) ([]int64, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	full := make([]string, len(keys))
	for i, k := range keys {
		full[i] = s.prefix + k
	}
	vs, err := s.c.MGet(ctx, full...).Result()
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(keys))
	for i, v := range vs {
		if str, ok := v.(string); ok {
			out[i], _ = strconv.ParseInt(str, 10, 64)
		}
	}
	return out, nil
}
