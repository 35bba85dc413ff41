package approvals

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// A GrantStore keeps the "agent" grants where several brokers see them (Options.Grants).
type GrantStore interface {
	// List returns the grants not yet expired.
	List() ([]Grant, error)
	Put(g Grant) error
	Delete(id string) error
}

// sync reads the grants again from a shared store; on failure the last ones read stand.
func (q *Queue) sync() {
	if q.o.Grants == nil {
		return
	}
	gs, err := q.o.Grants.List()
	if err != nil {
		q.o.Log.Warn().Err(err).Msg("the grants store could not be read: using the grants last read")
		return
	}
	q.mu.Lock()
	q.grants = gs
	q.mu.Unlock()
}

// RedisGrants keeps grants in one Redis hash (id -> grant JSON) at Key; an expired grant is
// removed when the hash is next read.
type RedisGrants struct {
	Client *redis.Client
	Key    string
	Now    func() time.Time
}

const grantStoreTimeout = time.Second

func (s *RedisGrants) List() ([]Grant, error) {
	ctx, cancel := context.WithTimeout(context.Background(), grantStoreTimeout)
	defer cancel()
	m, err := s.Client.HGetAll(ctx, s.Key).Result()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	if s.Now != nil {
		now = s.Now()
	}
	var out []Grant
	var expired []string
	for id, v := range m {
		var g Grant
		if json.Unmarshal([]byte(v), &g) != nil || (g.Expires != nil && !now.Before(*g.Expires)) {
			expired = append(expired, id)
			continue
		}
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b Grant) int { return a.Created.Compare(b.Created) })
	if len(expired) > 0 {
		_ = s.Client.HDel(ctx, s.Key, expired...).Err()
	}
	return out, nil
}

func (s *RedisGrants) Put(g Grant) error {
	ctx, cancel := context.WithTimeout(context.Background(), grantStoreTimeout)
	defer cancel()
	b, err := json.Marshal(g)
	if err != nil {
		return err
	}
	return s.Client.HSet(ctx, s.Key, g.ID, b).Err()
}

func (s *RedisGrants) Delete(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), grantStoreTimeout)
	defer cancel()
	return s.Client.HDel(ctx, s.Key, id).Err()
}
