package budget

import (
	"context"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/capbroker/capbroker/broker/policy"
)

// TestMalformedBudgetsFailThePolicyLoad: a policy whose data.budgets is malformed does not
// load, with an error naming the budget; a well-formed one loads and Engine.Data serves it.
func TestMalformedBudgetsFailThePolicyLoad(t *testing.T) {
	fsys := fstest.MapFS{
		"broker.rego":  {Data: []byte("package broker\n\ndecision := {\"allow\": true}\n")},
		"budgets.yaml": {Data: []byte("budgets:\n  daily: {requests: 10, window: fortnight}\n")},
	}
	_, err := policy.New(context.Background(), fsys)
	if err == nil || !strings.Contains(err.Error(), "data.budgets.daily: window") {
		t.Fatalf("malformed budgets: %v", err)
	}
	fsys["budgets.yaml"] = &fstest.MapFile{Data: []byte("budgets:\n  daily: {requests: 10, window: day}\nprices:\n  m: {input: 1.5, output: 2}\n")}
	e, err := policy.New(context.Background(), fsys)
	if err != nil {
		t.Fatal(err)
	}
	b := New(Options{Data: e.Data})
	s, err := b.set()
	if err != nil || len(s.Budgets) != 1 || s.Budgets[0].Limit != 10 {
		t.Fatalf("budgets from YAML policy data: %+v %v", s, err)
	}
	if c, ok := s.Cost("m", 1_000_000, 0, 0); !ok || c != 1_500_000 {
		t.Fatalf("price from YAML: %d %v", c, ok)
	}
}
