package budget

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
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
	// Dial, when set, makes every connection to Redis (cmd/broker: upstream.Dialer's
	// DialService, which follows upstream.proxy and no_proxy); TLS, with TLS set, runs over it.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Redis keeps counters in Redis (or Valkey): one key per budget, scope and window, removed
// by its TTL after the window ends. A check is one script run (EVALSHA): read every counter,
// and add only when none is over. Takes and adds are idempotent under the client's retry.
type Redis struct {
	c      *redis.Client
	prefix string
	id     string        // random, names this client's operations (opKey)
	ops    atomic.Uint64 // operations so far
	trips  RoundTrips
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
		// A retry may run a command whose first reply was lost: takes and adds carry an id
		// (opKey) that makes the second run a no-op.
		MaxRetries: 1, ContextTimeoutEnabled: true,
		DisableIdentity: true,
	}
	if o.TLS {
		ro.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if dial := o.Dial; dial != nil {
		// go-redis runs TLS only over its own dialer: over ours, it is done here.
		tlsConf := ro.TLSConfig
		ro.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dial(ctx, network, addr)
			if err != nil || tlsConf == nil {
				return conn, err
			}
			cfg := tlsConf.Clone()
			if cfg.ServerName, _, err = net.SplitHostPort(addr); err != nil {
				conn.Close()
				return nil, err
			}
			tc := tls.Client(conn, cfg)
			if err := tc.HandshakeContext(ctx); err != nil {
				conn.Close()
				return nil, err
			}
			return tc, nil
		}
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	s := &Redis{c: redis.NewClient(ro), prefix: o.KeyPrefix, id: hex.EncodeToString(id[:])}
	s.c.AddHook(&s.trips)
	return s
}

// RoundTrips counts the round trips made through this client.
func (s *Redis) RoundTrips() *RoundTrips { return &s.trips }

// Client is the Redis client, for the approvals grants kept beside the counters.
func (s *Redis) Client() *redis.Client { return s.c }

// Prefix is the key prefix.
func (s *Redis) Prefix() string { return s.prefix }

// Close closes the client's connections.
func (s *Redis) Close() error { return s.c.Close() }

// opTTL is how long Redis remembers a take or an add it ran, by the operation's id: the
// client's retry (MaxRetries, after a reply lost to a timeout or a dropped connection) comes
// well within it, and finds the operation done.
const opTTL = 10 * time.Second

// takeScript: KEYS[1] is the take's id key, the others the counters; ARGV[1] the id key's TTL
// in ms, then, for each counter, its limit, add and TTL in ms. It returns the index (1-based)
// of the first counter at or over its limit, 0 for none, then the values. A take that added
// keeps its answer under its id: run again (a retry whose first reply was lost), it answers
// the same and adds nothing.
var takeScript = redis.NewScript(`
local done = redis.call('GET', KEYS[1])
if done then
  local out = {}
  for v in string.gmatch(done, '[^,]+') do out[#out+1] = tonumber(v) end
  return out
end
local n = #KEYS - 1
local vals = {}
for i = 1, n do
  vals[i] = tonumber(redis.call('GET', KEYS[i+1]) or '0')
end
for i = 1, n do
  if vals[i] >= tonumber(ARGV[3*i-1]) then
    local out = {i}
    for j = 1, n do out[j+1] = vals[j] end
    return out
  end
end
local out = {0}
local added = false
for i = 1, n do
  local add = tonumber(ARGV[3*i])
  if add ~= 0 then
    vals[i] = redis.call('INCRBY', KEYS[i+1], add)
    redis.call('PEXPIRE', KEYS[i+1], ARGV[3*i+1])
    added = true
  end
  out[i+1] = vals[i]
end
if added then
  local s = {}
  for i = 1, #out do s[i] = string.format('%d', out[i]) end
  redis.call('SET', KEYS[1], table.concat(s, ','), 'PX', ARGV[1])
end
return out
`)

// addScript: KEYS are the add's id key and the counter; ARGV the amount, the counter's TTL
// and the id key's TTL in ms. An add run again under the same id adds nothing.
var addScript = redis.NewScript(`
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[3]) then
  redis.call('INCRBY', KEYS[2], ARGV[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return 1
`)

// opKey names one take or add, unique across brokers: this client's random id and a count.
func (s *Redis) opKey() string {
	return s.prefix + "op:" + s.id + ":" + strconv.FormatUint(s.ops.Add(1), 36)
}

func (s *Redis) Take(ctx context.Context, cs []Counter) ([]int64, int, error) {
	keys := make([]string, len(cs)+1)
	keys[0] = s.opKey()
	args := make([]any, 0, 3*len(cs)+1)
	args = append(args, opTTL.Milliseconds())
	for i, c := range cs {
		keys[i+1] = s.prefix + c.Key
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
	return addScript.Run(ctx, s.c, []string{s.opKey(), s.prefix + key}, n, ttl.Milliseconds(), opTTL.Milliseconds()).Err()
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
