package llm

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"net/http"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/usage"
	"github.com/capbroker/capbroker/broker/wire/strictjson"
)

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestMatch(t *testing.T) {
	no := false
	e := NewEndpoints(config.LLM{OpenAICompatible: []config.OpenAICompatible{
		{Name: "vllm", Hosts: []string{"llm.internal", "*.inference.example"}, PathPrefix: "/openai/v1"},
		{Name: "old", Hosts: []string{"old.internal"}, RequestUsage: &no},
	}, AnthropicCompatible: []config.OpenAICompatible{
		{Name: "claude-gw", Hosts: []string{"llm.internal"}, PathPrefix: "/anthropic/v1"},
	}})
	cases := map[string]struct {
		host, path string
		want       Endpoint
		ok         bool
	}{
		"openai chat":           {"api.openai.com", "/v1/chat/completions", Endpoint{Provider: OpenAI, API: ChatCompletions, AskUsage: true}, true},
		"openai responses":      {"api.openai.com", "/v1/responses", Endpoint{Provider: OpenAI, API: Responses}, true},
		"openai models":         {"api.openai.com", "/v1/models", Endpoint{}, false},
		"openai completions":    {"api.openai.com", "/v1/completions", Endpoint{Provider: OpenAI, API: Completions, AskUsage: true}, true},
		"openai embeddings":     {"api.openai.com", "/v1/embeddings", Endpoint{Provider: OpenAI, API: Embeddings}, true},
		"compatible embeddings": {"llm.internal", "/openai/v1/embeddings", Endpoint{Provider: "vllm", API: Embeddings}, true},
		"openai sub-path":       {"api.openai.com", "/v1/chat/completions/x", Endpoint{}, false},
		"anthropic":             {"api.anthropic.com", "/v1/messages", Endpoint{Provider: Anthropic, API: Messages}, true},
		"anthropic count":       {"api.anthropic.com", "/v1/messages/count_tokens", Endpoint{}, false},
		"gemini":                {"generativelanguage.googleapis.com", "/v1beta/models/gemini-2.5-flash:generateContent", Endpoint{Provider: Gemini, API: GenerateContent, Model: "gemini-2.5-flash"}, true},
		"gemini stream":         {"generativelanguage.googleapis.com", "/v1/models/gemini-2.0-flash:streamGenerateContent", Endpoint{Provider: Gemini, API: GenerateContent, Model: "gemini-2.0-flash"}, true},
		"gemini count":          {"generativelanguage.googleapis.com", "/v1beta/models/gemini-2.0-flash:countTokens", Endpoint{}, false},
		"gemini no model":       {"generativelanguage.googleapis.com", "/v1beta/models/:generateContent", Endpoint{}, false},
		"compatible":            {"llm.internal", "/openai/v1/chat/completions", Endpoint{Provider: "vllm", API: ChatCompletions, AskUsage: true}, true},
		"compatible wild":       {"a.inference.example", "/openai/v1/responses", Endpoint{Provider: "vllm", API: Responses}, true},
		"compatible apex":       {"inference.example", "/openai/v1/responses", Endpoint{}, false},
		"compatible prefix":     {"llm.internal", "/v1/chat/completions", Endpoint{}, false},
		"compatible no ask":     {"old.internal", "/v1/chat/completions", Endpoint{Provider: "old", API: ChatCompletions}, true},
		"anthropic compatible":  {"llm.internal", "/anthropic/v1/messages", Endpoint{Provider: "claude-gw", API: Messages}, true},
		"anthropic compat path": {"llm.internal", "/anthropic/v1/chat/completions", Endpoint{}, false},
		"another host":          {"example.com", "/v1/chat/completions", Endpoint{}, false},
		"openai look-alike":     {"api.openai.com.evil", "/v1/chat/completions", Endpoint{}, false},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			got, ok := e.Match(c.host, c.path)
			if ok != c.ok || got != c.want {
				t.Errorf("Match(%q, %q) = %+v, %v; want %+v, %v", c.host, c.path, got, ok, c.want, c.ok)
			}
		})
	}
}

func TestProviderAndFree(t *testing.T) {
	e := NewEndpoints(config.LLM{OpenAICompatible: []config.OpenAICompatible{{Name: "vllm", Hosts: []string{"*.inference.example"}}}})
	for host, want := range map[string]string{"api.openai.com": OpenAI, "api.anthropic.com": Anthropic,
		"generativelanguage.googleapis.com": Gemini, "a.inference.example": "vllm", "inference.example": "", "example.com": ""} {
		if got := e.Provider(host); got != want {
			t.Errorf("Provider(%q) = %q, want %q", host, got, want)
		}
	}
	cases := []struct {
		method, path  string
		upgrade, free bool
	}{
		{"GET", "/v1/models", false, true},
		{"HEAD", "/v1/responses/resp_1", false, true},
		{"GET", "/v1/realtime", true, false},
		{"POST", "/v1/messages/count_tokens", false, true},
		{"POST", "/v1beta/models/gemini-2.0-flash:countTokens", false, true},
		{"POST", "/v1/audio/speech", false, false},
		{"POST", "/v1/batches", false, false},
		{"PUT", "/v1/chat/completions", false, false},
		{"OPTIONS", "/v1/chat/completions", false, false},
	}
	for _, c := range cases {
		if got := Free(c.method, c.path, c.upgrade); got != c.free {
			t.Errorf("Free(%s %s, upgrade %v) = %v", c.method, c.path, c.upgrade, got)
		}
	}
}

func TestAskUsage(t *testing.T) {
	chat := Endpoint{Provider: OpenAI, API: ChatCompletions, AskUsage: true}
	const asked = `{"stream":true,"stream_options":{"include_usage":true}}`
	cases := map[string]struct {
		body, want string // want "" means left as it is
		err        error  // the refusal, when the body is refused
	}{
		"stream":             {body: `{"model":"gpt-4o","stream":true,"messages":[]}`, want: `{"stream":true,"stream_options":{"include_usage":true},"model":"gpt-4o","messages":[]}`},
		"spaces":             {body: ` { "stream": true }`, want: asked},
		"options without":    {body: `{"stream":true,"stream_options":{"x":1}}`, want: `{"stream":true,"stream_options":{"include_usage":true,"x":1}}`},
		"options false":      {body: `{"stream":true,"stream_options":{"include_usage":false}}`, want: asked},
		"options null":       {body: `{"stream":true,"stream_options":null}`, want: asked},
		"asked already":      {body: `{"stream":true,"stream_options":{"include_usage":true}}`},
		"not streamed":       {body: `{"model":"gpt-4o","messages":[]}`},
		"stream false":       {body: `{"stream":false}`},
		"stream 1":           {body: `{"stream":1}`, want: asked},
		"stream 1.0":         {body: `{"stream":1.0,"stream_options":{"include_usage":true}}`, want: asked},
		"stream string":      {body: `{"stream":"true"}`, want: asked},
		"stream yes":         {body: `{"stream":" Yes "}`, want: asked},
		"stream 0":           {body: `{"stream":0,"n":1}`, want: `{"stream":false,"n":1}`},
		"stream string 0":    {body: `{"stream":"off"}`, want: `{"stream":false}`},
		"stream 2":           {body: `{"stream":2}`, err: ErrUnreadable},
		"stream maybe":       {body: `{"stream":"maybe"}`, err: ErrUnreadable},
		"stream object":      {body: `{"stream":{}}`, err: ErrUnreadable},
		"options not object": {body: `{"stream":true,"stream_options":3}`, err: ErrUnreadable},
		"Stream":             {body: `{"Stream":true}`, err: ErrAmbiguous},
		"STREAM_OPTIONS":     {body: `{"stream":true,"STREAM_OPTIONS":{"include_usage":true}}`, err: ErrAmbiguous},
		"streamoptions":      {body: `{"stream":true,"streamoptions":{}}`, err: ErrAmbiguous},
		"long s":             {body: `{"\u017ftream":true}`, err: ErrAmbiguous},
		"Include_Usage":      {body: `{"stream":true,"stream_options":{"Include_Usage":true}}`, err: ErrAmbiguous},
		"include-usage":      {body: `{"stream":true,"stream_options":{"include-usage":true}}`, err: ErrAmbiguous},
		"both usages":        {body: `{"stream":true,"stream_options":{"include_usage":true,"Include_Usage":false}}`, err: strictjson.ErrAmbiguous},
		"stream twice":       {body: `{"stream":false,"stream":true}`, err: strictjson.ErrAmbiguous},
		"Model":              {body: `{"model":"a","Model":"b"}`, err: strictjson.ErrAmbiguous},
		"not json":           {body: `stream=true`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			in := []byte(c.body)
			m, nb, err := Start(chat, in, Options{})
			if string(in) != c.body {
				t.Fatalf("the agent's body was changed in place: %s", in)
			}
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("Start(%s): error %v, want %v", c.body, err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Start(%s): %v", c.body, err)
			}
			if string(nb) != c.want || m.Asked() != (strings.Contains(c.want, "include_usage") && !strings.Contains(c.body, "include_usage\":true")) {
				t.Errorf("Start(%s) = %s (asked %v), want %s", c.body, nb, m.Asked(), c.want)
			}
			if nb != nil {
				if err := strictjson.Check(nb); err != nil {
					t.Errorf("the rewritten body is not strict JSON: %v", err)
				}
			}
		})
	}
	if _, nb, _ := Start(Endpoint{Provider: "old", API: ChatCompletions}, []byte(`{"stream":true}`), Options{}); nb != nil {
		t.Errorf("an endpoint with request_usage false was asked for usage: %s", nb)
	}
	if _, nb, _ := Start(Endpoint{Provider: OpenAI, API: Responses, AskUsage: true}, []byte(`{"stream":true}`), Options{}); nb != nil {
		t.Errorf("a responses request was rewritten: %s", nb)
	}
	if _, nb, _ := Start(Endpoint{Provider: OpenAI, API: Responses}, []byte(`{"stream":"1"}`), Options{}); string(nb) != `{"stream":true}` {
		t.Errorf("a responses request streaming with \"1\" was sent as %s", nb)
	}
	if _, nb, _ := Start(Endpoint{Provider: Anthropic, API: Messages}, []byte(`{"model":"c","stream":1}`), Options{}); string(nb) != `{"stream":true,"model":"c"}` {
		t.Errorf("a messages request streaming with 1 was sent as %s", nb)
	}
	// Under a budget, a body the broker cannot read is refused; without one it is sent.
	for _, body := range [][]byte{nil, []byte(`stream=true`), []byte(`[1]`)} {
		if _, _, err := Start(chat, body, Options{Budgeted: true}); !errors.Is(err, ErrUnreadable) {
			t.Errorf("budgeted %q: %v", body, err)
		}
		if _, _, err := Start(chat, body, Options{}); err != nil {
			t.Errorf("unbudgeted %q: %v", body, err)
		}
	}
	resp := Endpoint{Provider: OpenAI, API: Responses}
	if _, _, err := Start(resp, []byte(`{"background":true}`), Options{Budgeted: true}); !errors.Is(err, ErrUnreadable) {
		t.Errorf("a background response under a budget: %v", err)
	}
}

// meter runs body through a meter of ep with request req, read in pieces of n bytes, and
// returns what the agent got and the call.
func meter(t *testing.T, ep Endpoint, req, contentType string, body []byte, n int) ([]byte, usage.Call, int) {
	t.Helper()
	m, _, _ := Start(ep, []byte(req), Options{})
	resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {contentType}}, Body: io.NopCloser(&pieces{b: body, n: n})}
	var calls []usage.Call
	m.Wrap(resp, func(c usage.Call) { calls = append(calls, c) })
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	resp.Body.Close()
	if len(calls) != 1 {
		t.Fatalf("done called %d times, want once", len(calls))
	}
	return got, calls[0], len(calls)
}

// pieces reads b n bytes at a time.
type pieces struct {
	b []byte
	n int
}

func (p *pieces) Read(b []byte) (int, error) {
	if len(p.b) == 0 {
		return 0, io.EOF
	}
	n := copy(b[:min(len(b), p.n)], p.b)
	p.b = p.b[n:]
	return n, nil
}

var (
	chatEP      = Endpoint{Provider: OpenAI, API: ChatCompletions, AskUsage: true}
	responsesEP = Endpoint{Provider: OpenAI, API: Responses}
	messagesEP  = Endpoint{Provider: Anthropic, API: Messages}
	geminiEP    = Endpoint{Provider: Gemini, API: GenerateContent, Model: "gemini-2.0-flash"}
)

func TestDocumentedShapes(t *testing.T) {
	const (
		sse  = "text/event-stream; charset=utf-8"
		json = "application/json"
	)
	cases := map[string]struct {
		ep         Endpoint
		req, ctype string
		fixture    string
		want       usage.Call
	}{
		"openai chat json":              {chatEP, `{"model":"gpt-4.1","messages":[]}`, json, "openai_chat.json", usage.Call{Provider: "openai", Model: "gpt-4.1", In: 19, Out: 10, Cached: 3, Reported: true}},
		"openai chat stream":            {chatEP, `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true}}`, sse, "openai_chat_usage.sse", usage.Call{Provider: "openai", Model: "gpt-4o-mini", In: 9, Out: 12, Cached: 4, Reported: true}},
		"openai chat no usage":          {chatEP, `{"model":"gpt-4o-mini","stream":true}`, sse, "openai_chat_nousage.sse", usage.Call{Provider: "openai", Model: "gpt-4o-mini", In: 10, Out: 2, Estimated: true}},
		"responses json":                {responsesEP, `{"model":"gpt-4o","input":"hi"}`, json, "openai_responses.json", usage.Call{Provider: "openai", Model: "gpt-4o", In: 328, Out: 52, Cached: 128, Reported: true}},
		"responses stream":              {responsesEP, `{"model":"gpt-4.1","stream":true}`, sse, "openai_responses.sse", usage.Call{Provider: "openai", Model: "gpt-4.1", In: 37, Out: 11, Cached: 5, Reported: true}},
		"responses model from response": {responsesEP, ``, sse, "openai_responses.sse", usage.Call{Provider: "openai", Model: "gpt-4.1-2025-04-14", In: 37, Out: 11, Cached: 5, Reported: true}},
		"anthropic json":                {messagesEP, `{"model":"claude-sonnet-4-0","max_tokens":1024}`, json, "anthropic.json", usage.Call{Provider: "anthropic", Model: "claude-sonnet-4-0", In: 3895, Out: 503, Cached: 1800, Reported: true}},
		"anthropic stream":              {messagesEP, `{"model":"claude-sonnet-4-0","stream":true}`, sse, "anthropic.sse", usage.Call{Provider: "anthropic", Model: "claude-sonnet-4-0", In: 135, Out: 15, Cached: 100, Reported: true}},
		"anthropic model from stream":   {messagesEP, `{"stream":true}`, sse, "anthropic.sse", usage.Call{Provider: "anthropic", Model: "claude-sonnet-4-20250514", In: 135, Out: 15, Cached: 100, Reported: true}},
		"gemini json":                   {geminiEP, `{"contents":[]}`, json, "gemini.json", usage.Call{Provider: "gemini", Model: "gemini-2.0-flash", In: 8, Out: 16, Cached: 3, Reported: true}},
		"gemini sse crlf":               {geminiEP, `{"contents":[]}`, "text/event-stream", "gemini.sse", usage.Call{Provider: "gemini", Model: "gemini-2.0-flash", In: 9, Out: 21, Reported: true}},
	}
	for name, c := range cases {
		body := fixture(t, c.fixture)
		for _, n := range []int{1, 2, 3, 7, 64, len(body)} {
			got, call, _ := meter(t, c.ep, c.req, c.ctype, body, n)
			if !reflect.DeepEqual(call, c.want) {
				t.Errorf("%s, read %d bytes at a time: call %+v, want %+v", name, n, call, c.want)
			}
			if !bytes.Equal(got, body) {
				t.Errorf("%s, read %d bytes at a time: the agent got\n%s\nwant\n%s", name, n, got, body)
			}
		}
	}
}

// Line endings of every kind, as the SSE format allows them: CRLF, LF and CR.
func TestLineEndings(t *testing.T) {
	body := fixture(t, "anthropic.sse")
	want := usage.Call{Provider: "anthropic", Model: "claude-sonnet-4-0", In: 135, Out: 15, Cached: 100, Reported: true}
	for name, eol := range map[string]string{"crlf": "\r\n", "cr": "\r", "lf": "\n"} {
		b := bytes.ReplaceAll(body, []byte("\n"), []byte(eol))
		for _, n := range []int{1, 5, len(b)} {
			got, call, _ := meter(t, messagesEP, `{"model":"claude-sonnet-4-0","stream":true}`, "text/event-stream", b, n)
			if !reflect.DeepEqual(call, want) || !bytes.Equal(got, b) {
				t.Errorf("%s by %d: call %+v, want %+v", name, n, call, want)
			}
		}
	}
	// A last event without its empty line still counts.
	b := bytes.TrimRight(fixture(t, "gemini.sse"), "\r\n")
	if _, call, _ := meter(t, geminiEP, `{}`, "text/event-stream", b, 10); !call.Reported || call.Out != 21 {
		t.Errorf("a stream ending without its last empty line: %+v", call)
	}
}

func TestUnreported(t *testing.T) {
	const sse = "text/event-stream"
	start := `event: message_start` + "\n" + `data: {"type":"message_start","message":{"model":"claude","usage":{"input_tokens":25,"output_tokens":1}}}` + "\n\n"
	cases := map[string]struct {
		ep    Endpoint
		ctype string
		body  string
	}{
		"chat usage not a number":  {chatEP, "application/json", `{"model":"m","usage":{"prompt_tokens":"nine","completion_tokens":1}}`},
		"chat usage missing out":   {chatEP, "application/json", `{"model":"m","usage":{"prompt_tokens":9}}`},
		"chat usage negative":      {chatEP, "application/json", `{"model":"m","usage":{"prompt_tokens":-9,"completion_tokens":1}}`},
		"chat no usage":            {chatEP, "application/json", `{"model":"m","choices":[]}`},
		"chat usage null":          {chatEP, "application/json", `{"model":"m","usage":null}`},
		"chat not json":            {chatEP, "application/json", `<html>oops</html>`},
		"chat stream bad usage":    {chatEP, sse, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1.5,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n"},
		"chat stream broken json":  {chatEP, sse, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1\n\n"},
		"responses no usage":       {responsesEP, sse, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"m\",\"usage\":null}}\n\n"},
		"anthropic delta only":     {messagesEP, sse, "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n"},
		"anthropic delta bad":      {messagesEP, sse, start + "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":\"x\"}}\n\n"},
		"anthropic start no input": {messagesEP, sse, "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"output_tokens\":1}}}\n\n"},
		"gemini no prompt count":   {geminiEP, "application/json", `{"usageMetadata":{"candidatesTokenCount":3}}`},
		"gemini no usage":          {geminiEP, sse, "data: {\"candidates\":[]}\r\n\r\n"},
		"empty":                    {chatEP, "application/json", ``},
	}
	for name, c := range cases {
		// Charged the estimate: the request's 13 bytes are 4 tokens in, at least.
		_, call, _ := meter(t, c.ep, `{"model":"m"}`, c.ctype, []byte(c.body), 4)
		if call.Reported || !call.Estimated || call.In < 4 {
			t.Errorf("%s: %+v, want unreported and estimated", name, call)
		}
	}
	// An error answer carries no usage.
	m, _, _ := Start(chatEP, []byte(`{"model":"m"}`), Options{})
	resp := &http.Response{StatusCode: 429, Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(`{"error":{"message":"slow down"}}`))}
	var got usage.Call
	m.Wrap(resp, func(c usage.Call) { got = c })
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if got.Reported || got.Provider != "openai" || got.Model != "m" {
		t.Errorf("429: %+v", got)
	}
}

// An event over maxEvent, and a JSON body of any size, is passed on whole and read for its
// usage as it passes, wherever the usage is in it.
func TestHugeEvent(t *testing.T) {
	huge := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", maxEvent+10) + "\"}}],\"usage\":null}\n\n"
	tail := string(fixture(t, "openai_chat_usage.sse"))
	body := []byte(huge + tail)
	want := usage.Call{Provider: "openai", Model: "m", In: 9, Out: 12, Cached: 4, Reported: true}
	for _, asked := range []bool{false, true} {
		req := `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`
		if asked {
			req = `{"model":"m","stream":true}`
		}
		got, call, _ := meter(t, chatEP, req, "text/event-stream", body, 32<<10)
		if !reflect.DeepEqual(call, want) {
			t.Errorf("asked %v: %+v, want %+v", asked, call, want)
		}
		if !bytes.HasPrefix(got, []byte(strings.TrimSuffix(huge, "\"}}],\"usage\":null}\n\n"))) {
			t.Errorf("asked %v: the huge event did not reach the agent whole", asked)
		}
	}
	// A Responses stream's response.completed restates the whole output: over maxEvent, its
	// usage is read all the same, in one data line or several.
	for _, sep := range []string{"", "\ndata: "} {
		completed := "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"gpt\",\"output\":[{\"text\":\"" +
			strings.Repeat("z", maxEvent) + "\"}]," + sep + "\"usage\":{\"input_tokens\":120,\"output_tokens\":80}}}\n\n"
		_, call, _ := meter(t, responsesEP, `{"model":"gpt","stream":true}`, "text/event-stream", []byte(completed), 7<<10)
		if !call.Reported || call.In != 120 || call.Out != 80 {
			t.Errorf("a response.completed over maxEvent (sep %q): %+v", sep, call)
		}
	}
	// A JSON body over maxEvent: its usage, before or after the bulk.
	for name, jb := range map[string][]byte{
		"usage last":  []byte(`{"model":"m","x":"` + strings.Repeat("y", 3*maxEvent) + `","usage":{"prompt_tokens":1,"completion_tokens":2}}`),
		"usage first": []byte(`{"usage":{"prompt_tokens":1,"completion_tokens":2},"model":"m","x":[` + strings.Repeat(`{"token":"\"usage\":{","logprob":-0.1},`, 100000) + `0]}`),
	} {
		got, call, _ := meter(t, chatEP, `{}`, "application/json", jb, 32<<10)
		if !call.Reported || call.In != 1 || call.Out != 2 || !bytes.Equal(got, jb) {
			t.Errorf("huge JSON body, %s: %+v, passed on whole %v", name, call, bytes.Equal(got, jb))
		}
	}
}

// An upstream that sends the usage twice, in two spellings a client may read as one, is not
// believed: the call is charged the estimate (at least the larger of what it reported).
func TestAmbiguousUsage(t *testing.T) {
	for name, body := range map[string]string{
		"Usage":       `{"model":"m","usage":{"prompt_tokens":1,"completion_tokens":1},"Usage":{"prompt_tokens":900,"completion_tokens":900}}`,
		"twice":       `{"model":"m","usage":{"prompt_tokens":900,"completion_tokens":900},"usage":{"prompt_tokens":1,"completion_tokens":1}}`,
		"inner":       `{"model":"m","usage":{"prompt_tokens":1,"Prompt_Tokens":900,"completion_tokens":1}}`,
		"escaped":     `{"model":"m","usage":{"prompt_tokens":1,"completion_tokens":1},"\u0075sage":{"prompt_tokens":900,"completion_tokens":900}}`,
		"long s name": `{"model":"m","usage":{"prompt_tokens":1,"completion_tokens":1},"u\u017fage":{"prompt_tokens":900,"completion_tokens":900}}`,
	} {
		_, call, _ := meter(t, chatEP, `{"model":"m"}`, "application/json", []byte(body), 5)
		if call.Reported || !call.Estimated {
			t.Errorf("%s: %+v, want an estimate", name, call)
		}
		if name != "inner" && (call.In < 900 || call.Out < 900) {
			t.Errorf("%s: %+v, want the larger of the two usages", name, call)
		}
	}
}

// The broker asked for usage the agent did not: the usage-only chunk, and the "usage": null
// of the others, never reach the agent; the call has the usage.
func TestAskedUsageRemoved(t *testing.T) {
	body := fixture(t, "openai_chat_usage.sse")
	var want bytes.Buffer
	for _, ev := range strings.SplitAfter(string(body), "\n\n") {
		if strings.Contains(ev, `"choices":[]`) {
			continue
		}
		want.WriteString(strings.ReplaceAll(ev, `,"usage":null`, ""))
	}
	for _, eol := range []string{"\n", "\r\n"} {
		b := bytes.ReplaceAll(body, []byte("\n"), []byte(eol))
		w := bytes.ReplaceAll(want.Bytes(), []byte("\n"), []byte(eol))
		for _, n := range []int{1, 3, 100, len(b)} {
			got, call, _ := meter(t, chatEP, `{"model":"gpt-4o-mini","stream":true}`, "text/event-stream", b, n)
			if !bytes.Equal(got, w) {
				t.Errorf("eol %q by %d: the agent got\n%q\nwant\n%q", eol, n, got, w)
			}
			if call.In != 9 || call.Out != 12 || call.Cached != 4 || !call.Reported {
				t.Errorf("eol %q by %d: %+v", eol, n, call)
			}
			if bytes.Contains(got, []byte("usage")) && !bytes.Contains(got, []byte(`\"usage\"`)) {
				t.Errorf("the agent saw usage")
			}
		}
	}
}

// Metering reads what scrubbing decoded; a body the upstream gzipped anyway is decoded here.
func TestGzip(t *testing.T) {
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(fixture(t, "anthropic.json"))
	zw.Close()
	m, _, _ := Start(messagesEP, []byte(`{"model":"claude"}`), Options{})
	resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}, "Content-Encoding": {"gzip"}}, Body: io.NopCloser(&z)}
	var got usage.Call
	m.Wrap(resp, func(c usage.Call) { got = c })
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !got.Reported || got.Out != 503 || !bytes.Equal(b, fixture(t, "anthropic.json")) || resp.Header.Get("Content-Encoding") != "" {
		t.Errorf("gzip: %+v, body %q", got, b)
	}
	// Another coding is passed on unread.
	m, _, _ = Start(messagesEP, []byte(`{"model":"claude"}`), Options{})
	resp = &http.Response{StatusCode: 200, Header: http.Header{"Content-Encoding": {"br"}}, Body: io.NopCloser(strings.NewReader("\x01\x02"))}
	m.Wrap(resp, func(c usage.Call) { got = c })
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if got.Reported || string(b) != "\x01\x02" || resp.Header.Get("Content-Encoding") != "br" {
		t.Errorf("br: %+v", got)
	}
}

// The agent going away before the end: done is called once, on Close, with what was read.
func TestClosedEarly(t *testing.T) {
	body := fixture(t, "anthropic.sse")
	m, _, _ := Start(messagesEP, []byte(`{"model":"claude","stream":true}`), Options{})
	resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: io.NopCloser(bytes.NewReader(body))}
	n := 0
	var got usage.Call
	m.Wrap(resp, func(c usage.Call) { got = c; n++ })
	buf := make([]byte, bytes.Index(body, []byte("content_block_start")))
	io.ReadFull(resp.Body, buf)
	resp.Body.Close()
	if n != 1 || !got.Reported || got.In != 135 || got.Out != 1 {
		t.Errorf("closed after message_start: %d calls, %+v", n, got)
	}
}

// Each event reaches the agent before the upstream sends the next: the meter holds nothing
// back (passed through), or only the event not yet ended (the usage chunk filter).
func TestNoDelay(t *testing.T) {
	events := strings.SplitAfter(string(fixture(t, "openai_chat_usage.sse")), "\n\n")
	events = events[:len(events)-1]
	for name, req := range map[string]string{
		"passed through": `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`,
		"filtered":       `{"model":"m","stream":true}`,
	} {
		t.Run(name, func(t *testing.T) {
			pr, pw := io.Pipe()
			m, _, _ := Start(chatEP, []byte(req), Options{})
			resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: pr}
			m.Wrap(resp, nil)
			next := make(chan struct{})
			go func() {
				for _, ev := range events {
					// Half an event, then the rest: only once the agent read what came.
					pw.Write([]byte(ev[:len(ev)/2]))
					pw.Write([]byte(ev[len(ev)/2:]))
					<-next
				}
				pw.Close()
			}()
			for i, ev := range events {
				if strings.Contains(ev, `"choices":[]`) && name == "filtered" {
					// Dropped: the reads of the next event take it.
					go func() { next <- struct{}{} }()
					continue
				}
				want := ev
				if name == "filtered" {
					want = strings.ReplaceAll(ev, `,"usage":null`, "")
				}
				got := make([]byte, 0, len(want))
				done := make(chan error, 1)
				go func() {
					for len(got) < len(want) {
						buf := make([]byte, 64<<10)
						n, err := resp.Body.Read(buf)
						got = append(got, buf[:n]...)
						if err != nil {
							done <- err
							return
						}
					}
					done <- nil
				}()
				select {
				case err := <-done:
					if err != nil || string(got) != want {
						t.Fatalf("event %d: got %q (%v), want %q", i, got, err, want)
					}
				case <-time.After(10 * time.Second): // a failure guard, not a synchronisation
					t.Fatalf("event %d did not reach the agent before the upstream sent the next", i)
				}
				next <- struct{}{}
			}
			if rest, err := io.ReadAll(resp.Body); err != nil || len(rest) != 0 {
				t.Errorf("after the events: %q, %v", rest, err)
			}
			resp.Body.Close()
		})
	}
}

func TestReadRequest(t *testing.T) {
	cases := map[string]struct {
		body string
		want Request
	}{
		"usual":         {`{"model":"gpt-4o","messages":[{"role":"user","content":"a \"model\": \"x\" }"}],"stream":true,"stream_options":{"include_usage":true}}`, Request{Model: "gpt-4o", Stream: true, IncludeUsage: true}},
		"include usage": {` {"stream" : true, "stream_options": {"include_usage": true}, "model": "m"} `, Request{Model: "m", Stream: true, IncludeUsage: true}},
		"nested model":  {`{"x":{"model":"no"},"model":"yes"}`, Request{Model: "yes"}},
		"escaped value": {`{"model":"gpt\u002d4"}`, Request{Model: "gpt-4"}},
		"not an object": {`["model"]`, Request{}},
		"broken":        {`{"model":"m"`, Request{}},
		"model number":  {`{"model":4}`, Request{}},
		"empty":         {`{}`, Request{}},
		"backslashes":   {`{"p":"a\\","model":"m","q":"b\"\\\"}","stream":true,"stream_options":{"include_usage":true}}`, Request{Model: "m", Stream: true, IncludeUsage: true}},
		"quote in name": {`{"a\"model":"x","model":"m"}`, Request{Model: "m"}},
	}
	for name, c := range cases {
		got, _, err := readRequest(chatEP, []byte(c.body), false)
		got.Size = 0
		if err != nil || got != c.want {
			t.Errorf("%s: %+v, %v; want %+v", name, got, err, c.want)
		}
	}
}

func BenchmarkParseRequest(b *testing.B) {
	body := []byte(`{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"` + strings.Repeat("Say ok. ", 4096) + `"}],"max_tokens":8,"stream":true}`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		readRequest(chatEP, body, true)
	}
}

// Embeddings and legacy completions are metered: usage in the body, or in a completions
// stream's last chunk.
func TestEmbeddingsAndCompletions(t *testing.T) {
	emb := Endpoint{Provider: OpenAI, API: Embeddings}
	body := `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,-0.2]}],"model":"text-embedding-3-small","usage":{"prompt_tokens":8,"total_tokens":8}}`
	if _, call, _ := meter(t, emb, `{"model":"text-embedding-3-small","input":"hi"}`, "application/json", []byte(body), 3); !call.Reported || call.In != 8 || call.Out != 0 || call.Model != "text-embedding-3-small" {
		t.Errorf("embeddings: %+v", call)
	}
	comp := Endpoint{Provider: OpenAI, API: Completions, AskUsage: true}
	stream := "data: {\"choices\":[{\"text\":\"hello\",\"index\":0}],\"model\":\"gpt-3.5-turbo-instruct\"}\n\n" +
		"data: {\"choices\":[],\"model\":\"gpt-3.5-turbo-instruct\",\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7,\"total_tokens\":12}}\n\ndata: [DONE]\n\n"
	m, nb, err := Start(comp, []byte(`{"model":"gpt-3.5-turbo-instruct","prompt":"x","stream":"true"}`), Options{})
	if err != nil || string(nb) != `{"stream":true,"stream_options":{"include_usage":true},"model":"gpt-3.5-turbo-instruct","prompt":"x"}` {
		t.Fatalf("completions request sent as %s, %v", nb, err)
	}
	resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: io.NopCloser(strings.NewReader(stream))}
	var call usage.Call
	m.Wrap(resp, func(c usage.Call) { call = c })
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !call.Reported || call.In != 5 || call.Out != 7 || strings.Contains(string(got), "usage") {
		t.Errorf("completions stream: %+v, the agent got %s", call, got)
	}
}

// A stream the agent leaves before its usage came is charged what came, estimated: leaving
// early does not make a call free.
func TestAgentLeavesEarly(t *testing.T) {
	m, _, _ := Start(chatEP, []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"`+strings.Repeat("p", 400)+`"}]}`), Options{})
	var events [][]byte // one per read, as an upstream sends them
	for range 10 {
		events = append(events, []byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"abcdefgh\"}}]}\n\n"))
	}
	events = append(events, []byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":20}}\n\n"))
	resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: io.NopCloser(&eventReader{events: events})}
	var call usage.Call
	m.Wrap(resp, func(c usage.Call) { call = c })
	buf := make([]byte, 5*len(events[0]))
	io.ReadFull(resp.Body, buf)
	resp.Body.Close()
	if call.Reported || !call.Estimated || call.In < 100 || call.Out < 10 {
		t.Errorf("a stream left early: %+v", call)
	}
}

// A JSON answer the agent leaves before its end was generated whole: it is charged at least
// the output the request allowed.
func TestAgentLeavesJSONEarly(t *testing.T) {
	m, _, _ := Start(chatEP, []byte(`{"model":"m","max_completion_tokens":3000,"messages":[]}`), Options{})
	body := `{"model":"m","choices":[{"message":{"content":"` + strings.Repeat("x", 100000) + `"}}],"usage":{"prompt_tokens":10,"completion_tokens":2500}}`
	resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(&pieces{b: []byte(body), n: 1000})}
	var call usage.Call
	m.Wrap(resp, func(c usage.Call) { call = c })
	io.ReadFull(resp.Body, make([]byte, 2000))
	resp.Body.Close()
	if call.Reported || !call.Estimated || call.Out < 3000 {
		t.Errorf("a JSON answer left early: %+v", call)
	}
}
