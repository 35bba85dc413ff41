package approvals

import (
	"bytes"
	"encoding/json"
	"sync"
	"sync/atomic"
)

// SubscriberBuffer is how many events a subscriber may fall behind by; beyond, its events
// are dropped (and counted for it), never waited for.
const SubscriberBuffer = 1024

// Event is one server-sent event: its name and its JSON data.
type Event struct {
	Name string
	Data []byte
}

// Hub fans events out to subscribers (the console's /api/events streams). Publishing never
// blocks: a subscriber whose buffer is full loses the event. With no subscriber, publishing
// costs one atomic load.
type Hub struct {
	mu   sync.Mutex
	subs atomic.Pointer[[]*Subscriber]

	// recent are the last RecentDecisions decision events, kept whether anyone subscribes or
	// not: a console opened now starts with the decisions made before (Recent). next is the
	// slot the next one goes to; the slots' buffers are reused.
	recentMu sync.Mutex
	recent   [RecentDecisions][]byte
	next     int
}

// RecentDecisions is how many decision events the hub keeps for a new subscriber (Recent),
// each of at most recentLineMax bytes: 3.2 MB at most. A longer one (an event carrying its
// policy input) is streamed live but not kept.
const (
	RecentDecisions = 200
	recentLineMax   = 16 << 10
)

// Recent returns the decision events kept, oldest first, as event "decision"s.
func (h *Hub) Recent() []Event {
	h.recentMu.Lock()
	defer h.recentMu.Unlock()
	var out []Event
	for i := range RecentDecisions {
		if d := h.recent[(h.next+i)%RecentDecisions]; len(d) > 0 {
			out = append(out, Event{Name: "decision", Data: bytes.Clone(d)})
		}
	}
	return out
}

// keep stores a decision event's line in the ring.
func (h *Hub) keep(line []byte) {
	h.recentMu.Lock()
	h.recent[h.next] = append(h.recent[h.next][:0], line...)
	h.next = (h.next + 1) % RecentDecisions
	h.recentMu.Unlock()
}

// Subscriber receives events on C.
type Subscriber struct {
	C       chan Event
	dropped atomic.Int64
}

// Dropped returns, and resets, the number of events lost since the last call.
func (s *Subscriber) Dropped() int64 { return s.dropped.Swap(0) }

func NewHub() *Hub { return &Hub{} }

// Subscribe adds a subscriber with a buffer of n events.
func (h *Hub) Subscribe(n int) *Subscriber {
	s := &Subscriber{C: make(chan Event, n)}
	h.mu.Lock()
	defer h.mu.Unlock()
	var list []*Subscriber
	if cur := h.subs.Load(); cur != nil {
		list = append(list, *cur...)
	}
	list = append(list, s)
	h.subs.Store(&list)
	return s
}

// Unsubscribe removes a subscriber.
func (h *Hub) Unsubscribe(s *Subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cur := h.subs.Load()
	if cur == nil {
		return
	}
	var list []*Subscriber
	for _, x := range *cur {
		if x != s {
			list = append(list, x)
		}
	}
	h.subs.Store(&list)
}

// Active reports whether anyone subscribes.
func (h *Hub) Active() bool {
	cur := h.subs.Load()
	return cur != nil && len(*cur) > 0
}

// Publish sends an event to every subscriber that has room. data is copied only when there
// is a subscriber.
func (h *Hub) Publish(name string, data []byte) {
	cur := h.subs.Load()
	if cur == nil || len(*cur) == 0 {
		return
	}
	ev := Event{Name: name, Data: bytes.Clone(data)}
	for _, s := range *cur {
		select {
		case s.C <- ev:
		default:
			s.dropped.Add(1)
		}
	}
}

// decisionMsg marks a decision event's line. Inside a string value the quotes would be
// escaped, so only the event's own msg field matches.
var decisionMsg = []byte(`"msg":"decision"`)

// AuditTap is an audit.Tap: each decision event becomes an event "decision" whose data is the
// audit event's JSON (secret-free as the audit log is), and is kept for Recent.
func (h *Hub) AuditTap(line []byte) {
	line = bytes.TrimRight(line, "\n")
	// The msg field is written last but for the time: look there first.
	if !bytes.Contains(line[max(0, len(line)-80):], decisionMsg) && !bytes.Contains(line, decisionMsg) {
		return
	}
	if len(line) <= recentLineMax {
		h.keep(line)
	}
	h.Publish("decision", line)
}

func (h *Hub) approval(id, state string) {
	if !h.Active() {
		return
	}
	b, _ := json.Marshal(map[string]string{"id": id, "state": state})
	h.Publish("approval", b)
}

func (h *Hub) grant(id, state string) {
	if !h.Active() {
		return
	}
	b, _ := json.Marshal(map[string]string{"id": id, "state": state})
	h.Publish("grant", b)
}
