package policy

import (
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
)

// newStore is the store a policy's data document is evaluated against. Its values are
// converted to the evaluator's (AST) values once, here, and read as they are: OPA's default
// store converts whatever a policy reads on every read, so that `x in data.allow.hosts`
// over a 100,000-entry array cost 100,000 allocations per evaluation before the first
// comparison (docs/policy.md, "Large allow-lists"). The data comes from JSON and YAML files
// or a bundle, so it is JSON-shaped and needs no round trip through JSON to be checked;
// the store copies it, and src.data stays the broker's own (Engine.Data).
func newStore(data map[string]any) storage.Store {
	return inmem.NewFromObjectWithOpts(data, inmem.OptReturnASTValuesOnRead(true))
}
