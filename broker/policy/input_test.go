package policy

import (
	"context"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
)

// TestRawPath: a policy sees the agent's path as input.request.raw_path beside the normalised
// input.request.path, in the request phase only, and decisions cached on one are not reused
// for another.
func TestRawPath(t *testing.T) {
	e := engine(t, `package broker

decision := {"allow": true, "reason": input.request.path} if input.request.raw_path == input.request.path

decision := {"allow": false, "reason": sprintf("%s became %s", [input.request.raw_path, input.request.path])} if input.request.raw_path != input.request.path
`)
	ctx := context.Background()
	for _, c := range []struct {
		raw, path string
		allow     bool
		reason    string
	}{
		{"/v1/files", "/v1/files", true, "/v1/files"},
		{"/v1/models/../files", "/v1/files", false, "/v1/models/../files became /v1/files"},
		{"/v1/models/%2e%2e/files", "/v1/files", false, "/v1/models/%2e%2e/files became /v1/files"},
		{"/v1/files", "/v1/files", true, "/v1/files"}, // from the cache, as the first
	} {
		in := req()
		in.Path, in.RawPath = c.path, c.raw
		d, err := e.Decide(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allow != c.allow || d.Reason != c.reason {
			t.Errorf("raw %s, path %s: %+v", c.raw, c.path, d)
		}
	}
	if n := len(cacheOf(e).cur); n != 3 {
		t.Errorf("%d cached decisions, want 3: raw_path is part of the key", n)
	}

	in := req()
	in.Path, in.RawPath = "/a", "/b/../a"
	doc := in.Document(true)["request"].(map[string]any)
	if doc["path"] != "/a" || doc["raw_path"] != "/b/../a" {
		t.Errorf("document: %v", doc)
	}
	in.Phase = PhaseConnect
	if _, ok := in.Document(true)["request"].(map[string]any)["raw_path"]; ok {
		t.Error("a connect-phase input has raw_path")
	}
}

// TestInputMembers: inputMembers holds every member astValue gives an input with all of its
// parts, and a member outside it (input.postgres: the Postgres front door's own input) is
// absent from an HTTP-side input without the input being built whole.
func TestInputMembers(t *testing.T) {
	in := req()
	in.AWS, in.SSH = map[string]any{"service": "s3"}, map[string]any{"user": "git"}
	in.usage, in.graphql = map[string]any{"tokens": 1}, []any{"q"}
	in.mcpValue, in.jsonrpcValue = ast.NewObject(), ast.NewObject()
	v, err := in.astValue()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range v.(ast.Object).Keys() {
		if !inputMembers[string(k.Value.(ast.String))] {
			t.Errorf("input.%v is not in inputMembers: a policy reading it would be told it is absent", k)
		}
	}
	for _, p := range []string{"input.postgres", "input.postgres.database", "input.nonesuch"} {
		ref := ast.MustParseRef(p)
		names := namesOf(ref)
		if _, err := in.findNamed(ref, names); err != errNoValue {
			t.Errorf("%s: %v, want absent", p, err)
		}
		// Every HTTP decision's cache key reads the shipped policy's input.postgres: building
		// the whole input for it took a fifth of the full pipeline's throughput.
		if n := testing.AllocsPerRun(10, func() { _, _ = in.findNamed(ref, names) }); n > 0 {
			t.Errorf("%s: %.0f allocations to find it absent, want none", p, n)
		}
	}
}
