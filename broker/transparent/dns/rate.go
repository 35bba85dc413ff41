package dns

import (
	"fmt"
	"net/netip"
	"sync"
	"time"
)

// DefaultQueriesPerSecond is the rate bound of a Server whose options set none.
const DefaultQueriesPerSecond = 20

// maxSources bounds the sources the rate bound keeps state for. Past it, sources whose
// bucket is full again are forgotten; when none is, a new source's queries are refused.
const maxSources = 4096

// summaryEvery is how often, at most, the queries a source sent over its bound are audited
// (one event with their count).
const summaryEvery = time.Second

// rateBound is a token bucket per source address: qps tokens a second, up to twice as many
// saved. A query over the bound is refused; the refusals are audited in summaries.
type rateBound struct {
	qps, burst float64
	now        func() time.Time
	audit      func(Event)
	mu         sync.Mutex
	src        map[netip.Addr]*bucket
}

type bucket struct {
	tokens float64
	last   time.Time
	// refused counts the refusals not yet audited; lastQ is the latest of them.
	refused     int
	lastQ       Query
	lastSummary time.Time
	timer       *time.Timer // the pending summary, or nil
}

func newRateBound(qps int, now func() time.Time, audit func(Event)) *rateBound {
	if qps <= 0 {
		qps = DefaultQueriesPerSecond
	}
	return &rateBound{qps: float64(qps), burst: 2 * float64(qps), now: now, audit: audit, src: map[netip.Addr]*bucket{}}
}

// reason is the text of a refusal over the bound.
func (r *rateBound) reason() string {
	return fmt.Sprintf("over the resolver's rate bound of %g queries per second (bursts of %g)", r.qps, r.burst)
}

// take spends one of q.Source's tokens; false: none left, the query is refused (and counted
// for the source's next summary).
func (r *rateBound) take(q Query) bool {
	now := r.now()
	r.mu.Lock()
	b := r.src[q.Source]
	if b == nil {
		if len(r.src) >= maxSources && !r.evict(now) {
			r.mu.Unlock()
			return false
		}
		b = &bucket{tokens: r.burst, last: now}
		r.src[q.Source] = b
	}
	if dt := now.Sub(b.last).Seconds(); dt > 0 {
		b.tokens = min(r.burst, b.tokens+dt*r.qps)
	}
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		r.mu.Unlock()
		return true
	}
	b.refused++
	b.lastQ = q
	flushNow := false
	if b.timer == nil {
		if wait := b.lastSummary.Add(summaryEvery).Sub(now); wait > 0 {
			src := q.Source
			b.timer = time.AfterFunc(wait, func() { r.flush(src) })
		} else {
			flushNow = true
		}
	}
	r.mu.Unlock()
	if flushNow {
		r.flush(q.Source)
	}
	return false
}

// flush audits src's pending refusals in one event.
func (r *rateBound) flush(src netip.Addr) {
	r.mu.Lock()
	b := r.src[src]
	if b == nil || b.refused == 0 {
		if b != nil {
			b.timer = nil
		}
		r.mu.Unlock()
		return
	}
	n, q := b.refused, b.lastQ
	b.refused, b.timer, b.lastSummary = 0, nil, r.now()
	r.mu.Unlock()
	r.audit(Event{Query: q, Verdict: Verdict{Reason: fmt.Sprintf("%s: %d %s refused", r.reason(), n, plural(n, "query", "queries"))}, Count: n})
}

// flushAll audits every pending summary now (the server is stopping).
func (r *rateBound) flushAll() {
	r.mu.Lock()
	var pending []netip.Addr
	for src, b := range r.src {
		if b.timer != nil {
			b.timer.Stop()
			b.timer = nil
		}
		if b.refused > 0 {
			pending = append(pending, src)
		}
	}
	r.mu.Unlock()
	for _, src := range pending {
		r.flush(src)
	}
}

// evict forgets the sources whose bucket has refilled and has nothing pending; r.mu is held.
func (r *rateBound) evict(now time.Time) bool {
	full := time.Duration(r.burst / r.qps * float64(time.Second))
	n := len(r.src)
	for src, b := range r.src {
		if b.refused == 0 && b.timer == nil && now.Sub(b.last) >= full {
			delete(r.src, src)
		}
	}
	return len(r.src) < n
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// maxAnswered bounds the (agent, name) pairs remembered for auditing answers once per TTL;
// past it the expired ones are dropped, then all (each name is audited again once).
const maxAnswered = 1 << 16

// answered remembers which agent was answered which name until when.
type answered struct {
	mu sync.Mutex
	m  map[[2]string]time.Time
}

func newAnswered() *answered { return &answered{m: map[[2]string]time.Time{}} }

// first reports whether agent's answer for name is the first in ttl (and so is audited).
func (a *answered) first(agent, name string, now time.Time, ttl time.Duration) bool {
	k := [2]string{agent, name}
	a.mu.Lock()
	defer a.mu.Unlock()
	if until, ok := a.m[k]; ok && now.Before(until) {
		return false
	}
	if len(a.m) >= maxAnswered {
		for k, until := range a.m {
			if !now.Before(until) {
				delete(a.m, k)
			}
		}
		if len(a.m) >= maxAnswered {
			clear(a.m)
		}
	}
	a.m[k] = now.Add(ttl)
	return true
}
