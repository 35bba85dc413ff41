package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/capbroker/capbroker/broker/approvals"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/identity"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/broker/upstream"
)

// askAll asks about every request, granting the openai credential once approved.
type askAll struct{}

func (askAll) Decide(context.Context, *policy.Input) (policy.Decision, error) {
	return policy.Decision{Ask: &policy.Ask{Scopes: []string{"once", "agent"}}, Reason: "a person decides", Credentials: []string{"openai"}, Revision: "t"}, nil
}

// heldUpstream is memoryUpstream that keeps what it was sent.
type heldUpstream struct {
	memoryUpstream
	mu   sync.Mutex
	sent []string // "auth body" of each request
}

func (u *heldUpstream) RoundTrip(r *http.Request, p upstream.Pool) (*http.Response, error) {
	b, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.sent = append(u.sent, r.Header.Get("Authorization")+" "+string(b))
	u.mu.Unlock()
	r.Body = io.NopCloser(bytes.NewReader(nil))
	return u.memoryUpstream.RoundTrip(r, p)
}

func (u *heldUpstream) requests() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.sent...)
}

func askBroker(t *testing.T, q *approvals.Queue, mode string, maxBody int64) (*Broker, *tunnel, *heldUpstream) {
	t.Helper()
	cfg := testConfig(t)
	cfg.Policy.Mode = mode
	if maxBody > 0 {
		cfg.Policy.MaxBodyBytes = maxBody
	}
	up := &heldUpstream{}
	br, tun := testBroker(t, cfg, Deps{Policy: askAll{}, Secrets: benchSecrets{}, Approvals: q}, up, "api.openai.com")
	tun.agent = identity.Agent{ID: "dev-agent"}
	return br, tun, up
}

func askRequest(body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/things", strings.NewReader(body))
	r.Host = "api.openai.com"
	r.Header.Set("Content-Type", "text/plain")
	r.Header.Set("Cookie", "session=abc")
	return r
}

func TestAskHoldsUntilApproved(t *testing.T) {
	q, err := approvals.New(approvals.Options{MaxPending: 4, MaxPendingPerAgent: 4})
	if err != nil {
		t.Fatal(err)
	}
	br, tun, up := askBroker(t, q, config.ModeEnforce, 0)
	sub := q.Events.Subscribe(8)
	body := "deploy with " + benchSecret + " please"
	w := httptest.NewRecorder()
	done := make(chan struct{})
	go func() { br.serveTunnel(w, askRequest(body), tun); close(done) }()
	ev := <-sub.C
	var e map[string]string
	_ = json.Unmarshal(ev.Data, &e)
	p := q.Pending()
	if len(p) != 1 || p[0].ID != e["id"] {
		t.Fatalf("pending %+v, event %s", p, ev.Data)
	}
	if strings.Contains(p[0].BodyPreview, benchSecret) || p[0].BodyPreview != "deploy with [REDACTED] please" || p[0].Headers["cookie"] != "" || p[0].Headers["content-type"] != "text/plain" {
		t.Fatalf("what the person sees: %+v", p[0])
	}
	if n := len(up.requests()); n != 0 {
		t.Fatalf("sent upstream while held: %d", n)
	}
	if _, err := q.Approve(p[0].ID, approvals.Approval{By: "alice"}); err != nil {
		t.Fatal(err)
	}
	<-done
	sent := up.requests()
	if w.Code != 200 || len(sent) != 1 || sent[0] != "Bearer "+benchSecret+" "+body {
		t.Fatalf("after approval: %d %q", w.Code, sent)
	}
}

func TestAskWithoutQueueOrInMonitorMode(t *testing.T) {
	br, tun, up := askBroker(t, nil, config.ModeEnforce, 0)
	w := httptest.NewRecorder()
	br.serveTunnel(w, askRequest("x"), tun)
	if w.Code != 403 || !strings.Contains(w.Body.String(), "holds no requests for approval") || len(up.requests()) != 0 {
		t.Fatalf("no queue: %d %s", w.Code, w.Body)
	}
	q, _ := approvals.New(approvals.Options{})
	br, tun, up = askBroker(t, q, config.ModeMonitor, 0)
	w = httptest.NewRecorder()
	br.serveTunnel(w, askRequest("x"), tun)
	if w.Code != 200 || len(q.Pending()) != 0 || len(up.requests()) != 1 || up.requests()[0] != " x" {
		t.Fatalf("monitor mode: %d %q", w.Code, up.requests())
	}
}

func TestAskBodyOverLimitIsRefused(t *testing.T) {
	q, _ := approvals.New(approvals.Options{})
	br, tun, up := askBroker(t, q, config.ModeEnforce, 1000)
	r := askRequest(strings.Repeat("a", 2000))
	r.ContentLength = -1 // streamed: the limit is found by reading
	r.Body = io.NopCloser(strings.NewReader(strings.Repeat("a", 100<<10)))
	w := httptest.NewRecorder()
	br.serveTunnel(w, r, tun)
	if w.Code != 413 || len(q.Pending()) != 0 || len(up.requests()) != 0 {
		t.Fatalf("over the limit: %d %s", w.Code, w.Body)
	}
}

// TestAskCardShowsWhatIsApproved: the person sees the query's values (a secret in one
// scrubbed), the credentials approving attaches, and whether the body preview is cut.
func TestAskCardShowsWhatIsApproved(t *testing.T) {
	q, _ := approvals.New(approvals.Options{})
	br, tun, _ := askBroker(t, q, config.ModeEnforce, 0)
	sub := q.Events.Subscribe(8)
	cases := map[string]struct {
		target, body string
		cut          bool
	}{
		"short body": {"/v1/things?force=true&cascade=yes&cascade=" + benchSecret, "short", false},
		"long body":  {"/v1/things", strings.Repeat("x", approvals.BodyPreviewMax+1), true},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			r := askRequest(c.body)
			r.URL.RawQuery = strings.SplitN(c.target+"?", "?", 2)[1]
			r.URL.RawQuery = strings.TrimSuffix(r.URL.RawQuery, "?")
			done := make(chan struct{})
			go func() { br.serveTunnel(httptest.NewRecorder(), r, tun); close(done) }()
			<-sub.C
			p := q.Pending()[0]
			defer func() { _ = q.Deny(p.ID, "t", ""); <-done; <-sub.C }()
			b, _ := json.Marshal(p)
			if strings.Contains(string(b), benchSecret) {
				t.Fatalf("the card shows a secret: %s", b)
			}
			if fmt.Sprint(p.Credentials) != "[openai]" || p.BodyTruncated != c.cut || p.BodySize != int64(len(c.body)) {
				t.Fatalf("card: %s", b)
			}
			if c.cut && (!strings.HasSuffix(p.BodyPreview, "…") || len(p.BodyPreview) > approvals.BodyPreviewMax+len("…")) {
				t.Fatalf("cut preview: %d bytes", len(p.BodyPreview))
			}
			if !c.cut && r.URL.RawQuery != "" && fmt.Sprint(p.Query) != "map[cascade:[yes [REDACTED]] force:[true]]" {
				t.Fatalf("query shown: %v", p.Query)
			}
		})
	}
}

// TestAskRefusesAmbiguousJSON: a body whose JSON members a server may read as one is never
// held (so never approved): the agent is told why, nothing is queued or sent.
func TestAskRefusesAmbiguousJSON(t *testing.T) {
	pad := strings.Repeat(" ", approvals.BodyPreviewMax)
	cases := map[string]struct {
		ctype, body string
		status      int
	}{
		"duplicate past the preview": {"application/json", `{"action":"archive",` + pad + `"action":"purge_everything"}`, 400},
		"case variant":               {"application/json", `{"action":"archive","Action":"purge"}`, 400},
		"folded long s":              {"application/json", `{"cascade":false,"ca\u017fcade":true}`, 400},
		"nested duplicate":           {"application/vnd.api+json", `{"a":{"b":1,"b":2}}`, 400},
		"unlabelled JSON":            {"text/plain", ` [{"x":1,"X":2}]`, 400},
		"invalid and long":           {"application/json", `{"action":"archive",` + pad + `"action":NaN}`, 400},
		"gzip, labelled JSON":        {"application/json; encoding=gzip", "\x1f\x8b\x08\x00", 400},
		"plain text":                 {"text/plain", `{not json, short}`, 0},
		"valid JSON":                 {"application/json", `{"action":"archive","ok":true}`, 0},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			q, _ := approvals.New(approvals.Options{})
			br, tun, up := askBroker(t, q, config.ModeEnforce, 0)
			sub := q.Events.Subscribe(8)
			r := askRequest(c.body)
			ct, enc, _ := strings.Cut(c.ctype, "; encoding=")
			r.Header.Set("Content-Type", ct)
			if enc != "" {
				r.Header.Set("Content-Encoding", enc)
			}
			w := httptest.NewRecorder()
			done := make(chan struct{})
			go func() { br.serveTunnel(w, r, tun); close(done) }()
			if c.status == 0 {
				<-sub.C
				_ = q.Deny(q.Pending()[0].ID, "t", "")
				<-done
				return
			}
			<-done
			if w.Code != c.status || len(q.Pending()) != 0 || len(up.requests()) != 0 {
				t.Fatalf("%d %s", w.Code, w.Body)
			}
			if !strings.HasPrefix(name, "invalid") && !strings.HasPrefix(name, "gzip") && !strings.Contains(w.Body.String(), `"code":"ambiguous_request"`) {
				t.Fatalf("not in the agent's error shape: %s", w.Body)
			}
		})
	}
}
