package approvals

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker/budget/redistest"
	"github.com/capbroker/capbroker/internal/harness"
)

func writeStateFile(t *testing.T, path string, gs ...Grant) {
	t.Helper()
	b, err := json.Marshal(stateFile{Version: 1, Grants: gs})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestStateFileGrantsMoveToRedis: a broker switched to a Redis grants store keeps the grants
// of its state file: they are moved into Redis at start, once (a restart moves nothing again,
// a grant revoked after the move stays revoked), the file is renamed, and the move is
// logged with its count.
func TestStateFileGrantsMoveToRedis(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	state := filepath.Join(t.TempDir(), "capbroker-approvals.json")
	live, old := time.Now().Add(time.Hour), time.Now().Add(-time.Minute)
	writeStateFile(t, state,
		Grant{ID: "gr-1", Kind: ScopeAgent, Agent: "a", Scheme: "https", Host: "api.example.com", Port: 443, Method: "POST", PathPrefix: "/v1/", Expires: &live},
		Grant{ID: "gr-2", Kind: ScopeAgent, Agent: "b", Scheme: "https", Host: "api.example.com", Port: 443, Expires: &live},
		Grant{ID: "gr-old", Kind: ScopeAgent, Agent: "a", Scheme: "https", Host: "old.example.com", Port: 443, Expires: &old})
	start := func() (*Queue, string) {
		t.Helper()
		var logs bytes.Buffer
		q, err := New(Options{StateFile: state, Grants: &RedisGrants{Client: c, Key: "t:grants"}, Log: zerolog.New(&logs)})
		if err != nil {
			t.Fatal(err)
		}
		return q, logs.String()
	}
	q1, logs := start()
	if !strings.Contains(logs, `"moved":2,"moved_before":0`) || !strings.Contains(logs, state) {
		t.Errorf("first start's log: %s", logs)
	}
	if gs := q1.Grants(); len(gs) != 2 {
		t.Fatalf("grants after the move: %+v", gs)
	}
	if g := q1.Match(Target{Agent: "a", Scheme: "https", Host: "api.example.com", Port: 443, Method: "POST", Path: "/v1/x"}); g == nil || g.ID != "gr-1" {
		t.Fatalf("the moved grant does not match: %+v", g)
	}
	if n, _ := c.HLen(t.Context(), "t:grants").Result(); n != 2 {
		t.Fatalf("Redis holds %d grants, want 2", n)
	}
	if _, err := os.Stat(state + MovedSuffix); err != nil {
		t.Fatalf("the state file was not renamed: %v", err)
	}
	if err := q1.Revoke("gr-1", "ops"); err != nil {
		t.Fatal(err)
	}
	// A second replica that read the same file, or a file put back: nothing is moved again.
	if err := os.Rename(state+MovedSuffix, state); err != nil {
		t.Fatal(err)
	}
	q2, logs := start()
	if !strings.Contains(logs, `"moved":0,"moved_before":2`) {
		t.Errorf("second start's log: %s", logs)
	}
	if gs := q2.Grants(); len(gs) != 1 || gs[0].ID != "gr-2" {
		t.Fatalf("after a revoke and a restart: %+v (a revoked grant came back from the state file?)", gs)
	}
}

// TestStateFileMoveFailsClosed: a state file that cannot be read or whose grants cannot be
// moved into the store stops the start, naming the file: grants must not vanish silently.
func TestStateFileMoveFailsClosed(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	state := filepath.Join(dir, "approvals.json")
	if err := os.WriteFile(state, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	if _, err := New(Options{StateFile: state, Grants: &RedisGrants{Client: c, Key: "t:grants"}}); err == nil || !strings.Contains(err.Error(), state) {
		t.Fatalf("a corrupt state file: %v", err)
	}
	live := time.Now().Add(time.Hour)
	writeStateFile(t, state, Grant{ID: "gr-1", Kind: ScopeAgent, Agent: "a", Scheme: "https", Host: "h", Port: 443, Expires: &live})
	addr, err := harness.FreeAddr() // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	down := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { down.Close() })
	if _, err := New(Options{StateFile: state, Grants: &RedisGrants{Client: down, Key: "t:grants"}}); err == nil ||
		!strings.Contains(err.Error(), "approvals.state_file "+state) {
		t.Fatalf("Redis unreachable with grants to move: %v", err)
	}
}

// TestStateFileDirectoryWritableAtStart: without a shared store, a state file the broker could
// not write is an error at start (not at the first grant), naming the key and the path.
func TestStateFileDirectoryWritableAtStart(t *testing.T) {
	dir := t.TempDir()
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, state := range []string{filepath.Join(dir, "missing", "approvals.json"), filepath.Join(notDir, "approvals.json")} {
		_, err := New(Options{StateFile: state})
		if err == nil || !strings.Contains(err.Error(), "approvals.state_file") || !strings.Contains(err.Error(), state) {
			t.Errorf("%s: %v", state, err)
		}
	}
	if _, err := New(Options{StateFile: filepath.Join(dir, "approvals.json")}); err != nil {
		t.Fatalf("a writable directory: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*")); len(left) != 0 {
		t.Fatalf("the check left %v", left)
	}
}
