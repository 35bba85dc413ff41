package ocsf

import (
	"bytes"
	"testing"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/go-json-experiment/json"
)

// TestWriteMatchesTags: the hand-written encoding of every test event is what json makes of
// the same values from their tags, byte for byte.
func TestWriteMatchesTags(t *testing.T) {
	enc := New(Options{ProductVersion: "1.2.3"})
	var evs []*event
	for _, c := range cases {
		e := c.ev
		e.Input, e.InputLevel = map[string]any{"b": []any{1.5, "x"}, "a": map[string]any{"z": nil, "y": true}}, audit.InputFull
		var ev event
		enc.activity(&ev, &e, meta)
		evs = append(evs, &ev)
		for _, f := range findingsOf(&e) {
			ev := new(event)
			enc.finding(ev, &e, meta, f)
			evs = append(evs, ev)
		}
	}
	for _, c := range approvalCases {
		ev := new(event)
		enc.approval(ev, &c.ev, meta)
		evs = append(evs, ev)
	}
	for i, ev := range evs {
		got := appendLine(nil, ev)
		want, err := json.Marshal(ev, marshalOptions)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(bytes.TrimSuffix(got, []byte("\n")), want) {
			t.Errorf("event %d:\n got %s\nwant %s", i, got, want)
		}
	}
}

func TestJSONFloat(t *testing.T) {
	for _, f := range []float64{0, 1, -1, 0.0125, 1e-6, 9.99e-7, 1e-7, 123456789.125, 1e20, 1e21, 1.5e300, -2.5e-10, 0.1 + 0.2} {
		want, _ := json.Marshal(f)
		if got := jsonFloat(nil, f); !bytes.Equal(got, want) {
			t.Errorf("%v: %s, want %s", f, got, want)
		}
	}
}
