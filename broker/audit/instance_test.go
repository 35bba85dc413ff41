package audit

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestInstance: with SetInstance every event, decision or approval, names the replica; without
// it none carries the field.
func TestInstance(t *testing.T) {
	for _, name := range []string{"", "broker-7d9c-x2"} {
		var buf bytes.Buffer
		l := New(&buf)
		l.SetInstance(name)
		l.Write(&Event{RequestID: "r1", Agent: "a", Decision: Allow})
		l.WriteApproval(&ApprovalEvent{Action: ActionApprove, ID: "ap-1"})
		l.Close()
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		if len(lines) != 2 {
			t.Fatalf("%d lines", len(lines))
		}
		for _, line := range lines {
			var ev map[string]any
			if err := json.Unmarshal([]byte(line), &ev); err != nil {
				t.Fatal(err)
			}
			got, ok := ev["instance"]
			if name == "" && ok || name != "" && got != name {
				t.Errorf("SetInstance(%q): instance %v in %s", name, got, line)
			}
		}
	}
}
