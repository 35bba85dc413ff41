package policy

import (
	"context"
	"testing"
)

// TestUsageIsReadOnlyForPoliciesThatSeeIt: input.usage is computed only for a policy that
// refers to it, and a cached decision is never served for other counters than those it was
// made with.
func TestUsageIsReadOnlyForPoliciesThatSeeIt(t *testing.T) {
	ctx := context.Background()
	reads := 0
	decide := func(e *Engine, remaining int64) Decision {
		t.Helper()
		in := req()
		in.ReadUsage = func() map[string]any {
			reads++
			return map[string]any{"gpt4": map[string]any{"remaining": remaining, "unit": "tokens", "limit": int64(100)}}
		}
		d, err := e.Decide(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	blind := engine(t, "package broker\n\ndecision := {\"allow\": input.request.path == \"/x\"}\n")
	decide(blind, 5)
	if reads != 0 {
		t.Fatalf("ReadUsage called %d times for a policy that does not read input.usage", reads)
	}
	e := engine(t, `package broker

decision := {"allow": true, "reason": "within"} if input.usage.gpt4.remaining > 0

decision := {"allow": false, "reason": "spent"} if input.usage.gpt4.remaining <= 0
`)
	if d := decide(e, 5); !d.Allow {
		t.Fatalf("remaining 5: %+v", d)
	}
	if d := decide(e, 5); !d.Allow {
		t.Fatalf("remaining 5 again: %+v", d)
	}
	if n := len(cacheOf(e).cur); n != 1 {
		t.Fatalf("%d cached decisions, want 1", n)
	}
	if d := decide(e, 0); d.Allow || d.Reason != "spent" {
		t.Fatalf("remaining 0: %+v (a stale cached decision?)", d)
	}
	if reads != 3 {
		t.Fatalf("ReadUsage called %d times, want 3", reads)
	}
	// The whole input (audit) holds the usage the policy saw.
	in := req()
	in.ReadUsage = func() map[string]any { return map[string]any{"b": map[string]any{"used": int64(1)}} }
	if _, err := e.Decide(ctx, in); err != nil {
		t.Fatal(err)
	}
	if _, ok := in.Document(false)["usage"]; !ok {
		t.Fatal("the input document has no usage")
	}
}

func TestBodyString(t *testing.T) {
	in := req()
	in.ReadBody = func() ([]byte, int64) { return []byte(`{"messages": [{"model": "x"}], "model": "gpt-4o"}`), 10 }
	if m := in.BodyString("model"); m != "gpt-4o" {
		t.Fatalf("model %q", m)
	}
	in = req()
	in.ReadBody = func() ([]byte, int64) { return []byte(`not json`), 8 }
	if m := in.BodyString("model"); m != "" {
		t.Fatalf("model %q of a body that is not JSON", m)
	}
}
