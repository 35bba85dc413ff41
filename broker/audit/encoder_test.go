package audit

import (
	"bytes"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestJSONLineUnchanged: the JSON encoder writes the line CONTRACT §6 describes, field for
// field and in order as before encoders existed (time aside), and instance, trace_id and
// redacted only when set.
func TestJSONLineUnchanged(t *testing.T) {
	st := time.Date(2026, 12, 5, 22, 0, 0, 0, time.UTC)
	e := &Event{RequestID: "r1", Agent: "a", SourceIP: "10.0.0.1", Phase: "request", Method: "GET", Scheme: "https",
		Host: "api.example.com", Port: 443, Path: "/x", Decision: Allow, Credentials: []string{"gh"}, Status: 200, Start: st,
		WouldDeny: true, MCP: &MCPCall{Method: "m", Tool: "t"}, Budget: "b", Via: "direct"}
	m := Meta{Time: st.Add(1500 * time.Microsecond), Duration: 1500 * time.Microsecond}
	const want = `{"level":"info","request_id":"r1","agent":"a","source_ip":"10.0.0.1","phase":"request","method":"GET",` +
		`"scheme":"https","host":"api.example.com","port":443,"path":"/x","decision":"allow","reason":"","credentials":["gh"],` +
		`"status":200,"bytes_in":0,"bytes_out":0,"duration_ms":1.5,"policy_revision":"","decision_id":"","mode":"",` +
		`"policy_mode":"","would_deny":true,"mcp":{"method":"m","tool":"t"},"budget":"b","via":"direct","msg":"decision","time":"T"}` + "\n"
	timeField := regexp.MustCompile(`"time":"[^"]*"`)
	got := timeField.ReplaceAllString(string(JSON.Decision(nil, e, m)), `"time":"T"`)
	if got != want {
		t.Errorf("line\n got %s\nwant %s", got, want)
	}
	e.TraceID, e.Redacted, m.Instance = "abc", 2, "broker-a"
	got = string(JSON.Decision(nil, e, m))
	for _, f := range []string{`"policy_mode":"","instance":"broker-a","trace_id":"abc","would_deny":true`, `"redacted":2,"via":"direct"`} {
		if !strings.Contains(got, f) {
			t.Errorf("line lacks %s: %s", f, got)
		}
	}
}

// otherEncoder writes two lines per decision, as the OCSF encoder does for a denial.
type otherEncoder struct{}

func (otherEncoder) Decision(dst []byte, e *Event, m Meta) []byte {
	return append(dst, "A "+e.RequestID+" "+m.Instance+"\nB "+e.RequestID+"\n"...)
}

func (otherEncoder) Approval(dst []byte, a *ApprovalEvent, m Meta) []byte {
	return append(dst, "P "+a.ID+"\n"...)
}

// TestEncoderChosen: a Logger writes what its encoder makes, whole, while its tap is given the
// broker's own JSON line of each event whatever the encoder.
func TestEncoderChosen(t *testing.T) {
	var out bytes.Buffer
	l := NewWith(&out, Options{Encoder: otherEncoder{}, Instance: "i1"})
	var mu sync.Mutex
	var tapped []string
	l.SetTap(func(line []byte) {
		mu.Lock()
		tapped = append(tapped, string(line))
		mu.Unlock()
	})
	l.Write(&Event{RequestID: "r1", Start: time.Now()})
	l.WriteApproval(&ApprovalEvent{Action: ActionApprove, ID: "ap-1"})
	l.SetTap(nil)
	l.Write(&Event{RequestID: "r2", Start: time.Now()})
	l.Close()
	if got := out.String(); got != "A r1 i1\nB r1\nP ap-1\nA r2 i1\nB r2\n" {
		t.Errorf("log: %q", got)
	}
	if len(tapped) != 2 || !strings.Contains(tapped[0], `"request_id":"r1"`) || !strings.Contains(tapped[0], `"msg":"decision"`) ||
		!strings.Contains(tapped[0], `"instance":"i1"`) || !strings.HasSuffix(tapped[0], "}\n") ||
		!strings.Contains(tapped[1], `"msg":"approval"`) {
		t.Errorf("tap: %q", tapped)
	}
}

// TestExport: the export is given each event with the lines the log holds for it, after they
// are queued; an approval event as nil.
func TestExport(t *testing.T) {
	var out bytes.Buffer
	l := NewWith(&out, Options{Encoder: otherEncoder{}})
	type got struct {
		id    string
		lines string
	}
	var seen []got
	l.SetExport(func(e *Event, lines []byte) {
		id := "approval"
		if e != nil {
			id = e.RequestID
		}
		seen = append(seen, got{id, string(lines)})
	})
	l.Write(&Event{RequestID: "r1", Start: time.Now()})
	l.WriteApproval(&ApprovalEvent{Action: ActionDeny, ID: "ap-1"})
	l.SetExport(nil)
	l.Write(&Event{RequestID: "r2", Start: time.Now()})
	l.Close()
	if len(seen) != 2 || seen[0] != (got{"r1", "A r1 \nB r1\n"}) || seen[1] != (got{"approval", "P ap-1\n"}) {
		t.Errorf("exported %q", seen)
	}
}
