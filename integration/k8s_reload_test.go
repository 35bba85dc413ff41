package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/capbroker/capbroker/internal/harness"
)

// publishConfigMap lays dir out as the kubelet does for a ConfigMap volume mounted as a
// directory (gen numbers the update): the keys in a timestamped directory, ..data pointing at
// it, each key a symlink through ..data; an update is a new directory and a rename of a new
// symlink over ..data, then the old directory goes.
func publishConfigMap(t *testing.T, dir string, gen int, data map[string]string) {
	t.Helper()
	ts := fmt.Sprintf("..2026_12_05_20_00_%02d.%09d", gen, gen)
	if err := os.MkdirAll(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for k, s := range data {
		if err := os.WriteFile(filepath.Join(dir, ts, k), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	if err := os.Symlink(ts, filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for k := range data {
		if _, err := os.Lstat(filepath.Join(dir, k)); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", k), filepath.Join(dir, k)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestConfigMapUpdateReloads: the broker run with --config in a ConfigMap volume, as
// deploy/kubernetes mounts it, reloads when the ConfigMap changes (the kubelet's ..data
// swap), with no signal; so does a policy directory that is a ConfigMap volume, and only the
// policy it points at is loaded (not the copies in the timestamped directories).
func TestConfigMapUpdateReloads(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command(brokerBin, "ca", "init", "--out", filepath.Join(dir, "ca")).CombinedOutput(); err != nil {
		t.Fatalf("ca init: %v\n%s", err, out)
	}
	policies := filepath.Join(dir, "policies")
	policy := func(reason string) map[string]string {
		return map[string]string{"broker.rego": "package broker\n\ndefault decision := {\"allow\": false, \"reason\": \"" + reason + "\"}\n"}
	}
	publishConfigMap(t, policies, 1, policy("first"))
	cfg := func(mode string) map[string]string {
		return map[string]string{"broker.yaml": fmt.Sprintf(`proxy: {listen: "127.0.0.1:0"}
admin: {listen: "127.0.0.1:0"}
ca: {cert_file: %q, key_file: %q}
policy: {dir: %q, mode: %s}
approvals: {state_file: %q}
agents: [{id: a, token_env: A_TOKEN}]
`, filepath.Join(dir, "ca", "ca.crt"), filepath.Join(dir, "ca", "ca.key"), policies, mode,
			filepath.Join(dir, "state", "approvals.json"))}
	}
	if err := os.Mkdir(filepath.Join(dir, "state"), 0o700); err != nil {
		t.Fatal(err)
	}
	cm := filepath.Join(dir, "config")
	publishConfigMap(t, cm, 1, cfg("enforce"))

	logs := newLogTail()
	cmd := exec.Command(brokerBin, "run", "--config", filepath.Join(cm, "broker.yaml"))
	cmd.Env = append(harness.Env(), "A_TOKEN="+randHex(16))
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		err := cmd.Wait()
		logs.Write([]byte(fmt.Sprintf("broker process exited: %v\n", err)))
		close(done)
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	logs.wait(t, `"message":"listening"`)

	for gen, mode := range []string{"monitor", "enforce"} {
		mark := logs.mark()
		publishConfigMap(t, cm, gen+2, cfg(mode))
		line := logs.waitFrom(t, mark, `"message":"config reloaded"`)
		var ev struct{ Trigger, PolicyMode string }
		_ = json.Unmarshal([]byte(line), &struct {
			Trigger    *string `json:"trigger"`
			PolicyMode *string `json:"policy_mode"`
		}{&ev.Trigger, &ev.PolicyMode})
		if ev.Trigger != "file changed" || ev.PolicyMode != mode {
			t.Fatalf("update %d: %s", gen+2, line)
		}
	}
	for gen, reason := range []string{"second", "third"} {
		mark := logs.mark()
		publishConfigMap(t, policies, gen+2, policy(reason))
		var loaded, evaluated struct {
			Revision string `json:"policy_revision"`
			Reason   string `json:"reason"`
		}
		_ = json.Unmarshal([]byte(logs.waitFrom(t, mark, `"message":"policy reloaded"`)), &loaded)
		// The revision the broker loaded is that of the policy now in the volume.
		out, code := run(t, dir, "policy", "eval", "--config", filepath.Join(cm, "broker.yaml"), "--agent", "a", "GET", "https://api.example.test/")
		if code != 0 || json.Unmarshal([]byte(out), &evaluated) != nil || evaluated.Reason != reason || loaded.Revision == "" || evaluated.Revision != loaded.Revision {
			t.Fatalf("policy update %d: the broker loaded revision %q; eval: exit %d:\n%s", gen+2, loaded.Revision, code, out)
		}
	}
}
