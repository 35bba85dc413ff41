package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/redis/go-redis/v9"

	"github.com/capbroker/capbroker/broker/budget/redistest"
	"github.com/capbroker/capbroker/broker/config"
)

// TestStateFileUnwritableRefusedAtStart: a broker whose approvals.state_file it could not
// write exits at start, naming the key and the file, instead of failing at the first grant.
func TestStateFileUnwritableRefusedAtStart(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command(brokerBin, "ca", "init", "--out", filepath.Join(dir, "ca")).CombinedOutput(); err != nil {
		t.Fatalf("ca init: %v\n%s", err, out)
	}
	writeFiles(t, dir, map[string]string{"policies/broker.rego": testPolicy, "not-a-dir": ""})
	for _, state := range []string{filepath.Join(dir, "missing", "approvals.json"), filepath.Join(dir, "not-a-dir", "approvals.json")} {
		writeFiles(t, dir, map[string]string{"broker.yaml": fmt.Sprintf(`proxy: {listen: "127.0.0.1:0"}
admin: {listen: "127.0.0.1:0"}
ca: {cert_file: ca/ca.crt, key_file: ca/ca.key}
policy: {dir: policies}
approvals: {state_file: %q}
agents: [{id: a, token_sha256: %q}]
`, state, strings.Repeat("ab", 32))})
		out, code := run(t, dir, "run", "--config", "broker.yaml")
		if code == 0 || !strings.Contains(out, "approvals.state_file") || !strings.Contains(out, state) || strings.Contains(out, `"message":"listening"`) {
			t.Errorf("state file %s: exit %d:\n%s", state, code, out)
		}
	}
}

// TestStateFileGrantsMovedToRedisByBroker: a broker started with a Redis store and the state
// file of its earlier, Redis-less self moves the file's grants into Redis, says how many and
// renames the file FILE.moved; a second broker with the same file (a replica) moves none again.
func TestStateFileGrantsMovedToRedisByBroker(t *testing.T) {
	srv := redistest.Start(t)
	state := filepath.Join(t.TempDir(), "approvals.json")
	exp := time.Now().Add(time.Hour).UTC()
	b, _ := json.Marshal(map[string]any{"version": 1, "grants": []map[string]any{{
		"id": "gr-moved", "kind": "agent", "agent": "coder-1", "scheme": "https", "host": "127.0.0.1", "port": 443,
		"method": "GET", "path_prefix": "/", "created": time.Now().UTC(), "created_by": "ops", "expires": exp}}})
	if err := os.WriteFile(state, b, 0o600); err != nil {
		t.Fatal(err)
	}
	opts := brokerOpts{policy: testPolicy, mode: "enforce", config: fmt.Sprintf(`approvals: {state_file: %q}
agents: [{id: coder-1, token_sha256: %q}]
budgets:
  store: {redis: {address: %q, key_prefix: "it:"}}
`, state, strings.Repeat("ab", 32), srv.Addr)}
	for i, want := range []string{`"moved":1,"moved_before":0`, `"moved":0,"moved_before":1`} {
		if i == 1 { // the first broker renamed it; a second replica's copy of the file
			if err := os.Rename(state+".moved", state); err != nil {
				t.Fatal(err)
			}
		}
		br := startBroker(t, opts)
		line := br.logs.wait(t, "approvals.state_file: its grants are kept in the shared grants store")
		if !strings.Contains(line, want) || !strings.Contains(line, state) {
			t.Fatalf("broker %d: %s", i+1, line)
		}
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	if v, err := c.HGet(t.Context(), "it:grants", "gr-moved").Result(); err != nil || !strings.Contains(v, `"host":"127.0.0.1"`) {
		t.Fatalf("Redis it:grants gr-moved: %q %v", v, err)
	}
}

// TestComposeStateFileWritable: the compose demo's broker keeps approvals.state_file on a
// writable volume (its root file system is read-only, and /etc/broker with it), which the
// image creates owned by the broker's user.
func TestComposeStateFileWritable(t *testing.T) {
	broker := service(t, loadCompose(t), "broker")
	for _, file := range []string{demoConfig, "../deploy/broker/broker-transparent.yaml"} {
		cfg, err := config.Load(file)
		if err != nil {
			t.Fatal(err)
		}
		state := cfg.Approvals.StateFile
		if state == "" {
			state = "/etc/broker/capbroker-approvals.json"
		}
		m, ok := mountOf(broker, state)
		if !ok || m.Type != types.VolumeTypeVolume || m.ReadOnly {
			t.Errorf("%s: approvals.state_file %s is not on a writable volume of the broker: %+v", file, state, m)
			continue
		}
		df, err := os.ReadFile(dockerfile)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(df), "--chown=65532:65532") || !strings.Contains(string(df), " "+m.Target+"/\n") {
			t.Errorf("the Dockerfile does not create %s owned by the broker's user", m.Target)
		}
	}
}
