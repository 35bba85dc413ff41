package approvals

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/internal/testkit"
)

// syncBuffer collects what goroutines write, for the test to read.
type syncBuffer = testkit.Buffer

type fixture struct {
	q     *Queue
	out   *syncBuffer
	log   *audit.Logger
	state string
	dir   string
}

func newFixture(t *testing.T, o Options) *fixture {
	t.Helper()
	dir := t.TempDir()
	f := &fixture{out: &syncBuffer{}, dir: dir, state: filepath.Join(dir, "state.json")}
	f.log = audit.New(f.out)
	if o.MaxPending == 0 {
		o.MaxPending = 10
	}
	if o.MaxPendingPerAgent == 0 {
		o.MaxPendingPerAgent = 5
	}
	if o.StateFile == "" {
		o.StateFile = f.state
	}
	o.Audit = f.log
	o.Metrics = NewMetrics(prometheus.NewRegistry())
	q, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	f.q = q
	return f
}

// auditEvents returns the approval events written so far.
func (f *fixture) auditEvents(t *testing.T) []map[string]any {
	t.Helper()
	f.log.Close()
	var evs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(f.out.String()), "\n") {
		if line == "" {
			continue
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		evs = append(evs, ev)
	}
	return evs
}

func req(agent, method, path string) Request {
	return Request{RequestID: "r-" + path, Agent: agent, Phase: "request", Method: method, Scheme: "https", Host: "api.example.com", Port: 443, Path: path, Reason: "asked"}
}

// at is a request to https://api.example.com:443 as a grant is matched against it.
func at(agent, method, path string) Target {
	return Target{Agent: agent, Scheme: "https", Host: "api.example.com", Port: 443, Method: method, Path: path}
}

// hold starts Hold in a goroutine and waits until the request is pending; it returns the
// pending request and where its outcome arrives.
func hold(t *testing.T, q *Queue, ctx context.Context, r Request) (Request, chan Outcome) {
	t.Helper()
	sub := q.Events.Subscribe(16)
	defer q.Events.Unsubscribe(sub)
	ch := make(chan Outcome, 1)
	go func() {
		out, err := q.Hold(ctx, r)
		if err != nil {
			out.State = "error: " + err.Error()
		}
		ch <- out
	}()
	for ev := range sub.C {
		var e map[string]string
		_ = json.Unmarshal(ev.Data, &e)
		if ev.Name == "approval" && e["state"] == StatePending {
			for _, p := range q.Pending() {
				if p.ID == e["id"] {
					return p, ch
				}
			}
		}
	}
	panic("unreachable")
}

func TestApproveOnce(t *testing.T) {
	f := newFixture(t, Options{})
	p, ch := hold(t, f.q, context.Background(), req("a1", "DELETE", "/v1/things/7"))
	if p.Expires.Sub(p.Created) != 2*time.Minute || len(p.Scopes) != 2 {
		t.Fatalf("pending: %+v (no policy dir: no always)", p)
	}
	g, err := f.q.Approve(p.ID, Approval{By: "alice", Comment: "ok"})
	if err != nil || g != nil {
		t.Fatalf("approve once: %v %v", g, err)
	}
	out := <-ch
	if out.ID != p.ID || out.State != StateApproved || out.By != "alice" || out.Scope != ScopeOnce {
		t.Fatalf("outcome %+v", out)
	}
	if len(f.q.Pending()) != 0 {
		t.Fatal("still pending")
	}
	if _, err := f.q.Approve(p.ID, Approval{By: "bob"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("approved twice: %v", err)
	}
	evs := f.auditEvents(t)
	if len(evs) != 1 || evs[0]["msg"] != "approval" || evs[0]["action"] != "approve" || evs[0]["by"] != "alice" || evs[0]["request_id"] != "r-/v1/things/7" {
		t.Fatalf("audit: %v", evs)
	}
}

func TestDenyTimeoutWithdrawInterrupt(t *testing.T) {
	f := newFixture(t, Options{})
	p, ch := hold(t, f.q, context.Background(), req("a1", "POST", "/x"))
	if err := f.q.Deny(p.ID, "bob", "no"); err != nil {
		t.Fatal(err)
	}
	if out := <-ch; out.State != StateDenied || out.By != "bob" || out.Comment != "no" {
		t.Fatalf("deny: %+v", out)
	}

	r := req("a1", "POST", "/y")
	r.Timeout = 20 * time.Millisecond
	_, ch = hold(t, f.q, context.Background(), r)
	if out := <-ch; out.State != StateTimeout {
		t.Fatalf("timeout: %+v", out)
	}

	ctx, cancel := context.WithCancel(context.Background())
	_, ch = hold(t, f.q, ctx, req("a1", "POST", "/z"))
	cancel()
	if out := <-ch; out.State != StateWithdrawn {
		t.Fatalf("withdrawn: %+v", out)
	}
	if len(f.q.Pending()) != 0 {
		t.Fatal("a withdrawn request stays pending")
	}

	_, ch = hold(t, f.q, context.Background(), req("a1", "POST", "/w"))
	f.q.Interrupt()
	if out := <-ch; out.State != StateInterrupted {
		t.Fatalf("interrupt: %+v", out)
	}
	if _, err := f.q.Hold(context.Background(), req("a1", "GET", "/after")); !errors.Is(err, ErrInterrupted) {
		t.Fatalf("held after interrupt: %v", err)
	}
	var actions []string
	for _, ev := range f.auditEvents(t) {
		actions = append(actions, ev["action"].(string))
	}
	if strings.Join(actions, ",") != "deny,timeout,withdrawn,interrupted" {
		t.Fatalf("audit actions: %v", actions)
	}
	if got := value(f.q.o.Metrics.pending); got != 0 {
		t.Fatalf("pending gauge %v", got)
	}
	if got := value(f.q.o.Metrics.total.WithLabelValues(StateTimeout)); got != 1 {
		t.Fatalf("timeouts counted %v", got)
	}
}

func TestBounds(t *testing.T) {
	f := newFixture(t, Options{MaxPending: 3, MaxPendingPerAgent: 2})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hold(t, f.q, ctx, req("a1", "GET", "/1"))
	hold(t, f.q, ctx, req("a1", "GET", "/2"))
	if _, err := f.q.Hold(ctx, req("a1", "GET", "/3")); !errors.Is(err, ErrQueueFull) || !strings.Contains(err.Error(), "max_pending_per_agent") {
		t.Fatalf("per agent: %v", err)
	}
	hold(t, f.q, ctx, req("a2", "GET", "/4"))
	if _, err := f.q.Hold(ctx, req("a3", "GET", "/5")); !errors.Is(err, ErrQueueFull) || !strings.Contains(err.Error(), "approvals.max_pending)") {
		t.Fatalf("total: %v", err)
	}
	if n := len(f.q.Pending()); n != 3 {
		t.Fatalf("%d pending", n)
	}
}

func TestAgentGrantMatchesPersistsAndRevokes(t *testing.T) {
	now := time.Now()
	clock := func() time.Time { return now }
	f := newFixture(t, Options{Now: clock})
	p, ch := hold(t, f.q, context.Background(), req("a1", "POST", "/repos/o/r/pulls"))
	if _, err := f.q.Approve(p.ID, Approval{By: "alice", Scope: ScopeAgent, PathPrefix: "/other/"}); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("a grant that does not cover its request: %v", err)
	}
	if _, err := f.q.Approve(p.ID, Approval{By: "alice", Scope: ScopeAlways}); !errors.Is(err, ErrScope) {
		t.Fatalf("always without a policy dir: %v", err)
	}
	g, err := f.q.Approve(p.ID, Approval{By: "alice", Scope: ScopeAgent, Duration: time.Hour})
	if err != nil || g == nil || g.PathPrefix != "/repos/o/r/" || g.Method != "POST" || !g.Expires.Equal(now.Add(time.Hour).UTC()) {
		t.Fatalf("grant %+v %v", g, err)
	}
	<-ch
	if g.Scheme != "https" || g.Port != 443 || g.Host != "api.example.com" {
		t.Fatalf("the grant is not keyed by the request's scheme, host and port: %+v", g)
	}
	same := at("a1", "POST", "/repos/o/r/issues")
	with := func(f func(*Target)) Target { t := same; f(&t); return t }
	cases := map[string]struct {
		t     Target
		match bool
	}{
		"same prefix":     {same, true},
		"other method":    {at("a1", "GET", "/repos/o/r/issues"), false},
		"other agent":     {at("a2", "POST", "/repos/o/r/issues"), false},
		"outside":         {at("a1", "POST", "/repos/o/x/issues"), false},
		"prefix of dir":   {at("a1", "POST", "/repos/o/r"), false},
		"other port":      {with(func(t *Target) { t.Port = 8443 }), false},
		"other scheme":    {with(func(t *Target) { t.Scheme = "http" }), false},
		"other host":      {with(func(t *Target) { t.Host = "api.example.com.evil.test" }), false},
		"host in capital": {with(func(t *Target) { t.Host = "API.example.com" }), false},
		"no port":         {with(func(t *Target) { t.Port = 0 }), false},
	}
	for name, c := range cases {
		if got := f.q.Match(c.t) != nil; got != c.match {
			t.Errorf("%s: match %v", name, got)
		}
	}

	// A restart reloads it.
	q2, err := New(Options{StateFile: f.state, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	if q2.Match(at("a1", "POST", "/repos/o/r/x")) == nil || len(q2.Grants()) != 1 {
		t.Fatalf("grant not reloaded: %v", q2.Grants())
	}
	// Expired: neither matched nor listed nor reloaded.
	later := func() time.Time { return now.Add(2 * time.Hour) }
	q3, _ := New(Options{StateFile: f.state, Now: later})
	if len(q3.Grants()) != 0 {
		t.Fatal("an expired grant was reloaded")
	}
	f.q.o.Now = later
	if f.q.Match(at("a1", "POST", "/repos/o/r/x")) != nil {
		t.Fatal("an expired grant matched")
	}
	f.q.o.Now = clock

	if err := f.q.Revoke(g.ID, "bob"); err != nil {
		t.Fatal(err)
	}
	if f.q.Match(at("a1", "POST", "/repos/o/r/x")) != nil || len(f.q.Grants()) != 0 {
		t.Fatal("revoked grant still applies")
	}
	if err := f.q.Revoke(g.ID, "bob"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("revoked twice: %v", err)
	}
	q4, _ := New(Options{StateFile: f.state, Now: clock})
	if len(q4.Grants()) != 0 {
		t.Fatal("revocation not persisted")
	}
	var actions []string
	for _, ev := range f.auditEvents(t) {
		actions = append(actions, ev["action"].(string)+":"+ev["by"].(string))
	}
	if strings.Join(actions, ",") != "grant:alice,approve:alice,revoke:bob" {
		t.Fatalf("audit: %v", actions)
	}
}

func TestAlwaysWritesPolicyData(t *testing.T) {
	dir := t.TempDir()
	f := newFixture(t, Options{PolicyDir: dir})
	p, ch := hold(t, f.q, context.Background(), req("a1", "DELETE", "/v1/x/1"))
	g, err := f.q.Approve(p.ID, Approval{By: "alice", Scope: ScopeAlways, Method: "*", PathPrefix: "/v1/x/"})
	if err != nil || g.Kind != ScopeAlways || g.Expires != nil || g.Method != "" {
		t.Fatalf("grant %+v %v", g, err)
	}
	<-ch
	b, err := os.ReadFile(filepath.Join(dir, ApprovedFile))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct{ Approved []map[string]any }
	if err := json.Unmarshal(b, &doc); err != nil || len(doc.Approved) != 1 || doc.Approved[0]["path_prefix"] != "/v1/x/" || doc.Approved[0]["agent"] != "a1" {
		t.Fatalf("approved.json: %s", b)
	}
	if f.q.Match(at("a1", "DELETE", "/v1/x/2")) != nil {
		t.Fatal("an always grant is the policy's to apply, not the queue's")
	}
	if gs := f.q.Grants(); len(gs) != 1 || gs[0].Kind != ScopeAlways {
		t.Fatalf("grants: %+v", gs)
	}
	if err := f.q.Revoke(g.ID, "bob"); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(filepath.Join(dir, ApprovedFile))
	if strings.Contains(string(b), g.ID) {
		t.Fatalf("revoked always grant still in approved.json: %s", b)
	}
}

func TestCorruptStateFileIsAnError(t *testing.T) {
	state := filepath.Join(t.TempDir(), "s.json")
	_ = os.WriteFile(state, []byte("{not json"), 0o600)
	if _, err := New(Options{StateFile: state}); err == nil || !strings.Contains(err.Error(), "approvals.state_file") {
		t.Fatalf("err %v", err)
	}
}

// A subscriber that never reads loses its own events; publishing never waits for it.
func TestSlowSubscriberNeverBlocks(t *testing.T) {
	h := NewHub()
	slow := h.Subscribe(4)
	line := []byte(`{"level":"info","request_id":"x","msg":"decision","time":"2026-01-01T00:00:00Z"}` + "\n")
	done := make(chan struct{})
	go func() {
		for i := 0; i < 100000; i++ {
			h.AuditTap(line)
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("publishing blocked on a subscriber that does not read")
	}
	if len(slow.C) != 4 || slow.Dropped() != 100000-4 {
		t.Fatalf("buffered %d", len(slow.C))
	}
	ev := <-slow.C
	if ev.Name != "decision" || string(ev.Data) != strings.TrimSpace(string(line)) {
		t.Fatalf("event %+v", ev)
	}
	h.AuditTap([]byte(`{"action":"approve","msg":"approval"}` + "\n"))
	if len(slow.C) != 3 {
		t.Fatal("approval audit lines are not decision events")
	}
}

func BenchmarkAuditTapNoSubscriber(b *testing.B) {
	h := NewHub()
	line := []byte(`{"level":"info","request_id":"x","msg":"decision"}` + "\n")
	b.ReportAllocs()
	for b.Loop() {
		h.AuditTap(line)
	}
}

func BenchmarkAuditTapSlowSubscriber(b *testing.B) {
	h := NewHub()
	h.Subscribe(SubscriberBuffer) // never read
	line := []byte(`{"level":"info","request_id":"x","msg":"decision"}` + "\n")
	b.ReportAllocs()
	for b.Loop() {
		h.AuditTap(line)
	}
}

// value reads a gauge's or counter's value.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if d.Gauge != nil {
		return d.Gauge.GetValue()
	}
	return d.Counter.GetValue()
}
