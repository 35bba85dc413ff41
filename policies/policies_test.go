package policies_test

import (
	"bytes"
	"context"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/format"

	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/policies"
)

// TestShippedPolicies runs every *_test.rego beside the shipped policies as `broker policy
// test` does: with the data files, against the capabilities the broker compiles them with.
func TestShippedPolicies(t *testing.T) {
	ch, err := policy.RunTests(context.Background(), policies.FS, "", policy.TestOptions{Timeout: time.Minute}) // a loaded CI machine
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for r := range ch {
		ran++
		if r.Error != nil || r.Fail {
			t.Errorf("%s.%s failed: %v\n%s", r.Package, r.Name, r.Error, r.Output)
			for name, sr := range r.SubResults.Iter {
				if sr.Fail {
					t.Errorf("  case %s failed", strings.Join(name, "/"))
				}
			}
		}
	}
	if ran == 0 {
		t.Fatal("no Rego tests ran")
	}
}

// TestShippedPoliciesCompile proves the broker loads the embedded policies as `broker dev`
// does, and that check-config finds nothing wrong with them.
func TestShippedPoliciesCompile(t *testing.T) {
	if _, err := policy.New(context.Background(), policies.FS); err != nil {
		t.Fatal(err)
	}
	for _, err := range policy.Check(context.Background(), policies.FS, "policies") {
		t.Error(err)
	}
}

// TestShippedPoliciesAreFormatted fails for any .rego file that `opa fmt` would change.
func TestShippedPoliciesAreFormatted(t *testing.T) {
	err := fs.WalkDir(policies.FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".rego") {
			return err
		}
		b, err := fs.ReadFile(policies.FS, p)
		if err != nil {
			return err
		}
		want, err := format.SourceWithOpts(p, b, format.Opts{RegoVersion: ast.RegoV1})
		if err != nil {
			t.Errorf("%s: %v", p, err)
			return nil
		}
		if !bytes.Equal(b, want) {
			t.Errorf("%s is not formatted as `opa fmt` would: run `opa fmt -w policies/` (or format it with github.com/open-policy-agent/opa/v1/format)", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
