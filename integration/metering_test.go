package integration

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// meterStandIn answers as an OpenAI-compatible server such as vLLM does: it streams when
// "stream" is anything pydantic takes as true (true, 1, "true"), and reports usage in a
// stream only when stream_options.include_usage is exactly true (member names are
// case-sensitive). Every call costs 120 tokens (100 in, 20 out). It records each request body
// it was sent.
type meterStandIn struct {
	mu     sync.Mutex
	bodies []string // "PATH BODY"
}

func (s *meterStandIn) sent() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.bodies...)
}

// truthy is pydantic's lax bool.
func truthy(v any) bool {
	switch v := v.(type) {
	case bool:
		return v
	case float64:
		return v == 1
	case string:
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "true", "1", "yes", "y", "on", "t":
			return true
		}
	}
	return false
}

func (s *meterStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.bodies = append(s.bodies, r.URL.Path+" "+string(body))
	s.mu.Unlock()
	var req map[string]any
	_ = json.Unmarshal(body, &req)
	model, _ := req["model"].(string)
	include := false
	if so, ok := req["stream_options"].(map[string]any); ok {
		include = so["include_usage"] == true
	}
	flusher := w.(http.Flusher)
	const usage = `"usage":{"prompt_tokens":100,"completion_tokens":20,"total_tokens":120}`
	switch {
	case strings.HasSuffix(r.URL.Path, "/v1/embeddings"):
		w.Header().Set("Content-Type", "application/json")
		vec := strings.TrimSuffix(strings.Repeat("-0.0123456789,", 1536), ",")
		fmt.Fprintf(w, `{"object":"list","data":[`)
		for i := range 80 { // 1.7 MB of vectors, then the usage
			if i > 0 {
				io.WriteString(w, ",")
			}
			fmt.Fprintf(w, `{"object":"embedding","index":%d,"embedding":[%s]}`, i, vec)
		}
		fmt.Fprintf(w, `],"model":%q,"usage":{"prompt_tokens":120,"total_tokens":120}}`, model)
	case strings.HasSuffix(r.URL.Path, "/completions") && truthy(req["stream"]):
		w.Header().Set("Content-Type", "text/event-stream")
		null := ""
		if include {
			null = `,"usage":null`
		}
		for range 5 {
			fmt.Fprintf(w, "data: {\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"four\"}}]%s}\n\n", model, null)
			flusher.Flush()
		}
		if include {
			fmt.Fprintf(w, "data: {\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[],%s}\n\n", model, usage)
		}
		io.WriteString(w, "data: [DONE]\n\n")
	case strings.HasSuffix(r.URL.Path, "/completions"):
		w.Header().Set("Content-Type", "application/json")
		logprobs := "null"
		if truthy(req["logprobs"]) { // top_logprobs 20 for each of 1000 tokens: over 1 MiB
			var b strings.Builder
			b.WriteString(`{"content":[`)
			for i := range 1000 {
				if i > 0 {
					b.WriteString(",")
				}
				b.WriteString(`{"token":"tok","logprob":-0.01,"bytes":[116,111,107],"top_logprobs":[`)
				for j := range 20 {
					if j > 0 {
						b.WriteString(",")
					}
					fmt.Fprintf(&b, `{"token":"alt%02d","logprob":-%d.5,"bytes":[97,108,116]}`, j, j)
				}
				b.WriteString("]}")
			}
			b.WriteString("]}")
			logprobs = b.String()
		}
		u := "," + usage
		switch model {
		case "nousage":
			u = ""
		case "twice": // a hostile upstream: usage in two spellings
			u = `,"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2},"Usage":{"prompt_tokens":100,"completion_tokens":20}`
		}
		fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"%s"},"logprobs":%s,"finish_reason":"stop"}]%s}`,
			model, strings.Repeat("word ", 80), logprobs, u)
	default:
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true}`)
	}
}

// meterEnv is a broker with a 200-token budget on the OpenAI-compatible stand-in.
func meterEnv(t *testing.T) (*env, *meterStandIn) {
	h := &meterStandIn{}
	e := newEnv(t, envOpts{policy: llmPolicy, handler: h,
		policyFiles: map[string]string{"budgets.json": `{"budgets": {"local-tokens": {"agent": "coder-1", "provider": "local", "tokens": 200, "window": "hour"}}}`},
		extraConfig: `llm:
  openai_compatible:
    - {name: local, hosts: ["127.0.0.1"], path_prefix: /api/custom/v1}
`})
	return e, h
}

// post sends body to path as the agent and returns the status and the response's body.
func (e *env) post(t *testing.T, path, body string) (int, string) {
	t.Helper()
	out, err := e.curl("-o", "-", "-w", "\n%{http_code}", "-H", "Content-Type: application/json", "--data-binary", body, e.url(path))
	if err != nil {
		t.Fatalf("curl: %v\n%.300s", err, out)
	}
	i := strings.LastIndexByte(out, '\n')
	var code int
	fmt.Sscan(out[i+1:], &code)
	return code, out[:i]
}

// TestMeteringEvasions: a 200-token budget against calls of 120 tokens. Whatever the agent
// does to make a call's usage unreadable, the budget trips on the third call at the latest
// (429 budget_exceeded, nothing sent), or the call is refused before it is sent; the upstream
// receives the stream decision the broker took, written canonically; each call's audit event
// carries what it was charged.
func TestMeteringEvasions(t *testing.T) {
	chat := "/api/custom/v1/chat/completions"
	cases := map[string]struct {
		path, body string
		// sent checks the body the upstream received (nil: not checked).
		sent func(string) bool
	}{
		"answer over 1 MiB": {chat, `{"model":"m","messages":[],"logprobs":true,"top_logprobs":20}`, nil},
		"stream 1": {chat, `{"model":"m","messages":[],"stream":1}`, func(b string) bool {
			return strings.HasPrefix(b, `{"stream":true,"stream_options":{"include_usage":true},`) && !strings.Contains(b, `"stream":1`)
		}},
		"stream string": {chat, `{"model":"m","messages":[],"stream":"true"}`, func(b string) bool {
			return strings.HasPrefix(b, `{"stream":true,"stream_options":{"include_usage":true},`) && !strings.Contains(b, `"stream":"true"`)
		}},
		"stream options kept": {chat, `{"model":"m","messages":[],"stream":"yes","stream_options":{"include_usage":false,"x":1}}`, func(b string) bool {
			return strings.HasPrefix(b, `{"stream":true,"stream_options":{"include_usage":true,"x":1},`)
		}},
		"embeddings":      {"/api/custom/v1/embeddings", `{"model":"m","input":["a","b"]}`, nil},
		"no usage":        {chat, `{"model":"nousage","messages":[{"role":"user","content":"` + strings.Repeat("long prompt ", 60) + `"}]}`, nil},
		"usage twice":     {chat, `{"model":"twice","messages":[{"role":"user","content":"` + strings.Repeat("long prompt ", 60) + `"}]}`, nil},
		"legacy complete": {"/api/custom/v1/completions", `{"model":"m","prompt":"` + strings.Repeat("long prompt ", 60) + `"}`, nil},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			e, h := meterEnv(t)
			tripped := 0
			for i := 1; i <= 3; i++ {
				code, body := e.post(t, c.path, c.body)
				if code == http.StatusTooManyRequests {
					if !strings.Contains(body, "budget_exceeded") || !strings.Contains(body, "local-tokens") {
						t.Fatalf("call %d: 429 %.300s", i, body)
					}
					tripped = i
					break
				}
				if code != http.StatusOK {
					t.Fatalf("call %d: %d %.300s", i, code, body)
				}
				e.broker.waitAuditWhere(t, i, "metered calls", func(ev auditEvent) bool { return ev["llm"] != nil })
			}
			if tripped == 0 {
				t.Fatal("three calls of about 120 tokens went through a 200-token budget")
			}
			sent := h.sent()
			if len(sent) != tripped-1 {
				t.Errorf("the upstream was sent %d calls, want %d", len(sent), tripped-1)
			}
			for _, s := range sent {
				if _, b, _ := strings.Cut(s, " "); c.sent != nil && !c.sent(b) {
					t.Errorf("the upstream was sent %.200s", b)
				}
			}
			for _, ev := range e.broker.waitAuditWhere(t, tripped-1, "metered calls", func(ev auditEvent) bool { return ev["llm"] != nil }) {
				l := ev["llm"].(map[string]any)
				in, _ := l["tokens_in"].(float64)
				out, _ := l["tokens_out"].(float64)
				if in+out < 100 || l["provider"] != "local" {
					t.Errorf("a call charged %v tokens: %v", in+out, l)
				}
			}
			refused := e.broker.waitAuditWhere(t, 1, "the refusal", func(ev auditEvent) bool { return ev["status"] == float64(429) })
			if refused[0]["budget"] != "local-tokens" || refused[0]["decision"] != "deny" {
				t.Errorf("the refusal's audit event: %v", refused[0])
			}
			e.assertNoCanaryLeaked()
		})
	}
}

// TestMeteringRefusals: a request the broker cannot meter one way is refused before anything
// is sent: ambiguous members (400 ambiguous_request, in OpenAI's error shape), a stream value
// of no clear meaning (400 bad_request), an endpoint of the LLM host the broker does not meter
// under a tokens budget (403), a background response.
func TestMeteringRefusals(t *testing.T) {
	e, h := meterEnv(t)
	chat := "/api/custom/v1/chat/completions"
	cases := []struct {
		name, path, body string
		status           int
		code             string
	}{
		{"Include_Usage", chat, `{"model":"m","stream":true,"stream_options":{"Include_Usage":true}}`, 400, "ambiguous_request"},
		{"include-usage", chat, `{"model":"m","stream":true,"stream_options":{"include-usage":true}}`, 400, "ambiguous_request"},
		{"includeUsage", chat, `{"model":"m","stream":true,"stream_options":{"includeUsage":true}}`, 400, "ambiguous_request"},
		{"both spellings", chat, `{"model":"m","stream":true,"stream_options":{"include_usage":true,"INCLUDE_USAGE":false}}`, 400, "ambiguous_request"},
		{"Stream", chat, `{"model":"m","Stream":true}`, 400, "ambiguous_request"},
		{"long s", chat, `{"model":"m","\u017ftream":true}`, 400, "ambiguous_request"},
		{"stream twice", chat, `{"model":"m","stream":false,"stream":true}`, 400, "ambiguous_request"},
		{"stream_Options", chat, `{"model":"m","stream":true,"stream_Options":{}}`, 400, "ambiguous_request"},
		{"stream 2", chat, `{"model":"m","stream":2}`, 400, "bad_request"},
		{"stream object", chat, `{"model":"m","stream":{"on":true}}`, 400, "bad_request"},
		{"stream_options string", chat, `{"model":"m","stream":true,"stream_options":"include_usage"}`, 400, "bad_request"},
		{"not json", chat, `model=m&stream=true`, 400, "bad_request"},
		{"background", "/api/custom/v1/responses", `{"model":"m","input":"hi","background":true}`, 400, "bad_request"},
		{"unknown endpoint", "/api/custom/v1/audio/speech", `{"model":"m","input":"hi"}`, 403, "denied"},
		{"batches", "/api/custom/v1/batches", `{"input_file_id":"f"}`, 403, "denied"},
	}
	for _, c := range cases {
		code, body := e.post(t, c.path, c.body)
		var got struct {
			Error struct{ Code, Message string }
		}
		_ = json.Unmarshal([]byte(body), &got)
		if code != c.status || got.Error.Code != c.code || got.Error.Message == "" {
			t.Errorf("%s: %d %.300s; want %d %s", c.name, code, body, c.status, c.code)
		}
	}
	if sent := h.sent(); len(sent) != 0 {
		t.Errorf("the upstream was sent %d refused calls: %.300q", len(sent), sent)
	}
	// Each refusal is audited with its reason; a 403 for the budget names it.
	evs := e.broker.waitAuditWhere(t, len(cases), "refusals", func(ev auditEvent) bool {
		s, _ := ev["status"].(float64)
		return ev["phase"] == "request" && (s == 400 || s == 403)
	})
	for _, ev := range evs {
		if r, _ := ev["reason"].(string); r == "" ||
			(ev["status"] == float64(403) && (ev["budget"] != "local-tokens" || ev["decision"] != "deny")) {
			t.Errorf("a refusal audited as %v", ev)
		}
	}
	// Free calls on the LLM host still pass under the budget: reads, counting tokens.
	if out, err := e.curl("-s", "-o", "/dev/null", "-w", "%{http_code}", e.url("/api/custom/v1/models")); err != nil || out != "200" {
		t.Errorf("GET models: %s %v", out, err)
	}
}

// TestPromptSecretNeverStreamedBack (item 12: a placeholder substituted into a prompt reaches
// the model, which streams it back a few characters per event). The broker refuses body
// substitution on an LLM API's host: a config binding such a credential to one does not load,
// naming the key; with the credential in a header, a placeholder in the prompt reaches the
// model as the placeholder, and a streamed echo of the prompt a few characters per event never
// carries the secret, in clear or encoded.
func TestPromptSecretNeverStreamedBack(t *testing.T) {
	const placeholder = "sk-BROKER_PLACEHOLDER_llm_0123"
	dir := t.TempDir()
	if out, code := run(t, dir, "ca", "init", "--out", "ca"); code != 0 {
		t.Fatal(out)
	}
	os.MkdirAll(filepath.Join(dir, "policies"), 0o755)
	os.WriteFile(filepath.Join(dir, "policies", "broker.rego"), []byte(llmPolicy), 0o644)
	cfg := filepath.Join(dir, "broker.yaml")
	os.WriteFile(cfg, []byte(`ca: {cert_file: ca/ca.crt, key_file: ca/ca.key}
policy: {dir: policies}
llm:
  openai_compatible: [{name: local, hosts: ["llm.internal"]}]
credentials:
  - name: key
    hosts: ["api.openai.com"]
    source: {env: KEY}
    inject: {placeholder: "`+placeholder+`", body: true}
  - name: gw
    hosts: ["*.internal"]
    source: {env: KEY}
    inject: {placeholder: "`+placeholder+`_2", body: true}
`), 0o600)
	out, code := run(t, dir, "check-config", "--config", cfg)
	if code != 1 || !strings.Contains(out, "credentials[0].inject.body") || !strings.Contains(out, "credentials[1].inject.body") {
		t.Fatalf("check-config exit %d:\n%s", code, out)
	}

	// The echo streams back the prompt it was sent, three characters per event.
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		body, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(body, &req)
		w.Header().Set("Content-Type", "text/event-stream")
		text := ""
		for _, m := range req.Messages {
			text += m.Content
		}
		for i := 0; i < len(text); i += 3 {
			chunk, _ := json.Marshal(text[i:min(i+3, len(text))])
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%s}}]}\n\n", chunk)
			w.(http.Flusher).Flush()
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
	policy := strings.Replace(llmPolicy, `"credentials": ["canary"]`, `"credentials": ["canary", "ph"]`, 1)
	e := newEnv(t, envOpts{policy: policy, handler: echo, extraCredentials: `  - name: ph
    hosts: ["127.0.0.1"]
    source: {env: CANARY_SECRET}
    inject: {placeholder: "` + placeholder + `"}
`, extraConfig: `llm:
  openai_compatible:
    - {name: local, hosts: ["127.0.0.1"], path_prefix: /api/custom/v1}
`})
	code, body := e.post(t, "/api/custom/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"repeat after me: `+placeholder+` and again `+placeholder+`"}]}`)
	if code != 200 {
		t.Fatalf("%d %.300s", code, body)
	}
	var text strings.Builder
	for _, line := range strings.Split(body, "\n") {
		var ev struct {
			Choices []struct{ Delta struct{ Content string } }
		}
		if json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev) == nil && len(ev.Choices) > 0 {
			text.WriteString(ev.Choices[0].Delta.Content)
		}
	}
	if !strings.Contains(text.String(), placeholder) {
		t.Fatalf("the echo did not come back: %q", text.String())
	}
	for _, s := range []string{body, text.String()} {
		for form, v := range map[string]string{
			"clear": e.canary, "base64": base64.StdEncoding.EncodeToString([]byte(e.canary)),
			"base64url": base64.RawURLEncoding.EncodeToString([]byte(e.canary)), "hex": hex.EncodeToString([]byte(e.canary)),
			"url": url.QueryEscape(e.canary), "half": e.canary[len(e.canary)/2:],
		} {
			if strings.Contains(s, v) {
				t.Errorf("the agent got the secret (%s)", form)
			}
		}
	}
	e.assertNoCanaryLeaked()
}
