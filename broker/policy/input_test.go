package policy

import (
	"context"
	"testing"
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
