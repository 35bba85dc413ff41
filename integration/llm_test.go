package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// llmPolicy intercepts tunnels to the stand-in and lets every request through with the canary
// credential: the responses are scrubbed (and so decoded) before they are metered.
const llmPolicy = `package broker

default decision := {"allow": false, "reason": "not allowed by the llm test policy"}

decision := {"allow": true, "intercept": true} if {
	input.phase == "connect"
	input.request.host == "127.0.0.1"
}

decision := {"allow": true, "credentials": ["canary"]} if {
	input.phase == "request"
	startswith(input.request.path, "/api/custom/v1/")
}
`

// llmUsage is what the stand-in reports for each model: the request's model picks it.
var llmUsage = map[string]struct{ in, out, cacheRead, cacheWrite int }{
	"gpt-json":         {11, 7, 2, 0},
	"gpt-stream":       {13, 5, 0, 0},
	"gpt-stream-usage": {17, 9, 4, 0},
	"gpt-resp":         {30, 6, 1, 0},
	"gpt-resp-stream":  {31, 12, 0, 0},
	"claude-json":      {21, 8, 3, 0},
	"claude-stream":    {25, 15, 100, 10},
}

// llmStandIn answers as OpenAI's chat completions and responses APIs and Anthropic's messages
// API do, in their documented shapes, JSON and streamed, with the usage of llmUsage. It
// records which streams asked for usage.
type llmStandIn struct {
	mu    sync.Mutex
	asked map[string]bool // model -> the chat stream request had stream_options.include_usage
}

func (s *llmStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model         string `json:"model"`
		Stream        bool   `json:"stream"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, "bad json", 400)
		return
	}
	u := llmUsage[req.Model]
	flusher, _ := w.(http.Flusher)
	event := func(format string, args ...any) {
		fmt.Fprintf(w, format, args...)
		flusher.Flush()
	}
	switch {
	case strings.HasSuffix(r.URL.Path, "/v1/chat/completions") && !req.Stream:
		w.Header().Set("Content-Type", "application/json")
		usage := fmt.Sprintf(`,"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}`, u.in, u.out, u.in+u.out, u.cacheRead)
		if req.Model == "gpt-nousage" {
			usage = ""
		}
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1741569952,"model":"%s-2025","choices":[{"index":0,"message":{"role":"assistant","content":"hello","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}]%s,"service_tier":"default"}`, req.Model, usage)
	case strings.HasSuffix(r.URL.Path, "/v1/chat/completions"):
		include := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
		s.mu.Lock()
		s.asked[req.Model] = include
		s.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		null := ""
		if include {
			null = `,"usage":null`
		}
		for i, delta := range []string{`{"role":"assistant","content":""}`, `{"content":"hel"}`, `{"content":"lo"}`} {
			event("data: {\"id\":\"chatcmpl-2\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"%s-2025\",\"system_fingerprint\":\"fp_1\",\"choices\":[{\"index\":0,\"delta\":%s,\"logprobs\":null,\"finish_reason\":%s}]%s}\n\n",
				req.Model, delta, map[bool]string{true: `"stop"`, false: "null"}[i == 2], null)
		}
		if include {
			event("data: {\"id\":\"chatcmpl-2\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"%s-2025\",\"system_fingerprint\":\"fp_1\",\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n",
				req.Model, u.in, u.out, u.in+u.out, u.cacheRead)
		}
		event("data: [DONE]\n\n")
	case strings.HasSuffix(r.URL.Path, "/v1/responses") && req.Stream:
		w.Header().Set("Content-Type", "text/event-stream")
		event("event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_2\",\"object\":\"response\",\"created_at\":1741290958,\"status\":\"in_progress\",\"model\":\"%s-2025\",\"output\":[],\"usage\":null}}\n\n", req.Model)
		event("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"msg_2\",\"output_index\":0,\"content_index\":0,\"delta\":\"hel\"}\n\n")
		event("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":2,\"item_id\":\"msg_2\",\"output_index\":0,\"content_index\":0,\"delta\":\"lo\"}\n\n")
		event("event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":3,\"response\":{\"id\":\"resp_2\",\"object\":\"response\",\"created_at\":1741290958,\"status\":\"completed\",\"model\":\"%s-2025\",\"output\":[{\"id\":\"msg_2\",\"type\":\"message\",\"status\":\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"hello\",\"annotations\":[]}]}],\"usage\":{\"input_tokens\":%d,\"input_tokens_details\":{\"cached_tokens\":%d},\"output_tokens\":%d,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":%d}}}\n\n",
			req.Model, u.in, u.cacheRead, u.out, u.in+u.out)
	case strings.HasSuffix(r.URL.Path, "/v1/responses"):
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"resp_1","object":"response","created_at":1741476777,"status":"completed","error":null,"incomplete_details":null,"model":"%s-2025","output":[{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"hello","annotations":[]}]}],"parallel_tool_calls":true,"tool_choice":"auto","tools":[],"usage":{"input_tokens":%d,"input_tokens_details":{"cached_tokens":%d},"output_tokens":%d,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":%d}}`,
			req.Model, u.in, u.cacheRead, u.out, u.in+u.out)
	case strings.HasSuffix(r.URL.Path, "/v1/messages") && !req.Stream:
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":"%s-2025","content":[{"type":"text","text":"hello"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":%d,"cache_creation_input_tokens":%d,"cache_read_input_tokens":%d,"output_tokens":%d}}`,
			req.Model, u.in, u.cacheWrite, u.cacheRead, u.out)
	case strings.HasSuffix(r.URL.Path, "/v1/messages"):
		w.Header().Set("Content-Type", "text/event-stream")
		event("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_2\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"%s-2025\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":%d,\"cache_creation_input_tokens\":%d,\"cache_read_input_tokens\":%d,\"output_tokens\":1}}}\n\n",
			req.Model, u.in, u.cacheWrite, u.cacheRead)
		event("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n")
		event("event: ping\ndata: {\"type\": \"ping\"}\n\n")
		event("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hel\"}}\n\n")
		event("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"lo\"}}\n\n")
		event("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n")
		event("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":%d}}\n\n", u.out)
		event("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	default:
		http.NotFound(w, r)
	}
}

// llmScript drives the official SDKs as the agent, streaming and not, and prints what they
// got as one JSON object.
const llmScript = `import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { setGlobalDispatcher, EnvHttpProxyAgent } from 'undici';
setGlobalDispatcher(new EnvHttpProxyAgent());
const base = process.env.STANDIN;
const openai = new OpenAI({ apiKey: 'dummy', baseURL: base + '/v1', maxRetries: 0 });
const anthropic = new Anthropic({ apiKey: 'dummy', baseURL: base, maxRetries: 0 });
const messages = [{ role: 'user', content: 'hi' }];
const out = {};
const chat = await openai.chat.completions.create({ model: 'gpt-json', messages });
out.chat = { text: chat.choices[0].message.content, usage: chat.usage };
const nousage = await openai.chat.completions.create({ model: 'gpt-nousage', messages });
out.nousage = { text: nousage.choices[0].message.content };
let text = '', keys = [], empty = 0;
for await (const c of await openai.chat.completions.create({ model: 'gpt-stream', messages, stream: true })) {
  text += c.choices[0]?.delta?.content ?? '';
  if ('usage' in c) keys.push(c.usage);
  if (c.choices.length === 0) empty++;
}
out.stream = { text, usageKeys: keys, emptyChoices: empty };
let usage = null;
text = '';
for await (const c of await openai.chat.completions.create({ model: 'gpt-stream-usage', messages, stream: true, stream_options: { include_usage: true } })) {
  text += c.choices[0]?.delta?.content ?? '';
  if (c.usage) usage = c.usage;
}
out.streamUsage = { text, usage };
const resp = await openai.responses.create({ model: 'gpt-resp', input: 'hi' });
out.responses = { text: resp.output_text, usage: resp.usage };
text = '';
let completed = null;
for await (const ev of await openai.responses.create({ model: 'gpt-resp-stream', input: 'hi', stream: true })) {
  if (ev.type === 'response.output_text.delta') text += ev.delta;
  if (ev.type === 'response.completed') completed = ev.response.usage;
}
out.responsesStream = { text, usage: completed };
const msg = await anthropic.messages.create({ model: 'claude-json', max_tokens: 16, messages });
out.claude = { text: msg.content[0].text, usage: msg.usage };
const stream = anthropic.messages.stream({ model: 'claude-stream', max_tokens: 16, messages });
text = '';
stream.on('text', (t) => { text += t; });
const final = await stream.finalMessage();
out.claudeStream = { text, usage: final.usage };
console.log(JSON.stringify(out));
`

// TestLLMMetering drives the openai and @anthropic-ai/sdk SDKs through the built broker
// against local stand-ins: the audit events' llm objects and the metrics count what the
// stand-ins reported, and the agent that did not ask for usage in its stream sees none.
func TestLLMMetering(t *testing.T) {
	modules := nodeModules(t)
	if _, err := exec.LookPath("node"); err != nil {
		requireTool(t, "node is missing")
	}
	standIn := &llmStandIn{asked: map[string]bool{}}
	e := newEnv(t, envOpts{policy: llmPolicy, handler: standIn, extraConfig: `llm:
  openai_compatible:
    - {name: openai-local, hosts: ["127.0.0.1"], path_prefix: /api/custom/v1}
  anthropic_compatible:
    - {name: anthropic-local, hosts: ["127.0.0.1"], path_prefix: /api/custom/v1}
`})
	printed := e.run("", e.agentEnv("STANDIN="+e.url("/api/custom")), "node", nodeScript(t, modules, llmScript))
	var got struct {
		Chat struct {
			Text  string
			Usage map[string]any
		}
		Nousage struct{ Text string }
		Stream  struct {
			Text         string
			UsageKeys    []any
			EmptyChoices int
		}
		StreamUsage struct {
			Text  string
			Usage map[string]any
		}
		Responses struct {
			Text  string
			Usage map[string]any
		}
		ResponsesStream struct {
			Text  string
			Usage map[string]any
		}
		Claude struct {
			Text  string
			Usage map[string]any
		}
		ClaudeStream struct {
			Text  string
			Usage map[string]any
		}
	}
	if err := json.Unmarshal([]byte(printed), &got); err != nil {
		t.Fatalf("the SDKs printed %q: %v", printed, err)
	}
	// What the agent saw.
	for name, text := range map[string]string{"chat": got.Chat.Text, "nousage": got.Nousage.Text, "stream": got.Stream.Text,
		"streamUsage": got.StreamUsage.Text, "responses": got.Responses.Text, "responsesStream": got.ResponsesStream.Text, "claude": got.Claude.Text, "claudeStream": got.ClaudeStream.Text} {
		if text != "hello" {
			t.Errorf("%s: the agent got text %q", name, text)
		}
	}
	if len(got.Stream.UsageKeys) != 0 || got.Stream.EmptyChoices != 0 {
		t.Errorf("the agent that did not ask for usage saw usage %v, %d chunks without choices", got.Stream.UsageKeys, got.Stream.EmptyChoices)
	}
	if !standIn.asked["gpt-stream"] || !standIn.asked["gpt-stream-usage"] {
		t.Errorf("the upstream was not asked for usage: %v", standIn.asked)
	}
	if n := got.StreamUsage.Usage["prompt_tokens"]; n != float64(17) {
		t.Errorf("the agent that asked for usage got %v", got.StreamUsage.Usage)
	}
	if n := got.ResponsesStream.Usage["output_tokens"]; n != float64(12) {
		t.Errorf("the responses stream's usage: %v", got.ResponsesStream.Usage)
	}
	if n := got.ClaudeStream.Usage["output_tokens"]; n != float64(15) {
		t.Errorf("the Anthropic stream's usage: %v", got.ClaudeStream.Usage)
	}

	// The audit events.
	type llmObj struct {
		provider, model string
		in, out, cached int
		reported        bool
	}
	// gpt-nousage's answer has no usage: it is charged an estimate (the request's and the
	// generated text's bytes / 4), never nothing.
	want := map[string]llmObj{
		"gpt-json":         {"openai-local", "gpt-json", 11, 7, 2, true},
		"gpt-nousage":      {"openai-local", "gpt-nousage", 17, 66, 0, false},
		"gpt-stream":       {"openai-local", "gpt-stream", 13, 5, 0, true},
		"gpt-stream-usage": {"openai-local", "gpt-stream-usage", 17, 9, 4, true},
		"gpt-resp":         {"openai-local", "gpt-resp", 30, 6, 1, true},
		"gpt-resp-stream":  {"openai-local", "gpt-resp-stream", 31, 12, 0, true},
		"claude-json":      {"anthropic-local", "claude-json", 24, 8, 3, true},
		"claude-stream":    {"anthropic-local", "claude-stream", 135, 15, 100, true},
	}
	evs := e.broker.waitAuditWhere(t, len(want), "llm events", func(ev auditEvent) bool { return ev["llm"] != nil })
	for _, ev := range evs {
		l := ev["llm"].(map[string]any)
		model, _ := l["model"].(string)
		w, ok := want[model]
		if !ok {
			t.Errorf("an llm event for model %q: %v", model, l)
			continue
		}
		delete(want, model)
		gotObj := llmObj{l["provider"].(string), model, int(l["tokens_in"].(float64)), int(l["tokens_out"].(float64)), int(l["tokens_cached"].(float64)), l["usage_reported"].(bool)}
		if gotObj != w {
			t.Errorf("audit llm %+v, want %+v", gotObj, w)
		}
		if c, ok := l["cost"].(float64); !ok || c != 0 {
			t.Errorf("cost %v without a recorder", l["cost"])
		}
	}
	if len(want) > 0 {
		t.Errorf("no llm audit event for %v", want)
	}

	// The metrics.
	resp, err := http.Get("http://" + e.broker.adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	metric := func(name string, labels ...string) float64 {
		re := regexp.MustCompile(`(?m)^` + name + `\{([^}]*)\} (\S+)$`)
	next:
		for _, m := range re.FindAllStringSubmatch(string(body), -1) {
			for _, l := range labels {
				if !strings.Contains(m[1], l) {
					continue next
				}
			}
			v, _ := strconv.ParseFloat(m[2], 64)
			return v
		}
		return -1
	}
	for model, u := range map[string][3]float64{"gpt-stream": {13, 5, 0}, "claude-stream": {135, 15, 100}, "gpt-json": {11, 7, 2}} {
		for i, kind := range []string{"in", "out", "cached"} {
			if v := metric("capbroker_llm_tokens_total", `model="`+model+`"`, `kind="`+kind+`"`, `agent="`+agentID+`"`); v != u[i] {
				t.Errorf("capbroker_llm_tokens_total %s %s = %v, want %v", model, kind, v, u[i])
			}
		}
	}
	if v := metric("capbroker_llm_requests_total", `model="gpt-nousage"`, `usage="unreported"`, `provider="openai-local"`); v != 1 {
		t.Errorf("unreported requests of gpt-nousage: %v", v)
	}
	if v := metric("capbroker_llm_requests_total", `model="claude-json"`, `usage="reported"`, `provider="anthropic-local"`); v != 1 {
		t.Errorf("reported requests of claude-json: %v", v)
	}
}

// TestLLMTokenBudget: the tokens a stand-in reports are metered, priced and counted against a
// tokens budget declared in policy data: calls go through while the budget has room (a call
// that starts within it and ends over it included), then the next is refused with 429,
// Retry-After and the OpenAI error shape naming the budget; the audit events carry the cost.
func TestLLMTokenBudget(t *testing.T) {
	e := newEnv(t, envOpts{policy: llmPolicy, handler: &llmStandIn{asked: map[string]bool{}},
		policyFiles: map[string]string{"budgets.json": `{
  "budgets": {"chat-tokens": {"agent": "coder-1", "provider": "openai-local", "tokens": 30, "window": "hour"}},
  "prices": {"gpt-json": {"input": 1000000, "output": 2000000, "cached": 500000}}
}`},
		extraConfig: `llm:
  openai_compatible:
    - {name: openai-local, hosts: ["127.0.0.1"], path_prefix: /api/custom/v1}
`})
	call := func() string {
		out, err := e.curl("-i", "-H", "Content-Type: application/json", "--data", `{"model":"gpt-json","messages":[{"role":"user","content":"hi"}]}`,
			e.url("/api/custom/v1/chat/completions"))
		if err != nil {
			t.Fatalf("curl: %v\n%s", err, out)
		}
		return out
	}
	// gpt-json reports 11 tokens in (2 of them cached) and 7 out: 18 a call. The first call
	// starts at 0, the second at 18 (within 30) and ends at 36; the third is refused.
	for i := 1; i <= 2; i++ {
		if out := call(); !strings.HasPrefix(out, "HTTP/1.1 200") && !strings.HasPrefix(out, "HTTP/2 200") {
			t.Fatalf("call %d: %s", i, out)
		}
		// The call counts when its response has ended, as its audit event is written.
		e.broker.waitAuditWhere(t, i, "metered calls", func(ev auditEvent) bool { return ev["llm"] != nil })
	}
	out := call()
	if !strings.Contains(out, " 429") || !strings.Contains(strings.ToLower(out), "retry-after:") ||
		!strings.Contains(out, `"budget_exceeded"`) || !strings.Contains(out, "chat-tokens") {
		t.Fatalf("the call over the budget: %s", out)
	}
	evs := e.broker.waitAuditWhere(t, 2, "metered calls", func(ev auditEvent) bool { return ev["llm"] != nil })
	for _, ev := range evs {
		l := ev["llm"].(map[string]any)
		// 9 uncached input tokens at 1, 2 cached at 0.5, 7 output at 2 (a unit per token).
		if cost, _ := l["cost"].(float64); cost < 23 || cost > 25 {
			t.Errorf("cost %v for %v", l["cost"], l)
		}
	}
	refused := e.broker.waitAuditWhere(t, 1, "the refusal", func(ev auditEvent) bool { return ev["budget"] != nil })
	if refused[0]["status"] != float64(429) || refused[0]["budget"] != "chat-tokens" {
		t.Errorf("the refusal's audit event: %v", refused[0])
	}
}
