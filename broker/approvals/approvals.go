// Package approvals holds the requests a policy decision asks a person about ("ask"), until
// someone approves or denies them, their timeout passes, or their agent goes away; and keeps
// the grants approvals make: "agent" grants in a state file, "always" grants as policy data
// (approved.json in the policy directory, data.approved); with a shared store (Redis, a
// fleet), both kinds in the store, which every broker reads.
//
// Nothing here is on the path of a request the policy allows or denies outright: the broker
// calls Match and Hold only for a decision that asks.
package approvals

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker/audit"
)

// Scopes of an approval (CONTRACT §8; policy.AskOnce...).
const (
	ScopeOnce   = "once"
	ScopeAgent  = "agent"
	ScopeAlways = "always"
)

// States of a held request, in approval events and Outcome.State.
const (
	StatePending     = "pending"
	StateApproved    = "approved"
	StateDenied      = "denied"
	StateTimeout     = "timeout"
	StateWithdrawn   = "withdrawn"
	StateInterrupted = "interrupted"
)

// Errors of the queue. The broker maps ErrQueueFull and ErrInterrupted to the agent's
// response; the API maps the others to 4xx.
var (
	ErrQueueFull   = errors.New("approval queue full")
	ErrInterrupted = errors.New("the broker is shutting down")
	ErrNotFound    = errors.New("no such pending request or grant")
	ErrScope       = errors.New("scope not offered")
	ErrBadRequest  = errors.New("bad approval")
)

// DefaultGrantDuration is how long an "agent" grant lasts when the approval names no duration.
const DefaultGrantDuration = 30 * time.Minute

// MaxGrantDuration bounds an "agent" grant.
const MaxGrantDuration = 30 * 24 * time.Hour

// Request is a held request as people see it: everything an approval lets through, with every
// known secret value scrubbed out. An approval covers exactly this: the target (scheme, host,
// port, method, path), the query with its values, the headers, the credentials the request
// will carry, and the body, whose preview says when it is cut.
type Request struct {
	ID        string `json:"id"`
	RequestID string `json:"request_id"`
	Agent     string `json:"agent"`
	SourceIP  string `json:"source_ip"`
	Phase     string `json:"phase"`
	Method    string `json:"method"`
	Scheme    string `json:"scheme"`
	Host      string `json:"host"`
	Port      int    `json:"port"`
	Path      string `json:"path"`
	// Query is the query as sent, every value (scrubbed) of every name; QueryKeys its names.
	Query     map[string][]string `json:"query"`
	QueryKeys []string            `json:"query_keys"`
	Headers   map[string]string   `json:"headers"`
	// Credentials name the credentials an approval attaches (the decision's), in the
	// request phase; none are attached to a CONNECT.
	Credentials []string `json:"credentials"`
	// BodyPreview is the start of the body, every known secret value scrubbed: all of it
	// unless BodyTruncated, when it is the first BodyPreviewMax bytes and ends in "…".
	BodyPreview   string    `json:"body_preview"`
	BodySize      int64     `json:"body_size"`
	BodyTruncated bool      `json:"body_truncated"`
	Reason        string    `json:"reason"`
	Created       time.Time `json:"created"`
	Expires       time.Time `json:"expires"`
	Scopes        []string  `json:"scopes"`
	// Instance is the broker holding the request, when another broker of the fleet does
	// (Options.Shared).
	Instance string `json:"instance,omitempty"`
	// Timeout is how long to hold the request; 0 is the queue's default. Not shown.
	Timeout time.Duration `json:"-"`
}

// BodyPreviewMax bounds the body preview a person is shown (Request.BodyPreview).
const BodyPreviewMax = 2 << 10

// URL is the request's URL as it will be sent: the port when it is not the scheme's own, and
// the query (its values scrubbed, as shown).
func (r Request) URL() string {
	host := r.Host
	if (r.Scheme == "https" && r.Port != 443) || (r.Scheme == "http" && r.Port != 80) {
		host = net.JoinHostPort(r.Host, strconv.Itoa(r.Port))
	} else if strings.Contains(host, ":") {
		host = "[" + host + "]" // an IPv6 address
	}
	u := r.Scheme + "://" + host + r.Path // the path as sent: already escaped
	if len(r.Query) > 0 {
		u += "?" + url.Values(r.Query).Encode()
	}
	return u
}

// target is what a grant made from the request must cover.
func (r Request) target() Target {
	return Target{Agent: r.Agent, Scheme: r.Scheme, Host: r.Host, Port: r.Port, Method: r.Method, Path: r.Path}
}

// Approval is a person's approval of a held request.
type Approval struct {
	By    string
	Scope string // once (default), agent, always
	// Duration of an "agent" grant (default DefaultGrantDuration).
	Duration time.Duration
	// Method of the grant: "" is the held request's method, "*" any.
	Method string
	// PathPrefix of the grant: "" is the held request's path up to its last "/". It must
	// cover the held request.
	PathPrefix string
	Comment    string
}

// Outcome is how a held request ended.
type Outcome struct {
	// ID is the held request's id ("" when it was never queued).
	ID      string
	State   string
	By      string
	Scope   string
	Comment string
	Grant   *Grant
}

// Options configure a Queue.
type Options struct {
	Timeout                        time.Duration
	MaxPending, MaxPendingPerAgent int
	// StateFile keeps the "agent" grants; "" keeps them in memory only.
	StateFile string
	// Grants, when set, keeps the "agent" grants instead of StateFile: a store several
	// brokers share (RedisGrants), read again whenever grants are looked up.
	Grants GrantStore
	// Shared, when set, shows the requests held here to every broker of a fleet and brings
	// their consoles' decisions back (RedisShared).
	Shared Shared
	// PolicyDir is where approved.json is written; "" (a policy bundle) offers no "always"
	// unless Grants is set: a shared store keeps the "always" grants too.
	PolicyDir string
	Audit     *audit.Logger
	Metrics   *Metrics
	Log       zerolog.Logger
	// Notify is told of each new pending request (the webhook); it must not block.
	Notify func(Request)
	Now    func() time.Time
}

type held struct {
	req  Request
	done chan Outcome // capacity 1: whoever removes the request from the map sends
}

// Queue is the pending requests and the grants. Safe for concurrent use.
type Queue struct {
	o      Options
	Events *Hub

	mu       sync.Mutex
	pending  map[string]*held
	perAgent map[string]int
	closed   bool
	grants   []Grant // "agent" grants, and "always" ones of a shared store; else approved.json
	saveMu   sync.Mutex
	// recent are the last RecentMax held requests that ended, oldest first (Recent).
	recent []Decided
}

// RecentMax is how many ended held requests the queue remembers for the console (Recent):
// in memory only, lost on restart; the audit log keeps every one.
const RecentMax = 200

// Decided is a held request as it ended: what was asked, and how and by whom it was decided.
// Its body preview, headers and query values are not kept (its body size and query names are).
type Decided struct {
	Request
	State   string    `json:"state"`
	By      string    `json:"by,omitempty"`
	Scope   string    `json:"scope,omitempty"`
	Comment string    `json:"comment,omitempty"`
	Grant   string    `json:"grant,omitempty"`
	Decided time.Time `json:"decided"`
}

// Recent lists the last RecentMax held requests that ended (approved, denied, timed out,
// withdrawn or interrupted), newest first: the history an approver reads beside a new
// question, including what was decided before the console was opened.
func (q *Queue) Recent() []Decided {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]Decided, len(q.recent))
	for i, d := range q.recent {
		out[len(out)-1-i] = d
	}
	return out
}

// New builds a queue and loads the grants of its state file.
func New(o Options) (*Queue, error) {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Minute
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	q := &Queue{o: o, Events: NewHub(), pending: map[string]*held{}, perAgent: map[string]int{}}
	if err := q.load(); err != nil {
		return nil, err
	}
	return q, nil
}

// Metrics returns the queue's metrics.
func (q *Queue) Metrics() *Metrics { return q.o.Metrics }

// AlwaysAvailable reports whether "always" approvals can be kept: in a shared grants store, or
// in a policy directory.
func (q *Queue) AlwaysAvailable() bool { return q.o.Grants != nil || q.o.PolicyDir != "" }

func newID(prefix string) string {
	var b [9]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// Hold queues req and waits until it is approved, denied, times out, ctx ends (its agent went
// away: withdrawn) or the queue is interrupted. Over a bound it returns ErrQueueFull at once.
func (q *Queue) Hold(ctx context.Context, req Request) (out Outcome, err error) {
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = q.o.Timeout
	}
	now := q.o.Now()
	req.ID = newID("ap-")
	req.Created, req.Expires = now.UTC(), now.Add(timeout).UTC()
	if len(req.Scopes) == 0 {
		req.Scopes = []string{ScopeOnce, ScopeAgent, ScopeAlways}
	}
	if !q.AlwaysAvailable() {
		req.Scopes = slices.DeleteFunc(slices.Clone(req.Scopes), func(s string) bool { return s == ScopeAlways })
	}
	h := &held{req: req, done: make(chan Outcome, 1)}
	q.mu.Lock()
	switch {
	case q.closed:
		q.mu.Unlock()
		return Outcome{State: StateInterrupted}, ErrInterrupted
	case len(q.pending) >= q.o.MaxPending && q.o.MaxPending > 0:
		q.mu.Unlock()
		q.o.Metrics.total.WithLabelValues("queue_full").Inc()
		return Outcome{}, fmt.Errorf("%w: %d requests are held for approval, the most the broker holds (approvals.max_pending)", ErrQueueFull, q.o.MaxPending)
	case q.perAgent[req.Agent] >= q.o.MaxPendingPerAgent && q.o.MaxPendingPerAgent > 0:
		q.mu.Unlock()
		q.o.Metrics.total.WithLabelValues("queue_full").Inc()
		return Outcome{}, fmt.Errorf("%w: agent %q has %d requests held for approval, the most it may (approvals.max_pending_per_agent)", ErrQueueFull, req.Agent, q.o.MaxPendingPerAgent)
	}
	q.pending[req.ID] = h
	q.perAgent[req.Agent]++
	q.mu.Unlock()
	defer func() { out.ID = req.ID }()
	q.o.Metrics.pending.Inc()
	q.Events.approval(req.ID, StatePending)
	if q.o.Shared != nil {
		q.o.Shared.Held(req)
	}
	if q.o.Notify != nil {
		q.o.Notify(req)
	}

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case out := <-h.done:
		return out, nil
	case <-ctx.Done():
		if q.remove(req.ID) {
			q.end(h, Outcome{State: StateWithdrawn}, audit.ActionWithdrawn)
			return Outcome{State: StateWithdrawn}, nil
		}
	case <-timer.C:
		if q.remove(req.ID) {
			q.end(h, Outcome{State: StateTimeout}, audit.ActionTimeout)
			return Outcome{State: StateTimeout}, nil
		}
	}
	return <-h.done, nil // resolved by someone else at the same moment
}

// remove takes a pending request out of the queue; false if it was gone already.
func (q *Queue) remove(id string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.removeLocked(id) != nil
}

func (q *Queue) removeLocked(id string) *held {
	h := q.pending[id]
	if h == nil {
		return nil
	}
	delete(q.pending, id)
	if q.perAgent[h.req.Agent]--; q.perAgent[h.req.Agent] <= 0 {
		delete(q.perAgent, h.req.Agent)
	}
	return h
}

// end records the end of a held request taken out of the queue: metrics, event, audit.
func (q *Queue) end(h *held, out Outcome, action string) {
	d := Decided{Request: h.req, State: out.State, By: out.By, Scope: out.Scope, Comment: out.Comment, Decided: q.o.Now().UTC()}
	d.BodyPreview, d.Headers, d.Query = "", nil, nil // what was decided on, not kept: bounded memory
	if out.Grant != nil {
		d.Grant = out.Grant.ID
	}
	q.mu.Lock()
	if len(q.recent) == RecentMax {
		q.recent = append(q.recent[:0], q.recent[1:]...)
	}
	q.recent = append(q.recent, d)
	q.mu.Unlock()
	q.o.Metrics.pending.Dec()
	q.o.Metrics.total.WithLabelValues(out.State).Inc()
	q.Events.approval(h.req.ID, out.State)
	if q.o.Shared != nil {
		q.o.Shared.Ended(h.req.ID)
	}
	q.audit(&audit.ApprovalEvent{Action: action, ID: h.req.ID, RequestID: h.req.RequestID, By: out.By, Scope: out.Scope,
		Agent: h.req.Agent, Scheme: h.req.Scheme, Host: h.req.Host, Port: h.req.Port, Method: h.req.Method, Comment: out.Comment})
}

func (q *Queue) audit(e *audit.ApprovalEvent) {
	if q.o.Audit != nil {
		q.o.Audit.WriteApproval(e)
	}
}

// Pending lists the held requests, oldest first: with a shared queue, those every broker of
// the fleet holds (the others' when the store answers; this broker's always).
func (q *Queue) Pending() []Request {
	q.mu.Lock()
	out := make([]Request, 0, len(q.pending))
	for _, h := range q.pending {
		out = append(out, h.req)
	}
	q.mu.Unlock()
	if q.o.Shared != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		all, err := q.o.Shared.List(ctx)
		cancel()
		if err != nil {
			q.o.Log.Warn().Err(err).Msg("the shared approvals queue could not be read: listing this broker's held requests only")
		}
		for _, r := range all {
			if r.Instance != "" && !q.holds(r.ID) {
				out = append(out, r)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Created.Before(out[j].Created) || out[i].Created.Equal(out[j].Created) && out[i].ID < out[j].ID
	})
	return out
}

func (q *Queue) holds(id string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.pending[id] != nil
}

// Approve lets a held request go on. With scope "agent" or "always" it also makes a grant,
// which it returns. An "always" grant is kept first (storeAlways): if that fails, the
// request stays held and the error is returned. A request another broker of the fleet holds
// is approved there (Options.Shared).
func (q *Queue) Approve(id string, a Approval) (*Grant, error) {
	if q.o.Shared != nil && !q.holds(id) {
		return q.o.Shared.Decide(context.Background(), id, Decision{Approve: true, By: a.By, Scope: a.Scope,
			Duration: a.Duration, Method: a.Method, PathPrefix: a.PathPrefix, Comment: a.Comment})
	}
	return q.approveLocal(id, a)
}

func (q *Queue) approveLocal(id string, a Approval) (*Grant, error) {
	if a.Scope == "" {
		a.Scope = ScopeOnce
	}
	q.mu.Lock()
	h := q.pending[id]
	if h == nil {
		q.mu.Unlock()
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if !slices.Contains(h.req.Scopes, a.Scope) {
		q.mu.Unlock()
		return nil, fmt.Errorf("%w: this request may be approved with scope %s, not %q", ErrScope, strings.Join(h.req.Scopes, ", "), a.Scope)
	}
	g, err := q.grantFor(h.req, a)
	q.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if g != nil && g.Kind == ScopeAlways {
		// The person decided "always": the grant says so from now on, even if the
		// request itself goes away in the meantime.
		if err := q.storeAlways(*g); err != nil {
			return nil, err
		}
	}
	q.mu.Lock()
	h = q.removeLocked(id)
	q.mu.Unlock()
	if h == nil {
		if g != nil && g.Kind == ScopeAlways {
			q.grantAdded(*g)
		}
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if g != nil {
		if g.Kind == ScopeAgent {
			q.addAgentGrant(*g)
		}
		q.grantAdded(*g)
	}
	out := Outcome{State: StateApproved, By: a.By, Scope: a.Scope, Comment: a.Comment, Grant: g}
	q.end(h, out, audit.ActionApprove)
	h.done <- out
	return g, nil
}

// Deny refuses a held request, here or on the broker of the fleet that holds it.
func (q *Queue) Deny(id, by, comment string) error {
	if q.o.Shared != nil && !q.holds(id) {
		_, err := q.o.Shared.Decide(context.Background(), id, Decision{By: by, Comment: comment})
		return err
	}
	return q.denyLocal(id, by, comment)
}

func (q *Queue) denyLocal(id, by, comment string) error {
	q.mu.Lock()
	h := q.removeLocked(id)
	q.mu.Unlock()
	if h == nil {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	out := Outcome{State: StateDenied, By: by, Comment: comment}
	q.end(h, out, audit.ActionDeny)
	h.done <- out
	return nil
}

// Close refuses new held requests (each is answered 503 approval_interrupted) and keeps
// those held, to be decided (from any broker's console, with a shared queue) until
// Interrupt: the first step of a drain.
func (q *Queue) Close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
}

// Held is how many requests this broker holds.
func (q *Queue) Held() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending)
}

// ReportLost audits a request held by a broker of the fleet that stopped without ending it
// (killed): its agent's connection went with that broker, and nothing was sent for it.
func (q *Queue) ReportLost(r Request, instance string) {
	q.audit(&audit.ApprovalEvent{Action: audit.ActionInterrupted, ID: r.ID, RequestID: r.RequestID, Agent: r.Agent,
		Scheme: r.Scheme, Host: r.Host, Port: r.Port, Method: r.Method,
		Comment: "held on broker " + instance + ", which stopped without draining: its agent's connection was lost, nothing was sent"})
}

// Interrupt ends every held request (each is answered 503 approval_interrupted) and refuses
// new ones: the broker is stopping, and a drain must not wait for a person.
func (q *Queue) Interrupt() {
	q.mu.Lock()
	q.closed = true
	var all []*held
	for id := range q.pending {
		all = append(all, q.removeLocked(id))
	}
	q.mu.Unlock()
	for _, h := range all {
		out := Outcome{State: StateInterrupted}
		q.end(h, out, audit.ActionInterrupted)
		h.done <- out
	}
}
