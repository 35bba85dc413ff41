package llm

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/capbroker/capbroker/broker/usage"
)

// tokenLimit is a Limiter of total tokens per call.
type tokenLimit struct {
	limit int64
	asked []usage.Call
}

func (l *tokenLimit) Within(c usage.Call) (bool, string) {
	if len(l.asked) < 100 {
		l.asked = append(l.asked, c)
	}
	return c.In+c.Out <= l.limit, "cap"
}

type upstream struct {
	io.Reader
	closed bool
}

func (u *upstream) Close() error { u.closed = true; return nil }

// capStream runs stream through a meter of ep for request body, capped by l (nil: no cap),
// read a byte at a time; it returns what the agent read and the call recorded.
func capStream(t *testing.T, ep Endpoint, body, stream string, l Limiter) (string, *usage.Call, *upstream, *Meter) {
	t.Helper()
	m, _, _ := Start(ep, []byte(body), Options{})
	if l != nil {
		m.Cap(l, "agent-1", map[string]string{"team": "a"})
	}
	up := &upstream{Reader: iotest.OneByteReader(strings.NewReader(stream))}
	resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: up}
	var got *usage.Call
	m.Wrap(resp, func(c usage.Call) { got = &c })
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got == nil {
		t.Fatal("no call recorded")
	}
	return string(b), got, up, m
}

func chatChunks(n int) (events []string) {
	for i := range n {
		events = append(events, fmt.Sprintf(`data: {"id":"c","model":"gpt-4o","choices":[{"index":0,"delta":{"content":"chunk%03d"}}]}`+"\n\n", i))
	}
	return events
}

func TestCapChatCompletions(t *testing.T) {
	ep := Endpoint{Provider: OpenAI, API: ChatCompletions, AskUsage: true}
	events := chatChunks(10) // 8 bytes of text each: 2 estimated tokens
	stream := strings.Join(events, "") + `data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":20}}` + "\n\ndata: [DONE]\n\n"
	l := &tokenLimit{limit: 7}
	got, call, up, m := capStream(t, ep, `{"model":"gpt-4o","stream":true}`, stream, l)
	want := strings.Join(events[:3], "") +
		`data: {"error":{"type":"budget_exceeded","code":"budget_exceeded","message":"the response was cut by the broker: it would overrun the hard budget cap"}}` + "\n\n"
	if got != want {
		t.Errorf("agent read\n%s\nwant\n%s", got, want)
	}
	if !up.closed || m.CutBy() != "cap" {
		t.Errorf("upstream closed %v, cut by %q", up.closed, m.CutBy())
	}
	// No usage was reported: the call counts what the broker let through, estimated and
	// marked so (a cut call must not leave the budget's counter where it was), and its input
	// estimated from the request's 32 bytes.
	if call.Reported || !call.Estimated || call.In != 8 || call.Out != 8 || call.Model != "gpt-4o" {
		t.Errorf("call %+v", call)
	}
	last := l.asked[len(l.asked)-1] // fewer than 100 asked
	if last.Out != 8 || last.Agent != "agent-1" || last.Labels["team"] != "a" || last.Provider != OpenAI || last.Model != "gpt-4o" {
		t.Errorf("last asked %+v", last)
	}
}

func TestCapMessages(t *testing.T) {
	ep := Endpoint{Provider: Anthropic, API: Messages}
	start := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-sonnet-4\",\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n"
	var deltas []string
	for i := range 6 {
		deltas = append(deltas, fmt.Sprintf("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"abcdefg%d\"}}\n\n", i))
	}
	end := "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":12}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	// 5 in, then 2, 4, 6, 8 out (estimated): the fourth delta overruns 12.
	got, call, up, _ := capStream(t, ep, `{"model":"claude-sonnet-4","stream":true}`, start+strings.Join(deltas, "")+end, &tokenLimit{limit: 12})
	want := start + strings.Join(deltas[:3], "") +
		"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"budget_exceeded\",\"message\":\"the response was cut by the broker: it would overrun the hard budget cap\"}}\n\n"
	if got != want {
		t.Errorf("agent read\n%s\nwant\n%s", got, want)
	}
	if !up.closed {
		t.Error("upstream not closed")
	}
	if !call.Reported || !call.Estimated || call.In != 5 || call.Out != 8 {
		t.Errorf("call %+v, want the input reported and the output let through (estimated)", call)
	}
}

func TestCapNotApplied(t *testing.T) {
	ep := Endpoint{Provider: OpenAI, API: ChatCompletions}
	stream := strings.Join(chatChunks(10), "") + "data: [DONE]\n\n"
	for name, l := range map[string]Limiter{"no hard budget": nil, "within": &tokenLimit{limit: 1000}} {
		got, _, _, m := capStream(t, ep, `{"model":"gpt-4o","stream":true}`, stream, l)
		if got != stream || m.CutBy() != "" {
			t.Errorf("%s: agent read\n%s\nwant the stream as it was", name, got)
		}
	}
}

func TestDeltaText(t *testing.T) {
	cases := []struct {
		api  API
		data string
		want int64
	}{
		{ChatCompletions, `{"choices":[{"delta":{"content":"abc\"d","tool_calls":[{"function":{"arguments":"{\"x\":1}"}}]}}]}`, 6 + 9},
		{ChatCompletions, `{"choices":[{"delta":{"role":"assistant","content": null}}]}`, 0},
		{ChatCompletions, `{"choices":[{"delta":{"content":"say \"content\":\"x\""}}]}`, 21}, // the escaped quotes hide the name
		{Responses, `{"type":"response.output_text.delta","delta":"hello"}`, 5},
		{Responses, `{"type":"response.output_text.done","text":"hello"}`, 0},
		{Messages, `{"type":"content_block_delta","delta":{"type":"text_delta","text":"hi there"}}`, 8},
		{Messages, `{"type":"content_block_delta","delta":{"type":"input_json_delta","partial_json":"{\"a\""}}`, 6},
		{GenerateContent, `{"candidates":[{"content":{"parts":[{"text":"ab"},{"text":"cd"}]}}],"usageMetadata":{}}`, 4},
	}
	for _, c := range cases {
		if got := deltaText(c.api, []byte(c.data)); got != c.want {
			t.Errorf("deltaText(%s) = %d, want %d", c.data, got, c.want)
		}
	}
}
