package integration

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/capbroker/capbroker/internal/harness"
)

// auditLevel is the audit.include_input value of an env: inputLevel, or includeInput.
func (o envOpts) auditLevel() string {
	if o.inputLevel != "" {
		return o.inputLevel
	}
	return fmt.Sprint(o.includeInput)
}

// llmBroker is the shipped llm.rego (with paths.rego) in front of a loopback "LLM API" at
// 127.0.0.1 that allows the models gpt-4.1*, with the canary credential. The upstream records
// each body it receives.
type llmBroker struct {
	broker *brokerProc
	up     string // the upstream's base URL
	token  string
	canary string
	mu     sync.Mutex
	bodies [][]byte
}

const bodiesLLMRouter = `package broker

import data.llm

decision := {"allow": true, "intercept": true} if {
	input.phase == "connect"
	input.request.host == "127.0.0.1"
}

decision := llm.decision if input.phase == "request"
`

const bodiesLLMSettings = `settings:
  llm:
    "127.0.0.1":
      credential: canary
      endpoints: ["/v1/chat/completions"]
      models: ["gpt-4.1*"]
      read_paths: []
`

// newLLMBroker starts it; policyKeys are more keys of the config's policy section, extra is
// appended to the config.
func newLLMBroker(t *testing.T, policyKeys, extra string) *llmBroker {
	t.Helper()
	files := map[string]string{"data.yaml": bodiesLLMSettings}
	for _, name := range []string{"llm.rego", "paths.rego"} {
		b, err := os.ReadFile(filepath.Join("..", "policies", name))
		if err != nil {
			t.Fatal(err)
		}
		files[name] = string(b)
	}
	l := &llmBroker{token: randHex(16), canary: "sk-canary-" + randHex(12)}
	pki := newUpstreamPKI(t)
	up := pki.serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		l.mu.Lock()
		l.bodies = append(l.bodies, body)
		l.mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer "+l.canary {
			http.Error(w, "no credential", http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"received":%d}`, len(body))
	}), false, nil)
	l.up = up.URL
	l.broker = startBroker(t, brokerOpts{
		// startBroker writes "policy: {dir: D, mode: M}": more keys follow the mode.
		policy: bodiesLLMRouter, files: files, mode: "enforce" + policyKeys,
		config: canaryConfig(pki.File, []string{agentID}, extra),
		env:    []string{tokenEnv(agentID) + "=" + l.token, "CANARY_SECRET=" + l.canary},
	})
	return l
}

// post sends body from a file with curl through the broker and returns curl's output: the
// response with its headers. chunked sends it without a Content-Length.
func (l *llmBroker) post(t *testing.T, path string, body []byte, contentType string, chunked bool, headers ...string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "body.json")
	if err := os.WriteFile(file, body, 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"-sS", "--max-time", "60", "--suppress-connect-headers", "-i", "-H", "Content-Type: " + contentType, "-H", "Expect:"}
	if chunked {
		args = append(args, "-H", "Transfer-Encoding: chunked")
	}
	for _, h := range headers {
		args = append(args, "-H", h)
	}
	args = append(args, "--data-binary", "@"+file, l.up+path)
	cmd := exec.Command("curl", args...)
	proxy := l.broker.proxyURL(agentID, l.token)
	cmd.Env = append(harness.Env(), "HTTPS_PROXY="+proxy, "CURL_CA_BUNDLE="+l.broker.caFile, "NO_PROXY=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("curl: %v\n%.2000s", err, out)
	}
	return string(out)
}

func (l *llmBroker) received() [][]byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([][]byte(nil), l.bodies...)
}

// chatBody is an OpenAI-style chat request of exactly size bytes for model.
func chatBody(t *testing.T, model string, size int) []byte {
	t.Helper()
	head := fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"`, model)
	tail := `"}],"max_tokens":64}`
	n := size - len(head) - len(tail)
	if n < 0 {
		t.Fatalf("size %d too small", size)
	}
	line := "lorem ipsum \\\"dolor\\\" sit amet, \\u00e9t\\n" // escapes, as a real conversation has
	var b bytes.Buffer
	b.WriteString(head)
	for b.Len()+len(line) <= len(head)+n {
		b.WriteString(line)
	}
	b.WriteString(strings.Repeat("x", len(head)+n-b.Len()))
	b.WriteString(tail)
	if !json.Valid(b.Bytes()) || b.Len() != size {
		t.Fatalf("chat body: valid %v, %d bytes, want %d", json.Valid(b.Bytes()), b.Len(), size)
	}
	return b.Bytes()
}

// TestLongConversationAllowed: the shipped llm.rego sees the model of a 4 MiB conversation
// (and of one at the 8 MiB default limit), with and without a Content-Length, and the
// upstream receives the body unchanged; an unlisted model in a body as long is refused, so
// the policy did read it; a JSON body over the limit is refused with 413 and never sent.
func TestLongConversationAllowed(t *testing.T) {
	l := newLLMBroker(t, "", "")
	sent := 0
	for _, c := range []struct {
		name    string
		size    int
		chunked bool
	}{{"4 MiB", 4 << 20, false}, {"4 MiB chunked", 4 << 20, true}, {"8 MiB, the limit", 8 << 20, false}} {
		body := chatBody(t, "gpt-4.1-mini", c.size)
		out := l.post(t, "/v1/chat/completions", body, "application/json", c.chunked)
		if !hasStatus(out, 200) || !strings.Contains(out, fmt.Sprintf(`{"received":%d}`, c.size)) {
			t.Fatalf("%s: want 200 with the whole body received:\n%.2000s", c.name, out)
		}
		sent++
		got := l.received()
		if len(got) != sent || sha256.Sum256(got[sent-1]) != sha256.Sum256(body) {
			t.Fatalf("%s: the upstream did not get the body unchanged", c.name)
		}
	}

	out := l.post(t, "/v1/chat/completions", chatBody(t, "gpt-3.5-turbo", 4<<20), "application/json", false)
	if !hasStatus(out, 403) || !strings.Contains(out, "model gpt-3.5-turbo is not allowed") {
		t.Fatalf("unlisted model: want 403 naming the model:\n%.2000s", out)
	}
	for _, chunked := range []bool{false, true} {
		out = l.post(t, "/v1/chat/completions", chatBody(t, "gpt-4.1-mini", 8<<20+1), "application/json", chunked)
		if !hasStatus(out, 413) || !strings.Contains(out, "body_too_large") || !strings.Contains(out, "policy.max_body_bytes") {
			t.Fatalf("over the limit (chunked %v): want 413 body_too_large:\n%.2000s", chunked, out)
		}
	}
	if n := len(l.received()); n != sent {
		t.Fatalf("the upstream received %d requests, want %d: a refused body was sent", n, sent)
	}
}

// TestBodyLimitConfigured: policy.max_body_bytes sets the limit; a body over it that is not
// JSON, which the policy does not read, still streams to the upstream whatever its size.
func TestBodyLimitConfigured(t *testing.T) {
	l := newLLMBroker(t, ", max_body_bytes: 1048576", "")
	body := chatBody(t, "gpt-4.1-mini", 1<<20)
	if out := l.post(t, "/v1/chat/completions", body, "application/json", false); !hasStatus(out, 200) {
		t.Fatalf("at the limit: want 200:\n%.2000s", out)
	}
	body = chatBody(t, "gpt-4.1-mini", 1<<20+1)
	if out := l.post(t, "/v1/chat/completions", body, "application/json", true); !hasStatus(out, 413) || !strings.Contains(out, "(1048576 bytes)") {
		t.Fatalf("over the limit: want 413:\n%.2000s", out)
	}
	// Not JSON: null for the policy, which refuses it for want of a model, not for its size.
	if out := l.post(t, "/v1/chat/completions", body, "text/plain", false); !hasStatus(out, 403) || !strings.Contains(out, `needs a JSON body`) {
		t.Fatalf("not JSON: want the policy's 403:\n%.2000s", out)
	}
	if n := len(l.received()); n != 1 {
		t.Fatalf("the upstream received %d requests, want 1", n)
	}
}

// TestAuditInputLevels: each audit.include_input level writes exactly its part of the input,
// with canaries in the body, a query value and headers; credential-bearing headers and the
// injected credential appear at no level.
func TestAuditInputLevels(t *testing.T) {
	const (
		bodyCanary   = "BODY-CANARY-4d1e"
		queryCanary  = "QUERY-CANARY-77aa"
		headerCanary = "HEADER-CANARY-90b2"
		authCanary   = "AUTH-CANARY-1f3c" // Authorization: kept from the policy, overwritten upstream
		keyCanary    = "KEY-CANARY-c0de"  // X-Goog-Api-Key: seen by the policy, never logged
	)
	for _, c := range []struct{ setting, level string }{
		{"metadata", "metadata"}, {"headers", "headers"}, {"full", "full"}, {"true", "headers"},
	} {
		t.Run(c.setting, func(t *testing.T) {
			l := newLLMBroker(t, "", "audit: {include_input: "+c.setting+"}\n")
			body := []byte(`{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"` + bodyCanary + `"}]}`)
			out := l.post(t, "/v1/chat/completions?trace="+queryCanary, body, "application/json", false,
				"X-Trace: "+headerCanary, "Authorization: Bearer "+authCanary, "X-Goog-Api-Key: "+keyCanary)
			if !hasStatus(out, 200) {
				t.Fatalf("want 200:\n%s", out)
			}
			id := headerValue(out, "X-Broker-Request-Id")
			line := l.broker.auditLog.wait(t, `"request_id":"`+id+`"`)
			for _, secret := range []string{authCanary, keyCanary, l.canary} {
				if strings.Contains(line, secret) {
					t.Fatalf("a credential reached the audit event: %s", line)
				}
			}
			ev := decodeAudit(t, []string{line})[0]
			in, _ := ev["input"].(map[string]any)
			req, _ := in["request"].(map[string]any)
			if ev["input_level"] != c.level || req["path"] != "/v1/chat/completions" || req["body_size"] != float64(len(body)) || in["agent"] == nil {
				t.Fatalf("input_level %v, input %v", ev["input_level"], in)
			}
			headers, hasHeaders := req["headers"].(map[string]any)
			if hasHeaders != (c.level != "metadata") {
				t.Fatalf("headers present %v at %s: %v", hasHeaders, c.level, req)
			}
			if hasHeaders && (headers["x-trace"] != headerCanary || headers["content-type"] != "application/json" ||
				headers["authorization"] != nil || headers["x-goog-api-key"] != nil) {
				t.Fatalf("headers: %v", headers)
			}
			query, _ := req["query"].(map[string]any)
			values, _ := query["trace"].([]any)
			_, hasBody := req["body"]
			if c.level == "full" {
				if len(values) != 1 || values[0] != queryCanary || !strings.Contains(line, bodyCanary) {
					t.Fatalf("full: want the query value and body: %s", line)
				}
				return
			}
			if query == nil || len(values) != 0 || hasBody || strings.Contains(line, bodyCanary) || strings.Contains(line, queryCanary) {
				t.Fatalf("%s: want query names only and no body: %s", c.level, line)
			}
		})
	}
}
