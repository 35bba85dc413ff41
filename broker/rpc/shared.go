package rpc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// SharedSessions keeps which agent each MCP session was issued to in Redis (or Valkey), so
// that a session opened through one broker of a fleet is served by any other, and never to
// another agent. Local keeps the sessions this broker has seen: a session used again on the
// same broker costs no round trip; one first seen here costs one (GET), and issuing one costs
// one (SET NX) before the server's answer reaches the agent, so that every broker knows the
// session by the time the agent can use it.
//
// Key: PREFIX mcp:session:SHA256(host NUL id), the agent's id, with a TTL. The session id
// itself is not written: only its digest.
type SharedSessions struct {
	Local  *Sessions
	Client *redis.Client
	Prefix string
	TTL    time.Duration
	// FailClosed makes a store error an error of Owner (the broker answers 503); otherwise
	// a session the store cannot be asked about is unknown here (404: the client starts a
	// new one), which never serves it to another agent either.
	FailClosed bool
}

func (s *SharedSessions) key(host, id string) string {
	sum := sha256.Sum256([]byte(host + "\x00" + id))
	return s.Prefix + "mcp:session:" + hex.EncodeToString(sum[:])
}

// Issued records that host issued id to agent, unless another broker recorded it first (then
// that agent keeps it, as Sessions.Issued does). On a store error the error is returned and,
// failing closed, nothing is recorded (the session is refused until the store answers: it may
// be another agent's on another broker); otherwise the session is this broker's alone, as
// with one broker.
func (s *SharedSessions) Issued(ctx context.Context, host, id, agent string) error {
	if _, ok := s.Local.Owner(host, id); ok {
		return nil
	}
	k := s.key(host, id)
	set, err := s.Client.SetNX(ctx, k, agent, s.TTL).Result()
	if err != nil {
		if !s.FailClosed {
			s.Local.Issued(host, id, agent)
		}
		return err
	}
	if !set {
		owner, err := s.Client.Get(ctx, k).Result()
		if err != nil {
			return err // not recorded here: the next use asks the store again
		}
		agent = owner
	}
	s.Local.Issued(host, id, agent)
	return nil
}

// Owner returns the agent id was issued to: from Local, else from the store (and kept).
func (s *SharedSessions) Owner(ctx context.Context, host, id string) (string, bool, error) {
	if a, ok := s.Local.Owner(host, id); ok {
		return a, true, nil
	}
	a, err := s.Client.Get(ctx, s.key(host, id)).Result()
	if errors.Is(err, redis.Nil) {
		return "", false, nil
	} else if err != nil {
		if !s.FailClosed {
			err = nil
		}
		return "", false, err
	}
	s.Local.Issued(host, id, a)
	return a, true, nil
}
