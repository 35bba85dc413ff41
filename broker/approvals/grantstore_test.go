package approvals

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/capbroker/capbroker/broker/budget/redistest"
)

// TestRedisGrantsShared: a grant made on one broker lets the same request through another
// that shares the Redis store, survives a broker restart (a new queue) and a Redis restart,
// and a revoke on either ends it for both.
func TestRedisGrantsShared(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	store := func() GrantStore { return &RedisGrants{Client: c, Key: "t:grants"} }
	q1, err := New(Options{Grants: store()})
	if err != nil {
		t.Fatal(err)
	}
	q2, err := New(Options{Grants: store()})
	if err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Hour)
	q1.addAgentGrant(Grant{ID: "gr-1", Kind: ScopeAgent, Agent: "a", Scheme: "https", Host: "api.example.com", Port: 443, Method: "POST", PathPrefix: "/v1/", Expires: &exp})
	old := time.Now().Add(-time.Minute)
	q1.addAgentGrant(Grant{ID: "gr-old", Kind: ScopeAgent, Agent: "a", Scheme: "https", Host: "old.example.com", Port: 443, Expires: &old})
	if g := q2.Match(Target{Agent: "a", Scheme: "https", Host: "api.example.com", Port: 443, Method: "POST", Path: "/v1/x"}); g == nil || g.ID != "gr-1" {
		t.Fatalf("the other broker's match: %+v", g)
	}
	if q2.Match(Target{Agent: "a", Scheme: "https", Host: "old.example.com", Port: 443, Method: "GET", Path: "/"}) != nil {
		t.Fatal("an expired grant matched")
	}
	srv.Restart()
	q3, err := New(Options{Grants: store()}) // a broker restarted, after Redis restarted
	if err != nil {
		t.Fatal(err)
	}
	if gs := q3.Grants(); len(gs) != 1 || gs[0].ID != "gr-1" {
		t.Fatalf("grants after restarts: %+v", gs)
	}
	if err := q3.Revoke("gr-1", "ops"); err != nil {
		t.Fatal(err)
	}
	if g := q1.Match(Target{Agent: "a", Scheme: "https", Host: "api.example.com", Port: 443, Method: "POST", Path: "/v1/x"}); g != nil {
		t.Fatalf("a revoked grant still matches on another broker: %+v", g)
	}
}

// TestAPIUsage: GET /api/usage answers what SetUsage reports, behind the admin API's auth.
func TestAPIUsage(t *testing.T) {
	_, c := newAPI(t, "s3cret-admin")
	bearer := map[string]string{"Authorization": "Bearer s3cret-admin"}
	if code, body, _ := c.do("GET", "/api/usage", "", bearer); code != 200 || len(body["usage"].([]any)) != 0 {
		t.Fatalf("without budgets: %d %v", code, body)
	}
	api := c.srv.Config.Handler.(*API)
	api.SetUsage(func(context.Context) (any, error) {
		return []map[string]any{{"budget": "b", "usage": map[string]any{"used": 3}}}, nil
	})
	if code, _, _ := c.do("GET", "/api/usage", "", nil); code != 401 {
		t.Fatalf("no auth: %d", code)
	}
	code, body, _ := c.do("GET", "/api/usage", "", bearer)
	if code != 200 || !strings.Contains(fmt.Sprint(body["usage"]), "budget:b") {
		t.Fatalf("usage: %d %v", code, body)
	}
}

// TestGrantWithoutPortCoversNothing: a grant kept before grants had a scheme and a port (a
// state file or a shared store written by an older broker) is not widened to every port.
func TestGrantWithoutPortCoversNothing(t *testing.T) {
	exp := time.Now().Add(time.Hour)
	q, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	q.addAgentGrant(Grant{ID: "gr-legacy", Kind: ScopeAgent, Agent: "a", Host: "api.example.com", Method: "DELETE", PathPrefix: "/", Expires: &exp})
	for _, port := range []int{0, 443, 8443} {
		if g := q.Match(Target{Agent: "a", Scheme: "https", Host: "api.example.com", Port: port, Method: "DELETE", Path: "/v1/x"}); g != nil {
			t.Fatalf("port %d: a grant without a port matched: %+v", port, g)
		}
	}
}

// TestAlwaysInSharedStore: with a shared grants store, an "always" approval is kept there,
// not in the policy directory (a fleet's is a read-only ConfigMap): another broker's Match
// finds it, it never expires, and a revoke anywhere ends it. With the store down, approving
// "always" fails and the request stays held for another answer.
func TestAlwaysInSharedStore(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	dir := t.TempDir()
	f := newFixture(t, Options{PolicyDir: dir, Grants: &RedisGrants{Client: c, Key: "t:grants"}})
	q2, err := New(Options{Grants: &RedisGrants{Client: c, Key: "t:grants"}})
	if err != nil {
		t.Fatal(err)
	}
	if !q2.AlwaysAvailable() {
		t.Fatal("a shared store offers always without a policy directory")
	}
	p, ch := hold(t, f.q, context.Background(), req("a1", "DELETE", "/v1/x/1"))
	g, err := f.q.Approve(p.ID, Approval{By: "alice", Scope: ScopeAlways, Method: "*", PathPrefix: "/v1/x/"})
	if err != nil || g.Kind != ScopeAlways || g.Expires != nil {
		t.Fatalf("grant %+v %v", g, err)
	}
	<-ch
	if _, err := os.Stat(filepath.Join(dir, ApprovedFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("approved.json written beside a shared store: %v", err)
	}
	if m := q2.Match(at("a1", "DELETE", "/v1/x/2")); m == nil || m.ID != g.ID || m.Kind != ScopeAlways {
		t.Fatalf("the other broker's match: %+v", m)
	}
	if q2.Match(at("a2", "DELETE", "/v1/x/2")) != nil {
		t.Fatal("another agent's request matched")
	}
	if err := q2.Revoke(g.ID, "bob"); err != nil {
		t.Fatal(err)
	}
	if m := f.q.Match(at("a1", "DELETE", "/v1/x/2")); m != nil {
		t.Fatalf("revoked on one broker, still matching on the other: %+v", m)
	}

	p, ch = hold(t, f.q, context.Background(), req("a1", "DELETE", "/v1/y/1"))
	srv.Stop()
	if _, err := f.q.Approve(p.ID, Approval{By: "alice", Scope: ScopeAlways}); err == nil || !strings.Contains(err.Error(), "grants store") {
		t.Fatalf("always with the store down: %v", err)
	}
	if _, err := f.q.Approve(p.ID, Approval{By: "alice", Scope: ScopeOnce}); err != nil {
		t.Fatalf("the request was not left held: %v", err)
	}
	if out := <-ch; out.State != StateApproved || out.Grant != nil {
		t.Fatalf("outcome %+v", out)
	}
}
