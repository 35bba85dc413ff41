package inject

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capbroker/capbroker/broker/scrub"
	"github.com/capbroker/capbroker/credentials"
)

// Bounds of the registry of known secrets (Known).
const (
	// DefaultRetain is how long a value sent as its source read it (a static or rotated
	// credential, a placeholder's substitute, an AWS key) stays known after it was last sent,
	// unless the refresh interval is longer (KnownOptions.Retain).
	DefaultRetain = 6 * time.Hour
	// DefaultMaxKnown bounds the values of one credential known at once, of any kind. A new
	// value past it is refused rather than an older one forgotten: the request that would
	// send it gets 503, and minters do not mint until a known value expires.
	DefaultMaxKnown = 64
	// redacted replaces a known value in a response.
	redacted = "[REDACTED]"
	// maxScrubHosts bounds the hosts whose Replacer the registry keeps between changes.
	maxScrubHosts = 4096
)

// Known is the registry of every secret value the broker has sent: one per process, outliving
// config generations (a reload that renames or removes a credential) and the rotation of
// minted tokens. A value is recorded where it is put into a request (Record), with the
// binding that sent it, and is scrubbed from every response from a host that binding is bound
// to (from every host, for a placeholder's value) in every form the binding reveals it, until:
//   - a minted token: it expires (its Expires);
//   - any other value: Retain after it was last sent.
//
// At most Max values per credential name are known at once. When a new one would need a place
// that only forgetting a value still within its time could make, it is refused (Record and Room
// return an error wrapping credentials.ErrUnavailable): the broker does not send what it could
// not scrub.
type Known struct {
	retain time.Duration
	max    int
	now    func() time.Time

	mu      sync.RWMutex
	entries map[knownKey]*knownEntry
	live    map[string]int // entries per credential name
	seq     uint64         // the id of the last entry added
	// version changes, under mu, whenever entries do: a Replacer built at a version holds
	// every value recorded up to it.
	version atomic.Uint64
	// pruneAt is when the next entry may have ended (Unix nanoseconds): until then Scrubber
	// does not look for ended entries.
	pruneAt atomic.Int64

	cache atomic.Pointer[scrubCache]

	following  sync.Map // host -> *scrub.Replacer (Following)
	followingN atomic.Int64
}

// knownKey names an entry: the binding that sent a value (Binding.key) and the value.
type knownKey struct{ binding, value string }

type knownEntry struct {
	id     uint64
	k      *Known
	b      *Binding
	val    credentials.Secret
	value  string   // val.Reveal()
	forms  []string // what reveals the value as b sends it (Reveals of each of its fields)
	minted bool
	until  atomic.Int64 // Unix nanoseconds: known until then
	gone   atomic.Bool  // pruned: no longer in k
}

// KnownOptions configure a Known. Zero values mean the defaults.
type KnownOptions struct {
	// Retain is how long a value that is not a minted token stays known after it was last
	// sent (DefaultRetain).
	Retain time.Duration
	// Max bounds the values known per credential (DefaultMaxKnown).
	Max int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// NewKnown returns an empty registry.
func NewKnown(opts KnownOptions) *Known {
	if opts.Retain <= 0 {
		opts.Retain = DefaultRetain
	}
	if opts.Max <= 0 {
		opts.Max = DefaultMaxKnown
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Known{retain: opts.Retain, max: opts.Max, now: opts.Now,
		entries: map[knownKey]*knownEntry{}, live: map[string]int{}}
}

// errFull is why a value is refused: the credential has as many known values as the registry
// keeps, none of them ended.
func (k *Known) errFull(name string) error {
	return fmt.Errorf("%w: credential %q: the broker knows %d of its values that may still be valid, as many as it scrubs; none is sent or minted until one ends",
		credentials.ErrUnavailable, name, k.max)
}

// Record notes that b is about to send v, a minted token (until its Expires) or any other
// value (until Retain after now). It is called before the value leaves, for every request: a
// value already known is only kept longer. An error (wrapping credentials.ErrUnavailable)
// means the value must not be sent.
func (k *Known) Record(b *Binding, v credentials.Secret, minted bool) error {
	return k.record(b, v, minted, true)
}

// record is Record; bounded says whether a value that needs a place past Max is refused (a
// value about to be sent) or known all the same (Hold: a value that exists whether or not the
// broker sends it).
func (k *Known) record(b *Binding, v credentials.Secret, minted, bounded bool) error {
	if v.IsZero() {
		return nil
	}
	now := k.now()
	until := now.Add(k.retain)
	if minted {
		if exp := v.Expires(); !exp.IsZero() {
			until = exp
		}
	}
	// The usual case: the value b sent last time, still known.
	if e := b.known.Load(); e != nil && e.k == k && e.value == v.Reveal() && !e.gone.Load() {
		e.extend(until.UnixNano())
		return nil
	}
	key := knownKey{binding: b.key, value: v.Reveal()}
	k.mu.RLock()
	e := k.entries[key]
	k.mu.RUnlock()
	if e != nil {
		e.extend(until.UnixNano())
		b.known.Store(e)
		return nil
	}

	k.mu.Lock()
	defer k.mu.Unlock()
	if e := k.entries[key]; e != nil {
		e.extend(until.UnixNano())
		return nil
	}
	if bounded && k.live[b.Name] >= k.max {
		k.pruneLocked(now)
		if k.live[b.Name] >= k.max {
			return k.errFull(b.Name)
		}
	}
	var forms []string
	for _, part := range v.Values() {
		forms = append(forms, b.Reveals(part)...)
	}
	k.seq++
	e = &knownEntry{id: k.seq, k: k, b: b, val: v, value: v.Reveal(), forms: slices.Clip(slices.Compact(forms)), minted: minted}
	e.until.Store(until.UnixNano())
	k.entries[key] = e
	b.known.Store(e)
	k.live[b.Name]++
	if at := until.UnixNano(); at < k.pruneAt.Load() || k.pruneAt.Load() == 0 {
		k.pruneAt.Store(at)
	}
	k.version.Add(1)
	return nil
}

// extendSlack is how much later than it is known until a value's time must move before it is
// written: every request records the values it sends, and a write each time would be shared
// memory written by every core.
const extendSlack = int64(time.Minute)

// Hold notes that the credential store holds v for b: it is known from now on, as Record(b, v,
// false) makes it, though it may never be sent (the upstream that issued a key may show it
// unasked). A value already known is not kept longer: only sending it does that. It is
// called for every response, so it reads no clock unless v is new. The bound does not apply:
// the value exists, sent or not, and an upstream may show it even while the broker refuses to
// send it (Record past the bound); the store's own values bound how many Hold adds.
func (k *Known) Hold(b *Binding, v credentials.Secret) {
	if v.IsZero() {
		return
	}
	if e := b.known.Load(); e != nil && e.k == k && e.value == v.Reveal() && !e.gone.Load() {
		return
	}
	k.mu.RLock()
	e := k.entries[knownKey{binding: b.key, value: v.Reveal()}]
	k.mu.RUnlock()
	if e != nil {
		return
	}
	_ = k.record(b, v, false, false)
}

// extend makes e known until at least until (less extendSlack).
func (e *knownEntry) extend(until int64) {
	for {
		cur := e.until.Load()
		if until <= cur+extendSlack || e.until.CompareAndSwap(cur, until) {
			return
		}
	}
}

// Room reports whether one more value of the named credential can be known without
// forgetting one: nil, or the error Record would return (credentials.Room).
func (k *Known) Room(name string) error {
	k.mu.RLock()
	n := k.live[name]
	k.mu.RUnlock()
	if n < k.max {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pruneLocked(k.now())
	if k.live[name] >= k.max {
		return k.errFull(name)
	}
	return nil
}

// pruneLocked forgets the entries that have ended. k.mu is held.
func (k *Known) pruneLocked(now time.Time) {
	t, next, gone := now.UnixNano(), int64(0), false
	for key, e := range k.entries {
		until := e.until.Load()
		if until <= t {
			e.gone.Store(true)
			delete(k.entries, key)
			if k.live[e.b.Name]--; k.live[e.b.Name] == 0 {
				delete(k.live, e.b.Name)
			}
			gone = true
			continue
		}
		if next == 0 || until < next {
			next = until
		}
	}
	k.pruneAt.Store(next)
	if gone {
		k.version.Add(1)
	}
}

// pruneIfDue forgets the entries that have ended, when one may have.
func (k *Known) pruneIfDue() {
	at := k.pruneAt.Load()
	if at == 0 || k.now().UnixNano() < at {
		return
	}
	k.mu.Lock()
	k.pruneLocked(k.now())
	k.mu.Unlock()
}

// Scrubber returns the Replacer for a response from host: it redacts every form of every
// value the registry knows that was sent by a binding bound to host, or by a placeholder
// binding (an agent chooses where a placeholder's value goes, so it may have had any host
// store it), whatever the config says now. A host no such value was sent for gets the empty
// Replacer.
func (k *Known) Scrubber(host string) *scrub.Replacer {
	k.pruneIfDue()
	v := k.version.Load()
	c := k.cache.Load()
	if c == nil || c.version != v {
		c = &scrubCache{version: v, sets: map[string]*scrub.Replacer{}}
		k.cache.Store(c)
	}
	if r, ok := c.hosts.Load(host); ok {
		return r.(*scrub.Replacer)
	}
	r := k.build(c, host)
	c.mu.Lock()
	if c.n < maxScrubHosts {
		if _, loaded := c.hosts.LoadOrStore(host, r); !loaded {
			c.n++
		}
	}
	c.mu.Unlock()
	return r
}

// Everything returns the Replacer of every form of every value the registry knows, whatever
// host it was sent to: what text the broker exports about its own work (telemetry) is
// scrubbed of.
func (k *Known) Everything() *scrub.Replacer { return k.Scrubber(everyHost) }

// everyHost is the key Everything's Replacer is built and kept under: no host is named so.
const everyHost = "\x00every host"

// Following returns the Replacer that follows Scrubber(host) (scrub.Following): a response
// still being read when a value is first sent is scrubbed of it from then on. One is kept per
// host (up to maxScrubHosts), so that a response costs no allocation for it.
func (k *Known) Following(host string) *scrub.Replacer {
	if r, ok := k.following.Load(host); ok {
		return r.(*scrub.Replacer)
	}
	// Asked at every read of the response's body: while the registry has not changed, the
	// Replacer last returned stands, without Scrubber's clock, pruning and lookup. A value
	// recorded changes the version, and the next read takes it up. One that ended and is
	// pruned meanwhile goes on being scrubbed until then: the safe side.
	var last atomic.Pointer[versioned]
	r := scrub.Following(func() *scrub.Replacer {
		v := k.version.Load()
		if l := last.Load(); l != nil && l.version == v {
			return l.r
		}
		s := k.Scrubber(host) // built at v or later
		last.Store(&versioned{v, s})
		return s
	})
	if k.followingN.Load() < maxScrubHosts {
		if v, loaded := k.following.LoadOrStore(host, r); loaded {
			return v.(*scrub.Replacer)
		}
		k.followingN.Add(1)
	}
	return r
}

// versioned is a Replacer and the version of the registry it was asked at.
type versioned struct {
	version uint64
	r       *scrub.Replacer
}

// scrubCache holds the Replacers built at one version of the registry: by host, and by the
// set of entries a host's responses are scrubbed of, so that hosts with the same values (every
// host, when only placeholders are known) share one.
type scrubCache struct {
	version uint64
	hosts   sync.Map // host -> *scrub.Replacer
	mu      sync.Mutex
	n       int                        // hosts stored; under mu
	sets    map[string]*scrub.Replacer // by the ids of the entries, in order; under mu
}

// build returns the Replacer of host's entries, shared with every host that has the same.
func (k *Known) build(c *scrubCache, host string) *scrub.Replacer {
	k.mu.RLock()
	var mine []*knownEntry
	for _, e := range k.entries {
		if e.b.rule.Placeholder != "" || host == everyHost || e.b.Matches(host) {
			mine = append(mine, e)
		}
	}
	k.mu.RUnlock()
	if len(mine) == 0 {
		return scrub.New()
	}
	slices.SortFunc(mine, func(a, b *knownEntry) int { return cmp.Compare(a.id, b.id) })
	set := make([]byte, 0, 8*len(mine))
	for _, e := range mine {
		set = binary.LittleEndian.AppendUint64(set, e.id)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.sets[string(set)]; r != nil {
		return r
	}
	var pairs []string
	for _, e := range mine {
		for _, f := range e.forms {
			pairs = append(pairs, f, redacted)
		}
	}
	r := scrub.New(pairs...)
	c.sets[string(set)] = r
	return r
}

// Values returns every value known, each field of a value with several on its own: what a
// text shown to a person (an approval card) is cleaned of, whatever host it concerns.
func (k *Known) Values() []string {
	k.mu.RLock()
	defer k.mu.RUnlock()
	out := make([]string, 0, len(k.entries))
	for _, e := range k.entries {
		for _, part := range e.val.Values() {
			out = append(out, part.Reveal())
		}
	}
	return out
}

// bindingKey identifies what a binding sends and where: its name, hosts and inject rule. A
// reload that keeps a credential as it was gives it a new Binding with the same key, so the
// values it sent are one entry, not one per generation.
func bindingKey(name string, hosts []string, rule any) string {
	b, _ := json.Marshal(struct {
		Name  string
		Hosts []string
		Rule  any
	}{name, hosts, rule})
	return string(b)
}
