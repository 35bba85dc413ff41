package broker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"

	"github.com/capbroker/capbroker/broker/identity"
	"github.com/capbroker/capbroker/broker/upstream"
	"github.com/capbroker/capbroker/broker/wire/strictjson"
)

// TestUpstreamFailureDropsParserText: an error that may quote the upstream's bytes is recorded
// as a fixed text; one the broker composed keeps its words, and its class for the agent.
func TestUpstreamFailureDropsParserText(t *testing.T) {
	const canary = "sk-canary-0123456789"
	_, parseErr := http.ReadResponse(bufio.NewReader(strings.NewReader("HTTP/1.1 200 OK\r\nX-Reflect "+canary+"\r\n\r\n")), nil)
	if parseErr == nil || !strings.Contains(parseErr.Error(), canary) {
		t.Fatalf("the parser no longer quotes the line (%v): the test needs another input", parseErr)
	}
	dialErr := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	cases := map[string]struct {
		err      error
		keepText string
		status   int
	}{
		"parser quoting the upstream": {parseErr, "", http.StatusBadGateway},
		"refused dial":                {dialErr, "connection refused", http.StatusBadGateway},
		"timeout":                     {context.DeadlineExceeded, "deadline exceeded", http.StatusGatewayTimeout},
		"fake 101":                    {errBadSwitch, "101", http.StatusBadGateway},
		"unknown":                     {errors.New("x " + canary), "", http.StatusBadGateway},
	}
	for name, c := range cases {
		got := upstreamFailure("127.0.0.1:1", c.err)
		text := got.Error()
		if strings.Contains(text, canary) {
			t.Errorf("%s: the recorded error quotes the upstream: %q", name, text)
		}
		if c.keepText != "" && !strings.Contains(text, c.keepText) {
			t.Errorf("%s: %q lost the broker's own words %q", name, text, c.keepText)
		}
		if c.keepText == "" && !errors.Is(got, errMalformedResponse) {
			t.Errorf("%s: %q is not the fixed text", name, text)
		}
		if st := classify(got).status; st != c.status {
			t.Errorf("%s: status %d, want %d", name, st, c.status)
		}
	}
}

// TestRefusalShapes: a refusal's body is in the shape the caller's client reads, and keeps
// the broker's fields where that client does not look.
func TestRefusalShapes(t *testing.T) {
	ae := classify(denial{"the /admin area is off limits"})
	cases := map[string]struct {
		method, url string
		shape       errorShape
		ctype       string
	}{
		"plain":                {"GET", "https://example.com/admin", shapeBroker, "application/json"},
		"connect":              {"CONNECT", "//api.openai.com:443", shapeBroker, "application/json"},
		"openai host":          {"POST", "https://api.openai.com/v1/whatever", shapeOpenAI, "application/json"},
		"openai-compatible":    {"POST", "https://127.0.0.1:8443/v1/chat/completions", shapeOpenAI, "application/json"},
		"responses":            {"POST", "https://llm.internal/v1/responses", shapeOpenAI, "application/json"},
		"azure":                {"POST", "https://x.openai.azure.com/openai/deployments/d/chat/completions", shapeOpenAI, "application/json"},
		"anthropic host":       {"POST", "https://api.anthropic.com/v1/models", shapeAnthropic, "application/json"},
		"anthropic path":       {"POST", "https://gateway.internal/anthropic/v1/messages", shapeAnthropic, "application/json"},
		"git refs":             {"GET", "https://git.internal/o/r.git/info/refs?service=git-upload-pack", shapeGit, "text/plain; charset=utf-8"},
		"git receive-pack":     {"POST", "https://git.internal/o/r.git/git-receive-pack", shapeGit, "text/plain; charset=utf-8"},
		"not an api v1 prefix": {"GET", "https://example.com/v1/users", shapeBroker, "application/json"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			req, err := http.NewRequest(c.method, c.url, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := shapeFor(req, ""); got != c.shape {
				t.Fatalf("shape %d, want %d", got, c.shape)
			}
			resp := errorResponse(req, ae, "rid1", "coder-1", req.URL.Hostname())
			if resp.Header.Get("Content-Type") != c.ctype || resp.StatusCode != 403 || resp.Header.Get("X-Broker-Request-Id") != "rid1" {
				t.Fatalf("response: %d %v", resp.StatusCode, resp.Header)
			}
			b, _ := io.ReadAll(resp.Body)
			if c.shape == shapeGit {
				if !strings.HasPrefix(string(b), "capbroker denied: the /admin area is off limits\n") || !strings.Contains(string(b), "request_id: rid1") {
					t.Fatalf("git body: %q", b)
				}
				return
			}
			var got map[string]any
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatalf("body: %q", b)
			}
			for k, want := range map[string]string{"reason": "the /admin area is off limits", "request_id": "rid1", "agent": "coder-1", "hint": hintDenied} {
				if got[k] != want {
					t.Errorf("%s = %v, want %q", k, got[k], want)
				}
			}
			switch c.shape {
			case shapeBroker:
				if got["error"] != "denied" {
					t.Errorf("error = %v", got["error"])
				}
			case shapeOpenAI, shapeAnthropic:
				obj, _ := got["error"].(map[string]any)
				if msg, _ := obj["message"].(string); obj["code"] != "denied" || obj["type"] != "permission_error" ||
					!strings.HasPrefix(msg, "capbroker denied: the /admin area is off limits. ") {
					t.Errorf("error object: %v", got["error"])
				}
				if (c.shape == shapeAnthropic) != (got["type"] == "error") {
					t.Errorf("type = %v", got["type"])
				}
			}
		})
	}
}

// TestConnectRefusalStatusLine: a refused CONNECT says why in its status line, made safe; the
// 407 challenge keeps the standard words.
func TestConnectRefusalStatusLine(t *testing.T) {
	connect := &http.Request{Method: http.MethodConnect, Host: "x:443", URL: &url.URL{Host: "x:443"}, Header: http.Header{}}
	long := strings.Repeat("é long reason ", 40)
	cases := map[string]struct {
		err  error
		want string
	}{
		"deny":           {denial{"host not allowed"}, "403 denied: host not allowed"},
		"control bytes":  {denial{"a\r\nX-Injected: 1\tb"}, "403 denied: a??X-Injected: 1 b"},
		"non-ascii":      {denial{"café"}, "403 denied: caf?"},
		"challenge":      {identity.ErrUnauthenticated, "407 Proxy Authentication Required"},
		"upstream error": {errors.New("dial"), "502 upstream_error: the upstream server could not be reached or failed TLS verification"},
		"agent gone":     {fmt.Errorf("upstream x:443: %w", context.Canceled), "502 upstream_error: the request was cancelled before the upstream answered: the agent went away, or the broker was shutting down"},
		"timeout":        {fmt.Errorf("upstream x:443: %w", context.DeadlineExceeded), "504 upstream_error: the upstream server did not answer in time"},
	}
	for name, c := range cases {
		resp := errorResponse(connect, classify(c.err), "rid", "", "x")
		if resp.Status != c.want {
			t.Errorf("%s: status %q, want %q", name, resp.Status, c.want)
		}
		var buf bytes.Buffer
		if err := resp.Write(&buf); err != nil {
			t.Fatal(err)
		}
		line, _, _ := strings.Cut(buf.String(), "\r\n")
		if line != "HTTP/1.1 "+c.want {
			t.Errorf("%s: wire status line %q", name, line)
		}
	}
	resp := errorResponse(connect, classify(denial{long}), "rid", "", "x")
	if len(resp.Status) > len("403 ")+maxStatusReason || !strings.HasSuffix(resp.Status, "...") {
		t.Errorf("long reason: %q", resp.Status)
	}
	for _, r := range resp.Status {
		if r < 0x20 || r > 0x7e {
			t.Fatalf("long reason: unsafe byte in %q", resp.Status)
		}
	}
}

// TestChallengeIsNotADeny: a 407 to a request that sent no proxy credentials is a challenge;
// to one that sent wrong ones, an error (audited as a deny).
func TestChallengeIsNotADeny(t *testing.T) {
	r := &http.Request{Method: http.MethodConnect, Header: http.Header{}}
	if !isChallenge(r, identity.ErrUnauthenticated) {
		t.Error("no credentials: not a challenge")
	}
	if isChallenge(r, denial{"x"}) {
		t.Error("a deny is a challenge")
	}
	r.Header.Set("Proxy-Authorization", "Basic eDp5")
	if isChallenge(r, identity.ErrUnauthenticated) {
		t.Error("wrong credentials: a challenge")
	}
}

// TestClassifyAmbiguous: a request the broker will not decide on is a 400 ambiguous_request
// (CONTRACT §8b), whether a header was given twice or a body's JSON members collide, and the
// reason names the members, not their values.
func TestClassifyAmbiguous(t *testing.T) {
	bodyErr := strictjson.Check([]byte(`{"name":"sk-canary-value","Name":"echo"}`))
	cases := map[string]struct {
		err    error
		reason string
	}{
		"header twice":     {ambiguous{`header "Content-Type" is given more than once`}, "Content-Type"},
		"members collide":  {fmt.Errorf("reading the MCP call: %w", bodyErr), `"name" and "Name"`},
		"member duplicate": {strictjson.Check([]byte(`{"a":1,"a":2}`)), `"a" appears twice`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			ae := classify(c.err)
			if ae.status != http.StatusBadRequest || ae.code != "ambiguous_request" {
				t.Fatalf("classify = %d %s, want 400 ambiguous_request", ae.status, ae.code)
			}
			if !strings.Contains(ae.reason, c.reason) || strings.Contains(ae.reason, "canary") {
				t.Errorf("reason %q: want it to name %s and no value", ae.reason, c.reason)
			}
		})
	}
	// Invalid JSON is not ambiguous: each surface keeps its own answer for it.
	if ae := classify(strictjson.Check([]byte(`{`))); ae.code == "ambiguous_request" {
		t.Error("invalid JSON classified as ambiguous_request")
	}
}

// TestOwnServiceIsADeny: a request the dialer refuses because it goes to the broker's own
// listeners is a 403 denied naming why, audited as a deny, whatever the policy allowed.
func TestOwnServiceIsADeny(t *testing.T) {
	err := upstreamFailure("127.0.0.1:9090", fmt.Errorf("dial: %w (%w)", upstream.ErrForbiddenDestination, upstream.ErrOwnService))
	ae := classify(err)
	if ae.status != http.StatusForbidden || ae.code != "denied" || !strings.Contains(ae.reason, "the broker's own listener") {
		t.Fatalf("classify = %d %s %q", ae.status, ae.code, ae.reason)
	}
	// Any other refused destination stays what it was.
	if ae := classify(upstreamFailure("10.0.0.1:443", upstream.ErrForbiddenDestination)); ae.code != "upstream_error" {
		t.Fatalf("a private destination: %s", ae.code)
	}
}
