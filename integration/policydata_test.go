package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckConfigWarnsOfLargeDataArrays: check-config passes a policy that tests membership
// in a 2,000-entry data array, and warns with the file and line of the expression and the
// lookup to write instead; the same list as an object, looked up by key, is not warned of.
func TestCheckConfigWarnsOfLargeDataArrays(t *testing.T) {
	dir := t.TempDir()
	if out, code := run(t, dir, "ca", "init", "--out", "ca"); code != 0 {
		t.Fatal(out)
	}
	pol := filepath.Join(dir, "policies")
	if err := os.MkdirAll(filepath.Join(pol, "allow"), 0o755); err != nil {
		t.Fatal(err)
	}
	hosts := make([]string, 2000)
	set := map[string]bool{}
	for i := range hosts {
		hosts[i] = fmt.Sprintf("h%d.example.com", i)
		set[hosts[i]] = true
	}
	list, _ := json.Marshal(map[string]any{"hosts": hosts, "set": set})
	writeTestFile(t, filepath.Join(pol, "allow", "data.json"), list)
	writeTestFile(t, filepath.Join(pol, "broker.rego"), []byte(`package broker

listed if input.request.host in data.allow.hosts

keyed if data.allow.set[input.request.host]

decision := {"allow": true} if {
	listed
	keyed
}
`))
	writeTestFile(t, filepath.Join(dir, "broker.yaml"), []byte(`ca: {cert_file: ca/ca.crt, key_file: ca/ca.key}
policy: {dir: policies}
agents: [{id: a, token_sha256: "`+strings.Repeat("ab", 32)+`"}]
`))
	out, code := run(t, dir, "check-config", "--config", "broker.yaml")
	if code != 0 || !strings.Contains(out, "OK") {
		t.Fatalf("check-config: exit %d\n%s", code, out)
	}
	want := "warning: policy.dir: policies/broker.rego:3: `input.request.host in data.allow.hosts` tests membership in data.allow.hosts, an array of 2000 entries"
	if !strings.Contains(out, want) || !strings.Contains(out, "data.allow.hosts[x]") {
		t.Errorf("check-config output lacks the warning %q and the lookup to write:\n%s", want, out)
	}
	if n := strings.Count(out, "warning:"); n != 1 {
		t.Errorf("%d warnings, want 1 (the object lookup is not one):\n%s", n, out)
	}
}
