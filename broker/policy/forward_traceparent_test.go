package policy

import "testing"

// TestForwardTraceparent: "forward_traceparent" is a boolean, false unless the decision says so.
func TestForwardTraceparent(t *testing.T) {
	for name, c := range map[string]struct {
		obj     map[string]any
		forward bool
		reason  string
	}{
		"absent":   {obj: map[string]any{"allow": true}},
		"true":     {obj: map[string]any{"allow": true, "forward_traceparent": true}, forward: true},
		"false":    {obj: map[string]any{"allow": true, "forward_traceparent": false}},
		"a string": {obj: map[string]any{"allow": true, "forward_traceparent": "yes"}, reason: ReasonMalformed + ": forward_traceparent is not a boolean"},
	} {
		t.Run(name, func(t *testing.T) {
			d := parseDecision(c.obj, "rev")
			if d.ForwardTraceparent != c.forward || d.Reason != c.reason || d.Allow != (c.reason == "") {
				t.Fatalf("decision %+v", d)
			}
		})
	}
}
