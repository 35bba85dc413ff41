package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/identity"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/broker/upstream"
	"github.com/capbroker/capbroker/broker/usage"
)

// fakeRecorder prices every call at 0.25 and keeps them.
type fakeRecorder struct {
	mu    sync.Mutex
	calls []usage.Call
}

func (f *fakeRecorder) Record(c usage.Call) float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
	return 0.25
}

// streamUpstream answers chat completions as OpenAI does: streamed, with the usage chunk only
// when asked. It keeps the request body it was sent.
type streamUpstream struct{ sent chan []byte }

func (s streamUpstream) RoundTrip(r *http.Request, _ upstream.Pool) (*http.Response, error) {
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	s.sent <- body
	ev := "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"}}]%s}\n\n"
	var out bytes.Buffer
	if bytes.Contains(body, []byte(`"include_usage":true`)) {
		fmtEv := strings.Replace(ev, "%s", `,"usage":null`, 1)
		out.WriteString(fmtEv)
		out.WriteString("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-4o-mini\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,\"total_tokens\":10}}\n\n")
	} else {
		out.WriteString(strings.Replace(ev, "%s", "", 1))
	}
	out.WriteString("data: [DONE]\n\n")
	h := http.Header{"Content-Type": {"text/event-stream"}}
	return &http.Response{StatusCode: 200, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: h,
		Body: io.NopCloser(&out), ContentLength: -1, Request: r}, nil
}

func (streamUpstream) Prepare(string, bool)  {}
func (streamUpstream) CloseIdleConnections() {}

// A metered stream through the pipeline: the upstream is asked for usage, the agent gets the
// stream it asked for, the recorder the call with the agent's identity, and the audit event
// the call with the recorder's cost.
func TestMeteredStream(t *testing.T) {
	for name, messages := range map[string]string{
		"small body": `[]`,
		// Over maxSmallBody, and not read by the (allow-all) policy: read here for the model.
		"large body": `[{"role":"user","content":"` + strings.Repeat("x", maxSmallBody+1) + `"}]`,
	} {
		t.Run(name, func(t *testing.T) { testMeteredStream(t, messages) })
	}
}

func testMeteredStream(t *testing.T, messages string) {
	br, tun := benchBroker(t, false)
	var auditLog bytes.Buffer
	lg := audit.New(&auditLog)
	rec := &fakeRecorder{}
	br.audit, br.recorder = lg, rec
	up := streamUpstream{sent: make(chan []byte, 1)}
	br.setTransport(up)

	reqBody := `{"model":"gpt-4o-mini","stream":true,"messages":` + messages + `}`
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(reqBody))
	r.Host = "api.openai.com"
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Accept-Encoding", "gzip, br")
	w := httptest.NewRecorder()
	br.serveTunnel(w, r, tun)
	lg.Close()

	sentWant := `{"stream":true,"stream_options":{"include_usage":true},"model":"gpt-4o-mini","messages":` + messages + `}`
	if sent := <-up.sent; string(sent) != sentWant {
		t.Errorf("the upstream was sent %.200s", sent)
	}
	if got := w.Body.String(); strings.Contains(got, "usage") || !strings.Contains(got, `"content":"ok"`) || !strings.HasSuffix(got, "data: [DONE]\n\n") {
		t.Errorf("the agent got %q", got)
	}
	if len(rec.calls) != 1 {
		t.Fatalf("recorded %d calls", len(rec.calls))
	}
	c := rec.calls[0]
	if c.Agent != "dev-agent" || c.Labels["env"] != "dev" || c.RequestID == "" || c.Provider != "openai" || c.Model != "gpt-4o-mini" || c.In != 7 || c.Out != 3 || !c.Reported {
		t.Errorf("recorded %+v", c)
	}
	var ev struct {
		RequestID string         `json:"request_id"`
		LLM       map[string]any `json:"llm"`
	}
	if err := json.Unmarshal(auditLog.Bytes(), &ev); err != nil {
		t.Fatalf("audit %q: %v", auditLog.String(), err)
	}
	want := map[string]any{"provider": "openai", "model": "gpt-4o-mini", "tokens_in": 7.0, "tokens_out": 3.0, "tokens_cached": 0.0, "cost": 0.25, "usage_reported": true}
	for k, v := range want {
		if ev.LLM[k] != v {
			t.Errorf("audit llm.%s = %v, want %v (%v)", k, ev.LLM[k], v, ev.LLM)
		}
	}
	if ev.RequestID != c.RequestID {
		t.Errorf("audit request_id %s, recorded %s", ev.RequestID, c.RequestID)
	}
}

// pipeUpstream streams what the benchmark writes into its pipe.
type pipeUpstream struct{ body io.ReadCloser }

func (p pipeUpstream) RoundTrip(r *http.Request, _ upstream.Pool) (*http.Response, error) {
	_, _ = io.Copy(io.Discard, r.Body)
	r.Body.Close()
	return &http.Response{StatusCode: 200, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{"Content-Type": {"text/event-stream"}},
		Body: p.body, ContentLength: -1, Request: r}, nil
}

func (pipeUpstream) Prepare(string, bool)  {}
func (pipeUpstream) CloseIdleConnections() {}

// signalWriter tells when the agent has been sent (written and flushed) what it was.
type signalWriter struct {
	h       http.Header
	flushed chan struct{}
}

func (s *signalWriter) Header() http.Header         { return s.h }
func (s *signalWriter) WriteHeader(int)             {}
func (s *signalWriter) Write(p []byte) (int, error) { return len(p), nil }
func (s *signalWriter) Flush()                      { s.flushed <- struct{}{} }

// BenchmarkStreamEvent is the delay of one streamed event through the pipeline: from the
// upstream's write to the agent's flush, for an LLM stream (metered) beside the same stream
// from a host that is not metered. The streams asked for usage themselves: events pass through.
func BenchmarkStreamEvent(b *testing.B) {
	event := []byte(`data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n")
	for _, host := range []string{"example.com", "api.openai.com"} {
		name := map[string]string{"example.com": "unmetered", "api.openai.com": "metered"}[host]
		b.Run(name, func(b *testing.B) {
			br, tun := benchBroker(b, false)
			tun.target = newTarget("https", host, 443)
			pr, pw := io.Pipe()
			br.setTransport(pipeUpstream{body: pr})
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true}}`))
			r.Host = host
			r.Header.Set("Content-Type", "application/json")
			w := &signalWriter{h: http.Header{}, flushed: make(chan struct{})}
			done := make(chan struct{})
			go func() {
				br.serveTunnel(w, r, tun)
				close(done)
			}()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := pw.Write(event); err != nil {
					b.Fatal(err)
				}
				<-w.flushed
			}
			pw.Close()
			<-done
		})
	}
}

type grantAll struct{ creds []string }

func (g grantAll) Decide(context.Context, *policy.Input) (policy.Decision, error) {
	return policy.Decision{Allow: true, Credentials: g.creds, Revision: "test"}, nil
}

// A credential substituted into bodies never reaches an LLM API's host, whatever the config:
// config validation refuses it, and so does the pipeline when a config gets past it.
func TestBodySubstitutionRefusedOnLLMHost(t *testing.T) {
	cfg := testConfig(t)
	cfg.Credentials = append(cfg.Credentials, config.Credential{Name: "ph", Hosts: []string{"api.openai.com"},
		Source: config.Source{Env: "PH"}, Inject: config.Inject{Placeholder: "PH_PLACEHOLDER_0123", Body: true}})
	cfg.SetDefaults()
	if errs := cfg.Validate(); len(errs) == 0 {
		t.Fatal("the config validated")
	}
	deps := Deps{Policy: grantAll{[]string{"ph"}}, Secrets: benchSecrets{}, Audit: audit.New(io.Discard)}
	deps.CA, _ = testCA(t)
	br, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	up := streamUpstream{sent: make(chan []byte, 1)}
	br.setTransport(up)
	tun := &tunnel{agent: identity.Agent{ID: "dev-agent"}, target: newTarget("https", "api.openai.com", 443), gen: br.gen.Load()}
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"PH_PLACEHOLDER_0123"}]}`))
	r.Host = "api.openai.com"
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	br.serveTunnel(w, r, tun)
	if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "substituted into request bodies") {
		t.Errorf("%d %s", w.Code, w.Body)
	}
	select {
	case b := <-up.sent:
		t.Errorf("the upstream was sent %s", b)
	default:
	}
}
