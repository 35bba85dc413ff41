package rpc

import (
	"container/list"
	"sync"
)

// SessionHeader is the MCP streamable HTTP transport's session header.
const SessionHeader = "Mcp-Session-Id"

// Sessions remembers which agent each MCP session was issued to, so that a session id never
// serves another agent. It holds at most max sessions, forgetting the least recently used.
type Sessions struct {
	mu    sync.Mutex
	max   int
	byKey map[sessionKey]*list.Element
	lru   list.List // of *session, most recently used first
}

type sessionKey struct{ host, id string }

type session struct {
	key   sessionKey
	agent string
}

// NewSessions returns an empty Sessions holding at most max sessions.
func NewSessions(max int) *Sessions {
	return &Sessions{max: max, byKey: map[sessionKey]*list.Element{}}
}

// Issued records that host issued session id to agent. A session already issued to an agent
// stays that agent's: a server that issues one id twice does not hand it over.
func (s *Sessions) Issued(host, id, agent string) {
	k := sessionKey{host, id}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.byKey[k]; ok {
		s.lru.MoveToFront(e)
		return
	}
	s.byKey[k] = s.lru.PushFront(&session{k, agent})
	if s.lru.Len() > s.max {
		old := s.lru.Remove(s.lru.Back()).(*session)
		delete(s.byKey, old.key)
	}
}

// Owner returns the agent session id of host was issued to, if it is remembered.
func (s *Sessions) Owner(host, id string) (agent string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.byKey[sessionKey{host, id}]
	if !ok {
		return "", false
	}
	s.lru.MoveToFront(e)
	return e.Value.(*session).agent, true
}
