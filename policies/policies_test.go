package policies_test

import (
	"context"
	"io/fs"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/tester"

	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/policies"
)

// TestShippedPolicies runs every *_test.rego beside the shipped policies, against the same
// capabilities the broker compiles them with.
func TestShippedPolicies(t *testing.T) {
	modules := map[string]*ast.Module{}
	err := fs.WalkDir(policies.FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".rego") {
			return err
		}
		b, err := fs.ReadFile(policies.FS, p)
		if err != nil {
			return err
		}
		m, err := ast.ParseModuleWithOpts(p, string(b), ast.ParserOptions{RegoVersion: ast.RegoV1})
		if err != nil {
			return err
		}
		modules[p] = m
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	compiler := ast.NewCompiler().WithCapabilities(policy.Capabilities()).WithEnablePrintStatements(true)
	ch, err := tester.NewRunner().SetCompiler(compiler).Run(context.Background(), modules)
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for r := range ch {
		ran++
		if r.Error != nil || r.Fail {
			t.Errorf("%s.%s failed: %v\n%s", r.Package, r.Name, r.Error, r.Output)
		}
	}
	if ran == 0 {
		t.Fatal("no Rego tests ran")
	}
}

// TestShippedPoliciesCompile proves the broker loads the embedded policies as `broker dev` does.
func TestShippedPoliciesCompile(t *testing.T) {
	if _, err := policy.New(context.Background(), policies.FS); err != nil {
		t.Fatal(err)
	}
}
