package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// streamingStandIn streams a chat completion of many content chunks, then holds the stream
// open until the request goes away: only a cut by the broker ends the agent's stream.
type streamingStandIn struct {
	chunks int
	gone   chan struct{} // closed when the broker closed the upstream stream
}

func (s *streamingStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	flusher := w.(http.Flusher)
	for i := range s.chunks {
		fmt.Fprintf(w, `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-cap","choices":[{"index":0,"delta":{"content":"chunk%03d"}}]}`+"\n\n", i)
		flusher.Flush()
	}
	<-r.Context().Done()
	close(s.gone)
}

func TestHardCapCutsStream(t *testing.T) {
	standIn := &streamingStandIn{chunks: 40, gone: make(chan struct{})}
	// 8 bytes of text a chunk, estimated 2 tokens: the sixth chunk would make 12, over 10.
	e := newEnv(t, envOpts{policy: llmPolicy, handler: standIn,
		policyFiles: map[string]string{"budgets.json": `{
  "budgets": {"stream-cap": {"agent": "coder-1", "provider": "openai-local", "tokens": 10, "window": "hour", "hard": true}}
}`},
		extraConfig: `llm:
  openai_compatible:
    - {name: openai-local, hosts: ["127.0.0.1"], path_prefix: /api/custom/v1}
`})
	out, err := e.curl("-N", "-H", "Content-Type: application/json",
		"--data", `{"model":"gpt-cap","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		e.url("/api/custom/v1/chat/completions"))
	if err != nil {
		t.Fatalf("curl: %v\n%s", err, out)
	}
	events := strings.Split(strings.TrimSpace(out), "\n\n")
	if len(events) != 6 {
		t.Fatalf("the agent got %d events, want 5 chunks and the error:\n%s", len(events), out)
	}
	for i, ev := range events[:5] {
		if !strings.Contains(ev, fmt.Sprintf(`"content":"chunk%03d"`, i)) {
			t.Errorf("event %d: %s", i, ev)
		}
	}
	want := `data: {"error":{"type":"budget_exceeded","code":"budget_exceeded","message":"the response was cut by the broker: it would overrun the hard budget stream-cap"}}`
	if events[5] != want {
		t.Errorf("the last event:\n%s\nwant\n%s", events[5], want)
	}
	select {
	case <-standIn.gone:
	case <-time.After(20 * time.Second):
		t.Fatal("the broker did not close the upstream stream")
	}
	ev := e.broker.waitAuditWhere(t, 1, "the cut call", func(ev auditEvent) bool { return ev["llm"] != nil })[0]
	if ev["budget"] != "stream-cap" || ev["status"] != float64(200) || !strings.Contains(fmt.Sprint(ev["error"]), "stream cut") {
		t.Errorf("the cut call's audit event: %v", ev)
	}
	// What the broker let through counts against the budget, marked as estimated.
	if l, _ := ev["llm"].(map[string]any); l["usage_estimated"] != true || l["tokens_out"].(float64) <= 0 {
		t.Errorf("the cut call's llm object: %v", l)
	}
	e.assertNoCanaryLeaked()
}
