package budget

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Caps bound each agent's request rate and open connections across a fleet of brokers
// (fleet.agent_requests_per_second, fleet.agent_connections). A request or a connection
// costs no round trip to the store: each broker counts its own, and every SyncInterval
// writes its counts and reads the others' in one pipeline. A broker decides on its own
// count now plus the others' as last read, so the others' are at most SyncInterval (plus
// one round trip) late: in a one-second window the fleet lets through the cap plus at most
// what the other brokers let through in that lag.
//
// Keys (docs/fleet.md):
//
//	PREFIX caps:rate:UNIXSECOND   hash: INSTANCE|AGENT -> requests in that second (TTL 3s)
//	PREFIX caps:conns:INSTANCE    hash: AGENT -> connections open (TTL 3 × SyncInterval)
//	PREFIX caps:members           sorted set: INSTANCE scored by its last sync (ms)
type Caps struct {
	c         *redis.Client
	prefix    string
	instance  string
	rate      int
	conns     int
	failClose bool
	now       func() time.Time

	mu         sync.Mutex
	second     int64
	reqs       map[string]int // this broker's requests this second, by agent
	otherReqs  map[string]int // the other brokers', as last read, for second
	open       map[string]int // this broker's open connections, by agent
	otherConns map[string]int // the other brokers', as last read

	healthy  atomic.Bool // the last sync succeeded, within staleAfter
	lastSync atomic.Int64
}

// SyncInterval is how often a broker writes its counts and reads the others'.
const SyncInterval = 100 * time.Millisecond

// staleAfter is how old the last good sync may be before the store counts as unreachable.
const staleAfter = 10 * SyncInterval

// CapsOptions configure Caps.
type CapsOptions struct {
	Store    *Redis
	Instance string
	// RequestsPerSecond and Connections cap each agent across the fleet; 0 is no cap.
	RequestsPerSecond, Connections int
	// FailClosed refuses what is capped while the store is unreachable (503); otherwise each
	// broker applies the caps to its own counts alone.
	FailClosed bool
	Now        func() time.Time
}

// Errors of Caps.
var (
	ErrRateCapped   = errors.New("the agent's requests per second across the fleet are at fleet.agent_requests_per_second")
	ErrConnsCapped  = errors.New("the agent's open connections across the fleet are at fleet.agent_connections")
	ErrCapsUnusable = errors.New("the fleet's shared store is unreachable and its caps fail closed")
)

// NewCaps returns the caps; Run keeps them in sync.
func NewCaps(o CapsOptions) *Caps {
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Caps{c: o.Store.Client(), prefix: o.Store.Prefix() + "caps:", instance: o.Instance, rate: o.RequestsPerSecond,
		conns: o.Connections, failClose: o.FailClosed, now: o.Now,
		reqs: map[string]int{}, otherReqs: map[string]int{}, open: map[string]int{}, otherConns: map[string]int{}}
}

func (c *Caps) unusable() bool {
	return c.failClose && (!c.healthy.Load() || c.now().UnixMilli()-c.lastSync.Load() > staleAfter.Milliseconds())
}

// roll starts a new second's counts. c.mu must be held.
func (c *Caps) roll(now int64) {
	if now != c.second {
		c.second = now
		clear(c.reqs)
		clear(c.otherReqs)
	}
}

// Request counts one request of agent, or refuses it when the agent is at its rate.
func (c *Caps) Request(agent string) error {
	if c.rate <= 0 {
		return nil
	}
	if c.unusable() {
		return ErrCapsUnusable
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.roll(c.now().Unix())
	if c.reqs[agent]+c.otherReqs[agent] >= c.rate {
		return ErrRateCapped
	}
	c.reqs[agent]++
	return nil
}

// Claim counts one more open connection of agent, or refuses it: ErrConnsCapped when the
// agent has its cap open across the fleet, ErrCapsUnusable when the store is unreachable and
// the caps fail closed.
func (c *Caps) Claim(agent string) error {
	if c.conns <= 0 {
		return nil
	}
	if c.unusable() {
		return ErrCapsUnusable
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open[agent]+c.otherConns[agent] >= c.conns {
		return ErrConnsCapped
	}
	c.open[agent]++
	return nil
}

// Release gives back a connection Claim counted.
func (c *Caps) Release(agent string) {
	if c.conns <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open[agent]--; c.open[agent] <= 0 {
		delete(c.open, agent)
	}
}

// Run syncs every SyncInterval until ctx ends, then withdraws this broker's counts.
func (c *Caps) Run(ctx context.Context) {
	ctx = Background(ctx)
	t := time.NewTicker(SyncInterval)
	defer t.Stop()
	for {
		c.sync(ctx)
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(Background(context.Background()), time.Second)
			c.c.Del(dctx, c.prefix+"conns:"+c.instance)
			c.c.ZRem(dctx, c.prefix+"members", c.instance)
			cancel()
			return
		case <-t.C:
		}
	}
}

// sync writes this broker's counts and reads the fleet's: one pipeline, then one more to
// read the other members' connections.
func (c *Caps) sync(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*SyncInterval)
	defer cancel()
	now := c.now()
	c.mu.Lock()
	c.roll(now.Unix())
	second := c.second
	reqs := make(map[string]any, len(c.reqs))
	for a, n := range c.reqs {
		reqs[c.instance+"|"+a] = n
	}
	open := make(map[string]any, len(c.open))
	for a, n := range c.open {
		open[a] = n
	}
	c.mu.Unlock()

	rateKey := c.prefix + "rate:" + strconv.FormatInt(second, 10)
	connKey := c.prefix + "conns:" + c.instance
	members := c.prefix + "members"
	var rate *redis.MapStringStringCmd
	var live *redis.StringSliceCmd
	_, err := c.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		if len(reqs) > 0 {
			p.HSet(ctx, rateKey, reqs)
			p.Expire(ctx, rateKey, 3*time.Second)
		}
		p.Del(ctx, connKey)
		if len(open) > 0 {
			p.HSet(ctx, connKey, open)
			p.PExpire(ctx, connKey, 3*SyncInterval*10)
		}
		p.ZAdd(ctx, members, redis.Z{Score: float64(now.UnixMilli()), Member: c.instance})
		p.ZRemRangeByScore(ctx, members, "-inf", strconv.FormatInt(now.Add(-staleAfter*3).UnixMilli(), 10))
		rate = p.HGetAll(ctx, rateKey)
		live = p.ZRange(ctx, members, 0, -1)
		return nil
	})
	if err != nil {
		c.healthy.Store(false)
		return
	}
	otherReqs := map[string]int{}
	for k, v := range rate.Val() {
		inst, agent, ok := strings.Cut(k, "|")
		if !ok || inst == c.instance {
			continue
		}
		n, _ := strconv.Atoi(v)
		otherReqs[agent] += n
	}
	otherConns := map[string]int{}
	if c.conns > 0 {
		var cmds []*redis.MapStringStringCmd
		_, err = c.c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, m := range live.Val() {
				if m != c.instance {
					cmds = append(cmds, p.HGetAll(ctx, c.prefix+"conns:"+m))
				}
			}
			return nil
		})
		if err != nil {
			c.healthy.Store(false)
			return
		}
		for _, cmd := range cmds {
			for a, v := range cmd.Val() {
				n, _ := strconv.Atoi(v)
				otherConns[a] += n
			}
		}
	}
	c.mu.Lock()
	if c.second == second {
		c.otherReqs = otherReqs
	}
	c.otherConns = otherConns
	c.mu.Unlock()
	c.lastSync.Store(c.now().UnixMilli())
	c.healthy.Store(true)
}
