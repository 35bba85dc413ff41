package broker

import (
	"context"
	"sync"

	"golang.org/x/sync/semaphore"
)

// bodiesPerAgent is how many bodies of policy.max_body_bytes one agent's requests may hold in
// memory for the policy at once; an agent's request that would hold more waits, first come
// first served, until the agent's earlier requests have been sent. The bytes held in total
// are at most agents × bodiesPerAgent × policy.max_body_bytes, and one agent waits only on
// its own requests.
const bodiesPerAgent = 4

// bodyBudget bounds the request-body bytes each agent holds for the policy.
type bodyBudget struct {
	perAgent int64
	mu       sync.Mutex
	agents   map[string]*semaphore.Weighted
}

func newBodyBudget(maxBody int64) *bodyBudget {
	return &bodyBudget{perAgent: bodiesPerAgent * (maxBody + 1), agents: map[string]*semaphore.Weighted{}}
}

// hold waits until agent may hold n more bytes (at most maxBody+1), and returns the
// reservation; ctx ending first is an error.
func (b *bodyBudget) hold(ctx context.Context, agent string, n int64) (*bodyHold, error) {
	b.mu.Lock()
	s, ok := b.agents[agent]
	if !ok {
		s = semaphore.NewWeighted(b.perAgent)
		b.agents[agent] = s // agents are the configured ones: the map is bounded
	}
	b.mu.Unlock()
	if err := s.Acquire(ctx, n); err != nil {
		return nil, err
	}
	return &bodyHold{s: s, n: n}, nil
}

// bodyHold is bytes an agent holds; release gives back all or part of them.
type bodyHold struct {
	s *semaphore.Weighted
	n int64
}

// keep gives back what is held beyond n bytes.
func (h *bodyHold) keep(n int64) {
	if h != nil && n < h.n {
		h.s.Release(h.n - n)
		h.n = n
	}
}

// release gives back everything held; it may be called more than once, and on nil.
func (h *bodyHold) release() { h.keep(0) }
