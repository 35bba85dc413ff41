package telemetry

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/scrub"
)

// The request spans are not the SDK's: the broker records each request's tree as one compact
// Trace (ids and timestamps), with no span object, context or attribute made while the
// request runs; when it ends, the Trace, with the request's audit event, is written as OTLP
// spans, scrubbed (spanwire.go), and those bytes are queued for the export goroutine, which
// hands a batch of them to the OTLP client (gRPC or HTTP). The SDK's span path cost the broker
// 1.85x its CPU per request (docs/benchmarks.md).

// Span is one span of a Trace: zero Start means it did not happen.
type Span struct {
	ID         [8]byte
	Name       string
	Start, End time.Time
	tr         *Trace // a step's, for Finish
}

// Trace is one request's span tree: a root per exchange, a child of the agent's own span when
// it sent a traceparent (Parent), with a child per step, and the upstream and scrub spans
// open until the exchange ends. Event is the request's audit event, the decision and
// attributes read from it when the Trace ends.
type Trace struct {
	TraceID  [16]byte
	Parent   [8]byte // the agent's span; zero: none
	Root     Span
	Steps    [4]Span // identity, policy, approval, credentials, in the order started
	NSteps   int
	Upstream Span
	Scrub    Span
	// Status is the root's error description ("" when the exchange did not fail).
	Status string
	Event  audit.Event
}

// NewSpanID is a random span id.
func NewSpanID() (id [8]byte) {
	for id == [8]byte{} {
		putUint64(id[:], rand.Uint64())
	}
	return id
}

func putUint64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (56 - 8*i))
	}
}

// Step starts a step's span and returns it, for its End to be set; nil when there is no
// room (a step past the four known is not recorded).
func (t *Trace) Step(name string) *Span {
	if t.NSteps == len(t.Steps) {
		return nil
	}
	s := &t.Steps[t.NSteps]
	t.NSteps++
	*s = Span{ID: NewSpanID(), Name: name, Start: t.Now(), tr: t}
	return s
}

// Now is the time on t's clock: the root's start advanced by the monotonic time since. It
// reads the clock once where time.Now reads it twice (wall and monotonic: about 50 ns on a
// VM), and keeps a trace's times in order whatever the wall clock does meanwhile.
func (t *Trace) Now() time.Time {
	if t.Root.Start.IsZero() {
		return time.Now()
	}
	return t.Root.Start.Add(time.Since(t.Root.Start))
}

// Tracer hands out the Traces of the requests it samples and queues the ended ones for
// export. It never blocks: a Trace that finds the queue full is dropped and counted (its
// spans, under signal traces).
type Tracer struct {
	ratio float64 // < 1: sample at random
	q     *queue[encoded]
	pool  sync.Pool
	scrub func() *scrub.Replacer // the secrets known now
}

// Start is a new Trace with a random trace id and root span id, or nil when the request is
// not sampled. The sampling is the broker's: nothing the agent sends takes part in it.
func (t *Tracer) Start() *Trace {
	if t == nil || (t.ratio < 1 && rand.Float64() >= t.ratio) {
		return nil
	}
	tr, _ := t.pool.Get().(*Trace)
	if tr == nil {
		tr = new(Trace)
	}
	tr.init()
	return tr
}

// NewTrace is a Trace with a random trace id and root span id (for a Tracer of one's own).
func NewTrace() *Trace {
	tr := new(Trace)
	tr.init()
	return tr
}

func (tr *Trace) init() {
	putUint64(tr.TraceID[:8], rand.Uint64())
	putUint64(tr.TraceID[8:], rand.Uint64()|1)
	tr.Root.ID = NewSpanID()
}

// End writes tr's spans, scrubbed, and queues them for export; tr belongs to the Tracer from
// then on.
func (t *Tracer) End(tr *Trace) {
	b := getBuf()
	*b = encodeTrace(*b, t.scrub(), tr)
	n := spanCount(tr)
	t.release(tr)
	t.q.put(encoded{b: b, items: n})
}

func (t *Tracer) release(tr *Trace) {
	*tr = Trace{}
	t.pool.Put(tr)
}

// spanCount is how many spans tr exports.
func spanCount(tr *Trace) int {
	n := 1 + tr.NSteps
	if !tr.Upstream.Start.IsZero() {
		n++
	}
	if !tr.Scrub.Start.IsZero() {
		n++
	}
	return n
}

// Finish ends s (nothing when s is nil: the step is not traced).
func (s *Span) Finish() {
	switch {
	case s == nil:
	case s.tr != nil:
		s.End = s.tr.Now()
	default:
		s.End = time.Now()
	}
}
