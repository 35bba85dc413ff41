package audit

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestEventFields(t *testing.T) {
	var buf bytes.Buffer
	l := New(&buf)
	l.Write(&Event{
		RequestID: "r1", Agent: "a", SourceIP: "10.0.0.1", Phase: "request", Method: "GET", Scheme: "https",
		Host: "api.example.com", Port: 443, Path: "/x", Decision: Allow, Credentials: []string{"gh"}, Status: 200,
		BytesIn: 1, BytesOut: 2, Start: time.Now(), PolicyRevision: "rev", Mode: "explicit", PolicyMode: "enforce",
		Input: map[string]any{"not": "logged without include_input"},
	})
	l.Close()
	var ev map[string]any
	if err := json.Unmarshal(buf.Bytes(), &ev); err != nil {
		t.Fatalf("not one JSON line: %q", buf.String())
	}
	for _, k := range []string{"time", "level", "msg", "request_id", "agent", "source_ip", "phase", "method", "scheme", "host",
		"port", "path", "decision", "reason", "credentials", "status", "bytes_in", "bytes_out", "duration_ms", "policy_revision", "mode", "policy_mode"} {
		if _, ok := ev[k]; !ok {
			t.Errorf("event lacks %q", k)
		}
	}
	if ev["msg"] != "decision" || ev["input"] != nil || ev["would_deny"] != nil {
		t.Errorf("event: %v", ev)
	}
	buf.Reset()
	l = New(&buf)
	l.Write(&Event{Start: time.Now(), WouldDeny: true, Input: map[string]any{"phase": "request"}, InputLevel: InputFull,
		AWS: &AWSCall{Service: "s3", Operation: "GetObject"}, MCP: &MCPCall{Method: "tools/call", Tool: "echo"}})
	l.Close()
	_ = json.Unmarshal(buf.Bytes(), &ev)
	if aws, _ := ev["aws"].(map[string]any); aws["service"] != "s3" || aws["operation"] != "GetObject" {
		t.Errorf("aws: %v", ev["aws"])
	}
	if m, _ := ev["mcp"].(map[string]any); m["method"] != "tools/call" || m["tool"] != "echo" {
		t.Errorf("mcp: %v", ev["mcp"])
	}
	if ev["would_deny"] != true || ev["input"] == nil {
		t.Errorf("include_input/would_deny: %v", ev)
	}
}

// TestRPCBatchNamed: an MCP or JSON-RPC batch names every message, in order, beside the first
// message's method (and tool) that a single message has alone.
func TestRPCBatchNamed(t *testing.T) {
	var buf bytes.Buffer
	l := New(&buf)
	first := MCPCall{Method: "tools/call", Tool: "echo"}
	l.Write(&Event{Start: time.Now(),
		MCP:     &MCPCall{Method: "tools/call", Tool: "echo", Batch: []MCPCall{first, {Method: "tools/call", Tool: "delete"}}},
		JSONRPC: &JSONRPCCall{Method: "eth_call", Batch: []string{"eth_call", "eth_sendRawTransaction"}}})
	l.Write(&Event{Start: time.Now(), MCP: &first, JSONRPC: &JSONRPCCall{Method: "eth_call"}})
	l.Close()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%q", buf.String())
	}
	for _, want := range []string{
		`"mcp":{"method":"tools/call","tool":"echo","batch":[{"method":"tools/call","tool":"echo"},{"method":"tools/call","tool":"delete"}]}`,
		`"jsonrpc":{"method":"eth_call","batch":[{"method":"eth_call"},{"method":"eth_sendRawTransaction"}]}`,
	} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("batch event lacks %s:\n%s", want, lines[0])
		}
	}
	for _, want := range []string{`"mcp":{"method":"tools/call","tool":"echo"}`, `"jsonrpc":{"method":"eth_call"}`} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("single event lacks %s:\n%s", want, lines[1])
		}
	}
}

// TestExportTraced: with an export set, each event is given to it with the line written, and the
// line carries trace_id when the event has one (never span_id).
func TestExportTraced(t *testing.T) {
	var buf bytes.Buffer
	l := New(&buf)
	var got []string
	var events []*Event
	l.SetExport(func(e *Event, line []byte) { events = append(events, e); got = append(got, string(line)) })
	e := &Event{RequestID: "r1", Start: time.Now(), TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7"}
	l.Write(e)
	l.WriteApproval(&ApprovalEvent{Action: ActionApprove, ID: "h1"})
	l.SetExport(nil)
	l.Write(&Event{RequestID: "r2", Start: time.Now()})
	l.Close()
	lines := strings.SplitAfter(buf.String(), "\n")
	if len(got) != 2 || got[0] != lines[0] || got[1] != lines[1] || events[0] != e || events[1] != nil {
		t.Fatalf("exported %q, written %q", got, lines)
	}
	var ev map[string]any
	_ = json.Unmarshal([]byte(lines[0]), &ev)
	if ev["trace_id"] != e.TraceID || ev["span_id"] != nil {
		t.Fatalf("line %s", lines[0])
	}
	var untraced map[string]any
	_ = json.Unmarshal([]byte(lines[2]), &untraced)
	if _, ok := untraced["trace_id"]; ok || untraced["request_id"] != "r2" {
		t.Fatalf("untraced event has trace_id: %s", lines[2])
	}
}
