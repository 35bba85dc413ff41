package approvals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Shared queue shows every broker's held requests to every broker's console and CLI, and
// carries a decision made on one broker to the broker that holds the request (Options.Shared).
// A held request always waits on the broker its agent's connection reached: only the
// question and its answer travel.
type Shared interface {
	// Held announces a request held here; Ended withdraws it. Neither blocks the request on
	// a failure: a request the store does not know of is decided on its own broker.
	Held(req Request)
	Ended(id string)
	// List returns the requests held on every broker, stale ones (their broker gone) left
	// out and reported through lost.
	List(ctx context.Context) ([]Request, error)
	// Decide asks the broker holding id to apply d, and returns what its queue answered.
	Decide(ctx context.Context, id string, d Decision) (*Grant, error)
}

// Decision is an approval or a denial sent to the broker holding the request.
type Decision struct {
	Approve    bool          `json:"approve"`
	By         string        `json:"by"`
	Scope      string        `json:"scope,omitempty"`
	Duration   time.Duration `json:"duration,omitempty"`
	Method     string        `json:"method,omitempty"`
	PathPrefix string        `json:"path_prefix,omitempty"`
	Comment    string        `json:"comment,omitempty"`
}

func (d Decision) approval() Approval {
	return Approval{By: d.By, Scope: d.Scope, Duration: d.Duration, Method: d.Method, PathPrefix: d.PathPrefix, Comment: d.Comment}
}

// decide applies d to a request held here (a decision from another broker's console).
func (q *Queue) decide(id string, d Decision) (*Grant, error) {
	if d.Approve {
		return q.approveLocal(id, d.approval())
	}
	return nil, q.denyLocal(id, d.By, d.Comment)
}

// RedisShared is Shared over Redis (or Valkey), in the key space of docs/fleet.md:
//
//	PREFIX approvals:pending            hash: request id -> {"instance", "request"} JSON
//	PREFIX approvals:decide:INSTANCE    channel: decisions for the requests INSTANCE holds
//	PREFIX approvals:reply:NONCE        channel: the answer to one decision
//	PREFIX approvals:events             channel: "a request was held or ended", for consoles
//	PREFIX instance:INSTANCE            string with a TTL: INSTANCE is alive (Heartbeat)
type RedisShared struct {
	Client   *redis.Client
	Prefix   string
	Instance string
	// Lost is told of a request held by a broker that stopped without ending it (killed):
	// the survivor that notices reports it once.
	Lost func(Request, string)
	// Timeout bounds a decision's round trip to the broker holding the request.
	Timeout time.Duration
	// Background, when set, marks the contexts of what is done outside any agent's request
	// (heartbeats, the subscription, the console's reads and decisions), for counting.
	Background func(context.Context) context.Context
}

func (s *RedisShared) bg(ctx context.Context) context.Context {
	if s.Background == nil {
		return ctx
	}
	return s.Background(ctx)
}

// HeartbeatTTL is how long an instance counts as alive after its last heartbeat; a broker
// beats every HeartbeatTTL/3.
const HeartbeatTTL = 3 * time.Second

type sharedEntry struct {
	Instance string  `json:"instance"`
	Request  Request `json:"request"`
}

func (s *RedisShared) key(k string) string { return s.Prefix + k }

func (s *RedisShared) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), time.Second)
}

// Held writes the request and tells the consoles, in one round trip.
func (s *RedisShared) Held(req Request) {
	b, err := json.Marshal(sharedEntry{Instance: s.Instance, Request: req})
	if err != nil {
		return
	}
	ctx, cancel := s.ctx()
	defer cancel()
	_, _ = s.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, s.key("approvals:pending"), req.ID, b)
		p.Publish(ctx, s.key("approvals:events"), req.ID)
		return nil
	})
}

func (s *RedisShared) Ended(id string) {
	ctx, cancel := s.ctx()
	defer cancel()
	_, _ = s.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.HDel(ctx, s.key("approvals:pending"), id)
		p.Publish(ctx, s.key("approvals:events"), id)
		return nil
	})
}

// List reads the pending hash. An entry past its expiry, or of an instance with no
// heartbeat, is removed; the latter is reported (Lost) by whichever broker removes it.
func (s *RedisShared) List(ctx context.Context) ([]Request, error) {
	ctx = s.bg(ctx)
	m, err := s.Client.HGetAll(ctx, s.key("approvals:pending")).Result()
	if err != nil {
		return nil, err
	}
	alive := map[string]bool{s.Instance: true}
	var out []Request
	now := time.Now()
	for id, v := range m {
		var e sharedEntry
		if json.Unmarshal([]byte(v), &e) != nil {
			s.Client.HDel(ctx, s.key("approvals:pending"), id)
			continue
		}
		live, known := alive[e.Instance]
		if !known {
			n, err := s.Client.Exists(ctx, s.key("instance:"+e.Instance)).Result()
			if err != nil {
				return nil, err
			}
			live = n == 1
			alive[e.Instance] = live
		}
		if !live || now.After(e.Request.Expires.Add(HeartbeatTTL)) {
			// HDEL answers 1 to one broker only: that one reports the loss.
			if n, _ := s.Client.HDel(ctx, s.key("approvals:pending"), id).Result(); n == 1 && !live && s.Lost != nil {
				s.Lost(e.Request, e.Instance)
			}
			continue
		}
		e.Request.Instance = e.Instance
		out = append(out, e.Request)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

type decideMsg struct {
	ID       string   `json:"id"`
	Decision Decision `json:"decision"`
	Reply    string   `json:"reply"`
}

type decideReply struct {
	Grant  *Grant `json:"grant,omitempty"`
	Error  string `json:"error,omitempty"` // not_found, scope, bad_request, other
	Reason string `json:"reason,omitempty"`
}

// Decide publishes d to the broker holding id and waits for its answer. A request no broker
// holds any more (decided, timed out, its broker gone) is ErrNotFound.
func (s *RedisShared) Decide(ctx context.Context, id string, d Decision) (*Grant, error) {
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(s.bg(ctx), timeout)
	defer cancel()
	v, err := s.Client.HGet(ctx, s.key("approvals:pending"), id).Result()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	} else if err != nil {
		return nil, fmt.Errorf("the shared approvals queue: %w", err)
	}
	var e sharedEntry
	if err := json.Unmarshal([]byte(v), &e); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	reply := s.key("approvals:reply:" + newID(""))
	ps := s.Client.Subscribe(ctx, reply)
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil { // the subscription is in place before the question
		return nil, fmt.Errorf("the shared approvals queue: %w", err)
	}
	msg, _ := json.Marshal(decideMsg{ID: id, Decision: d, Reply: reply})
	n, err := s.Client.Publish(ctx, s.key("approvals:decide:"+e.Instance), msg).Result()
	if err != nil {
		return nil, fmt.Errorf("the shared approvals queue: %w", err)
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: %s (its broker %s is gone)", ErrNotFound, id, e.Instance)
	}
	select {
	case m, ok := <-ps.Channel():
		if !ok {
			return nil, errors.New("the shared approvals queue: subscription closed")
		}
		var r decideReply
		if err := json.Unmarshal([]byte(m.Payload), &r); err != nil {
			return nil, err
		}
		switch r.Error {
		case "":
			return r.Grant, nil
		case "not_found":
			return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
		case "scope":
			return nil, fmt.Errorf("%w: %s", ErrScope, strings.TrimPrefix(r.Reason, ErrScope.Error()+": "))
		case "bad_request":
			return nil, fmt.Errorf("%w: %s", ErrBadRequest, strings.TrimPrefix(r.Reason, ErrBadRequest.Error()+": "))
		default:
			return nil, fmt.Errorf("broker %s: %s", e.Instance, r.Reason)
		}
	case <-ctx.Done():
		return nil, fmt.Errorf("broker %s did not answer the decision in %s", e.Instance, timeout)
	}
}

// Run serves the decisions other brokers send for requests held here, forwards "held" and
// "ended" to this broker's consoles, and beats this instance's heartbeat, until ctx ends.
func (s *RedisShared) Run(ctx context.Context, q *Queue) {
	ctx = s.bg(ctx)
	go s.heartbeat(ctx)
	for ctx.Err() == nil {
		s.serve(ctx, q)
		select { // Redis gone: subscribe again, after a pause
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (s *RedisShared) serve(ctx context.Context, q *Queue) {
	decideCh, eventsCh := s.key("approvals:decide:"+s.Instance), s.key("approvals:events")
	ps := s.Client.Subscribe(ctx, decideCh, eventsCh)
	defer ps.Close()
	for {
		m, err := ps.ReceiveMessage(ctx)
		if err != nil {
			return
		}
		if m.Channel == eventsCh {
			q.Events.approval(m.Payload, "changed")
			continue
		}
		var dm decideMsg
		if json.Unmarshal([]byte(m.Payload), &dm) != nil || !strings.HasPrefix(dm.Reply, s.key("approvals:reply:")) {
			continue
		}
		go func() {
			g, err := q.decide(dm.ID, dm.Decision)
			r := decideReply{Grant: g}
			switch {
			case err == nil:
			case errors.Is(err, ErrNotFound):
				r.Error = "not_found"
			case errors.Is(err, ErrScope):
				r.Error, r.Reason = "scope", err.Error()
			case errors.Is(err, ErrBadRequest):
				r.Error, r.Reason = "bad_request", err.Error()
			default:
				r.Error, r.Reason = "other", err.Error()
			}
			b, _ := json.Marshal(r)
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			_ = s.Client.Publish(pctx, dm.Reply, b).Err()
		}()
	}
}

// heartbeat marks this instance alive (PREFIX instance:INSTANCE, TTL HeartbeatTTL) every
// third of HeartbeatTTL, and sweeps the queue; a drained broker removes its mark as it stops.
func (s *RedisShared) heartbeat(ctx context.Context) {
	t := time.NewTicker(HeartbeatTTL / 3)
	defer t.Stop()
	key := s.key("instance:" + s.Instance)
	for {
		c, cancel := context.WithTimeout(ctx, time.Second)
		_ = s.Client.Set(c, key, time.Now().UTC().Format(time.RFC3339), HeartbeatTTL).Err()
		// Listing sweeps the requests of replicas gone without draining: whichever replica
		// removes one reports it, whether or not a console is open.
		_, _ = s.List(c)
		cancel()
		select {
		case <-ctx.Done():
			c, cancel := context.WithTimeout(s.bg(context.Background()), time.Second)
			_ = s.Client.Del(c, key).Err()
			cancel()
			return
		case <-t.C:
		}
	}
}
