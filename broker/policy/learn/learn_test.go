package learn

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/format"

	"github.com/capbroker/capbroker/broker/policy"
)

func TestGeneralise(t *testing.T) {
	for in, want := range map[string]string{
		"/repos/o/r/issues/123":                                 "/repos/o/r/issues/*",
		"/repos/o/r/issues":                                     "/repos/o/r/issues",
		"/v1/users/550e8400-E29B-41d4-a716-446655440000":        "/v1/users/*",
		"/repos/o/r/commits/9fceb02":                            "/repos/o/r/commits/*",
		"/git/objects/da39a3ee5e6b4b0d3255bfef95601890afd80709": "/git/objects/*",
		"/files/AbC9xY2_kLmN0pQr/raw":                           "/files/*/raw",
		"/s/0a1b2c3d4e5f6a7b8c9d/x":                             "/s/*/x",
		"/v1beta1/projects/deadbeef/":                           "/v1beta1/projects/deadbeef/",
		"/api/application-v2-settings-2024":                     "/api/application-v2-settings-2024",
		"/":                                                     "/",
		"/a/12/b/34":                                            "/a/*/b/*",
	} {
		if got := Generalise(in); got != want {
			t.Errorf("Generalise(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestIdentifierRules(t *testing.T) {
	for s, want := range map[string]bool{
		"0": true, "42": true, "issues": false, "v1": false, "": false,
		"550e8400-e29b-41d4-a716-446655440000": true,
		"550e8400-e29b-41d4-a716-44665544000":  true, // one short of a UUID, still a token: a third digits
		"abc1234":                              true, "abcdef0": true, "deadbeef": false, "cafe12": false,
		"ghp-readme-section-2": false, // long, lower case, few digits
		"Xy7kQ2mN9pL4rT8v":     true,
		"zzzzzzzzzzzzzzzzzz11": false, // digits under a quarter, one case, not hex
	} {
		if got := IsIdentifier(s); got != want {
			t.Errorf("IsIdentifier(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestMatches(t *testing.T) {
	for _, c := range []struct {
		pattern, path string
		want          bool
	}{
		{"/a/*", "/a/1", true},
		{"/a/*", "/a/1/b", false},
		{"/a/*", "/a", false},
		{"/a/*/c", "/a/b/c", true},
		{"/a/b", "/a/c", false},
		{"/a/", "/a/", true},
	} {
		if got := Matches(c.pattern, c.path); got != c.want {
			t.Errorf("Matches(%q, %q) = %v", c.pattern, c.path, got)
		}
	}
}

// ev builds an audit decision event with its input.
func ev(phase, agent, method, host string, port int, path string, creds []string, extra map[string]any) string {
	req := map[string]any{"method": method, "host": host, "port": port}
	if phase == "request" {
		req["scheme"], req["path"], req["raw_path"] = "https", path, path
		req["query"], req["headers"], req["body_size"] = map[string]any{}, map[string]any{"accept": "*/*"}, 0
	}
	in := map[string]any{"phase": phase, "agent": map[string]any{"id": agent, "labels": map[string]any{}},
		"source": map[string]any{"ip": "10.0.0.5"}, "request": req, "credentials": []string{"gh"}}
	for k, v := range extra {
		in[k] = v
	}
	e := map[string]any{"msg": "decision", "request_id": "r", "agent": agent, "phase": phase, "method": method,
		"host": host, "path": path, "decision": "allow", "credentials": creds, "mode": "monitor", "input": in}
	b, _ := json.Marshal(e)
	return string(b)
}

const sampleLog = "not json\n" + `{"msg":"decision","agent":"x"}` + "\n"

func sample() string {
	mcp := map[string]any{"mcp": []any{map[string]any{"method": "tools/call", "tool": "search_issues", "arguments": map[string]any{"q": "x"}}}}
	mcpInit := map[string]any{"mcp": []any{map[string]any{"method": "initialize"}}}
	gql := map[string]any{"graphql": []any{map[string]any{"type": "query", "name": "Viewer", "fields": []any{"viewer"}}}}
	return strings.Join([]string{
		sampleLog[:len(sampleLog)-1],
		ev("connect", "coder-1", "CONNECT", "api.github.com", 443, "", nil, nil),
		ev("request", "coder-1", "GET", "api.github.com", 443, "/repos/o/r/issues/123", []string{"gh"}, nil),
		ev("request", "coder-1", "GET", "api.github.com", 443, "/repos/o/r/issues/7", []string{"gh"}, nil),
		ev("request", "coder-1", "POST", "api.github.com", 443, "/repos/o/r/issues", []string{"gh"}, nil),
		ev("request", "coder-1", "POST", "api.github.com", 443, "/graphql", []string{"gh"}, gql),
		ev("connect", "coder-2", "CONNECT", "mcp.example.com", 8443, "", nil, nil),
		ev("request", "coder-2", "POST", "mcp.example.com", 8443, "/mcp", nil, mcp),
		ev("request", "coder-2", "POST", "mcp.example.com", 8443, "/mcp", nil, mcpInit),
	}, "\n") + "\n"
}

func TestLearnDraftPassesItsTestsAndReplay(t *testing.T) {
	d, err := Read(strings.NewReader(sample()), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Events != 8 {
		t.Errorf("events = %d, want 8", d.Events)
	}
	rules := d.Agents["coder-1"].Requests
	if len(rules) != 3 || rules[2].Path != "/repos/o/r/issues/*" || rules[2].Credentials[0] != "gh" {
		t.Fatalf("coder-1 rules: %+v", rules)
	}
	dir := t.TempDir()
	if err := Write(dir, d, false); err != nil {
		t.Fatal(err)
	}
	if err := Write(dir, d, false); err == nil {
		t.Error("Write overwrote a draft without force")
	}
	data, _ := os.ReadFile(filepath.Join(dir, DataFile))
	for _, want := range []string{`"tool": "search_issues"`, `"name": "Viewer"`, `"method": "initialize"`} {
		if !bytes.Contains(data, []byte(want)) {
			t.Errorf("%s lacks %s:\n%s", DataFile, want, data)
		}
	}
	for _, never := range []string{"accept", "arguments", `"q"`, "10.0.0.5"} {
		if bytes.Contains(data, []byte(never)) {
			t.Errorf("%s carries %s", DataFile, never)
		}
	}
	ctx := context.Background()
	ch, err := policy.RunTests(ctx, os.DirFS(dir), dir, policy.TestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var n, denies int
	for r := range ch {
		n++
		if r.Fail || r.Error != nil {
			t.Errorf("%s failed: %v", r.Name, r.Error)
		}
		if strings.HasSuffix(r.Name, "_denied") {
			denies++
		}
	}
	if n < 20 || denies < 12 {
		t.Errorf("only %d tests, %d near misses", n, denies)
	}
	// Replay: every event re-decided as allowed, with the credentials it was granted.
	e, err := policy.NewDir(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(sample()), "\n")[2:] {
		var evt struct {
			Credentials []string `json:"credentials"`
			Input       any      `json:"input"`
		}
		dec := json.NewDecoder(strings.NewReader(line))
		dec.UseNumber()
		if err := dec.Decode(&evt); err != nil {
			t.Fatal(err)
		}
		got, err := e.DecideValue(ctx, evt.Input)
		if err != nil {
			t.Fatal(err)
		}
		got = policy.Effective(evt.Input, got)
		if !got.Allow || strings.Join(got.Credentials, ",") != strings.Join(evt.Credentials, ",") {
			t.Errorf("%s re-decided as %+v", line, got)
		}
	}
	// Near misses through the engine: an unseen tool, another port.
	for _, line := range []string{
		ev("request", "coder-2", "POST", "mcp.example.com", 8443, "/mcp", nil, map[string]any{"mcp": []any{map[string]any{"method": "tools/call", "tool": "delete_repository"}}}),
		ev("request", "coder-1", "POST", "api.github.com", 443, "/graphql", nil, map[string]any{"graphql": []any{map[string]any{"type": "mutation", "name": "DeleteRepo"}}}),
		ev("request", "coder-1", "DELETE", "api.github.com", 443, "/repos/o/r/issues/9", nil, nil),
		ev("connect", "coder-1", "CONNECT", "api.github.com", 8443, "", nil, nil),
	} {
		var evt struct{ Input any }
		_ = json.Unmarshal([]byte(line), &evt)
		got, err := e.DecideValue(ctx, evt.Input)
		if err != nil || got.Allow || !strings.HasPrefix(got.Reason, "learned policy: agent ") {
			t.Errorf("%s decided %+v, %v", line, got, err)
		}
	}
}

func TestLearnRefusesALogWithoutInputs(t *testing.T) {
	for _, log := range []string{"", sampleLog, `{"msg":"decision","agent":"a","decision":"allow"}` + "\n"} {
		if _, err := Read(strings.NewReader(log), Options{}); !errors.Is(err, ErrNoInput) {
			t.Errorf("Read(%q) = %v, want ErrNoInput", log, err)
		}
	}
}

func TestSkipDeniedAndConnectFromRequests(t *testing.T) {
	log := ev("request", "coder-1", "GET", "api.github.com", 443, "/user", []string{"gh"}, nil) + "\n" +
		strings.Replace(ev("request", "coder-3", "GET", "evil.example", 443, "/x", nil, nil), `"decision":"allow"`, `"decision":"allow","would_deny":true`, 1) + "\n"
	d, err := Read(strings.NewReader(log), Options{})
	if err != nil {
		t.Fatal(err)
	}
	// No CONNECT in the log: the HTTPS requests' tunnels are allowed all the same.
	if c := d.Agents["coder-1"].Connect; len(c) != 1 || c[0] != (Endpoint{"api.github.com", 443}) {
		t.Errorf("coder-1 connect: %v", c)
	}
	if d.Agents["coder-3"] == nil || len(d.Agents["coder-3"].Requests[0].Credentials) != 0 {
		t.Errorf("a would_deny request is learned, without credentials: %+v", d.Agents["coder-3"])
	}
	d, err = Read(strings.NewReader(log), Options{SkipDenied: true})
	if err != nil {
		t.Fatal(err)
	}
	if d.Agents["coder-3"] != nil || d.Skipped != 1 || d.Events != 1 {
		t.Errorf("SkipDenied: agents %v, skipped %d, events %d", d.Agents, d.Skipped, d.Events)
	}
	only := strings.SplitN(log, "\n", 2)[1]
	if _, err := Read(strings.NewReader(only), Options{SkipDenied: true}); err == nil || !strings.Contains(err.Error(), "were denied") {
		t.Errorf("a log of denied events only, skipped: %v", err)
	}
}

// The module and the tests are written as opa fmt would write them.
func TestDraftIsFormatted(t *testing.T) {
	d, err := Read(strings.NewReader(sample()), Options{})
	if err != nil {
		t.Fatal(err)
	}
	for name, src := range map[string][]byte{ModuleFile: module, TestFile: []byte(Tests(d))} {
		got, err := format.SourceWithOpts(name, src, format.Opts{RegoVersion: ast.RegoV1})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, src) {
			t.Errorf("%s is not opa fmt-formatted; formatted:\n%s", name, got)
		}
	}
}

func TestSibling(t *testing.T) {
	for _, c := range [][3]string{
		{"/a/b/c", "/a/b/c", "/a/b/" + otherSeg},
		{"/a/b/*", "/a/b/123", "/a/" + otherSeg + "/123"},
		{"/a/", "/a/", "/" + otherSeg + "/"},
		{"/*", "/123", ""},
		{"/", "/", ""},
	} {
		if got := sibling(c[0], c[1]); got != c[2] {
			t.Errorf("sibling(%q, %q) = %q, want %q", c[0], c[1], got, c[2])
		}
	}
}

// Without input.mcp or input.graphql, the event's own mcp and graphql objects are read.
func TestEventObjectsWhenTheInputHasNoList(t *testing.T) {
	line := ev("request", "coder-1", "POST", "mcp.example.com", 443, "/mcp", nil, nil)
	line = strings.Replace(line, `"msg":"decision"`, `"msg":"decision","mcp":{"method":"tools/call","tool":"search"},"graphql":{"type":"query","name":""}`, 1)
	d, err := Read(strings.NewReader(line+"\n"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := d.Agents["coder-1"].Requests[0]
	if len(r.MCP) != 1 || r.MCP[0] != (MCPCall{"tools/call", "search"}) || len(r.GraphQL) != 1 || r.GraphQL[0] != (GraphQLOp{"query", ""}) {
		t.Errorf("rule %+v", r)
	}
	// An empty input.mcp list is the input's word: the event's object is not used.
	line = strings.Replace(line, `"input":{`, `"input":{"mcp":[],`, 1)
	if d, err = Read(strings.NewReader(line+"\n"), Options{}); err != nil || len(d.Agents["coder-1"].Requests[0].MCP) != 0 {
		t.Errorf("with an empty input.mcp: %v %+v", err, d.Agents["coder-1"].Requests[0])
	}
}
