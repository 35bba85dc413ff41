package approvals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
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
	// Import keeps g unless a grant of its id was imported before, even one revoked since:
	// moving a state file's grants in is done once, whatever the restarts and replicas. It
	// reports whether g was added.
	Import(g Grant) (bool, error)
}

// migrate moves the live grants of approvals.state_file into the shared store: approvals that
// switch to Redis keep the grants people gave. Each grant is imported once (a grant revoked
// after the move stays revoked, whatever restarts or replicas read the file again), and the
// file is then renamed FILE.moved; a state file that cannot be read, or grants that cannot be
// moved, stop the start.
func (q *Queue) migrate() error {
	if q.o.StateFile == "" {
		return nil
	}
	gs, err := readStateFile(q.o.StateFile, q.o.Now())
	if err != nil || len(gs) == 0 {
		return err
	}
	moved := 0
	for _, g := range gs {
		added, err := q.o.Grants.Import(g)
		if err != nil {
			return fmt.Errorf("approvals.state_file %s: moving its grants into the grants store: %w", q.o.StateFile, err)
		}
		if added {
			moved++
		}
	}
	log := q.o.Log.Info()
	// Renamed, so that a Redis that lost its data (and the ids imported) cannot get back from
	// a stale file a grant revoked since; a file that stays is still not imported twice.
	if err := os.Rename(q.o.StateFile, q.o.StateFile+MovedSuffix); err == nil {
		log = log.Str("renamed_to", q.o.StateFile+MovedSuffix)
	} else if !errors.Is(err, fs.ErrNotExist) {
		log = q.o.Log.Warn().AnErr("rename", err)
	}
	log.Str("state_file", q.o.StateFile).Int("moved", moved).Int("moved_before", len(gs)-moved).
		Msg("approvals.state_file: its grants are kept in the shared grants store from now on; the file is no longer read or written")
	return nil
}

// MovedSuffix is added to the state file's name once its grants are in the shared store.
const MovedSuffix = ".moved"

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

// importGrant adds a grant unless its id is in the set of ids imported before (KEYS[2]).
var importGrant = redis.NewScript(`
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1`)

// Import keeps g in the hash and its id in the set Key+":imported", in one script.
func (s *RedisGrants) Import(g Grant) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), grantStoreTimeout)
	defer cancel()
	b, err := json.Marshal(g)
	if err != nil {
		return false, err
	}
	n, err := importGrant.Run(ctx, s.Client, []string{s.Key, s.Key + ":imported"}, g.ID, b).Int()
	return n == 1, err
}

func (s *RedisGrants) Delete(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), grantStoreTimeout)
	defer cancel()
	return s.Client.HDel(ctx, s.Key, id).Err()
}
