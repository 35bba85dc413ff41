package broker

import "sync"

// agentLimiter caps how many tunnels and in-flight requests each agent holds at once, so one
// agent cannot exhaust the broker for the others.
type agentLimiter struct {
	max  int
	mu   sync.Mutex
	open map[string]int
}

func newAgentLimiter(max int) *agentLimiter {
	return &agentLimiter{max: max, open: map[string]int{}}
}

// acquire takes a slot for agent, or fails with errTooMany. Each success needs one release.
func (l *agentLimiter) acquire(agent string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[agent] >= l.max {
		return errTooMany
	}
	l.open[agent]++
	return nil
}

func (l *agentLimiter) release(agent string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[agent]--; l.open[agent] <= 0 {
		delete(l.open, agent)
	}
}
