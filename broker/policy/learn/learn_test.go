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
	for _, want := range []string{`"tool": "search_issues"`, `"field": "viewer"`, `"method": "initialize"`, `"protocols": [`} {
		if !bytes.Contains(data, []byte(want)) {
			t.Errorf("%s lacks %s:\n%s", DataFile, want, data)
		}
	}
	for _, never := range []string{"accept", "arguments", `"q"`, "10.0.0.5", "Viewer"} {
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
		ev("request", "coder-1", "POST", "api.github.com", 443, "/graphql", nil, map[string]any{"graphql": []any{map[string]any{"type": "mutation", "name": "DeleteRepo", "fields": []any{"deleteRepository"}}}}),
		ev("request", "coder-1", "POST", "api.github.com", 443, "/graphql", nil, map[string]any{"graphql": []any{map[string]any{"type": "query", "name": "Viewer", "fields": []any{"repository"}}}}),
		ev("request", "coder-1", "POST", "api.github.com", 443, "/graphql", nil, nil),
		ev("request", "coder-1", "DELETE", "api.github.com", 443, "/repos/o/r/issues/9", nil, nil),
		ev("connect", "coder-1", "CONNECT", "api.github.com", 8443, "", nil, nil),
	} {
		var evt struct{ Input any }
		_ = json.Unmarshal([]byte(line), &evt)
		got, err := e.DecideValue(ctx, evt.Input)
		if err != nil || got.Allow || !strings.HasPrefix(got.Reason, "learned policy: ") {
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

// The event's own mcp and graphql objects (the first message, the operation's name) are
// not read: a rule learned without input.mcp or input.graphql allows none of them.
func TestEventObjectsAreNotRead(t *testing.T) {
	line := ev("request", "coder-1", "POST", "mcp.example.com", 443, "/mcp", nil, nil)
	line = strings.Replace(line, `"msg":"decision"`, `"msg":"decision","mcp":{"method":"tools/call","tool":"search"},"graphql":{"type":"query","name":""}`, 1)
	d, err := Read(strings.NewReader(line+"\n"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := d.Agents["coder-1"].Requests[0]
	if len(r.MCP) != 0 || len(r.GraphQL) != 0 || len(r.Protocols) != 0 {
		t.Errorf("rule %+v", r)
	}
	e := draftEngine(t, d)
	for _, sem := range []map[string]any{
		{"mcp": []any{map[string]any{"method": "tools/call", "tool": "search"}}},
		{"mcp": []any{map[string]any{"method": "tools/call", "tool": "delete_repository"}}},
		{"graphql": []any{map[string]any{"type": "mutation", "name": "", "fields": []any{"deleteEverything"}}}},
		{"jsonrpc": []any{map[string]any{"method": "eth_sendTransaction"}}},
	} {
		if got := decide(t, e, "coder-1", "POST", "mcp.example.com", 443, "/mcp", sem); got.Allow || !strings.Contains(got.Reason, "was not seen sending") {
			t.Errorf("%v decided %+v", sem, got)
		}
	}
	if got := decide(t, e, "coder-1", "POST", "mcp.example.com", 443, "/mcp", map[string]any{"mcp": []any{}}); !got.Allow {
		t.Errorf("a request with no MCP message decided %+v", got)
	}
}

// Event members are matched by their exact names: an "Input" beside "input" is not read (JSON
// v1 would have taken the last of them).
func TestEventMembersAreExact(t *testing.T) {
	benign := ev("request", "a", "GET", "h.example", 443, "/x", nil, nil)
	other := ev("request", "a", "DELETE", "h.example", 443, "/everything", nil, nil)
	var o struct{ Input json.RawMessage }
	if err := json.Unmarshal([]byte(other), &o); err != nil {
		t.Fatal(err)
	}
	in := string(o.Input)
	line := benign[:len(benign)-1] + `,"Input":` + in + `}`
	d, err := Read(strings.NewReader(line+"\n"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r := d.Agents["a"].Requests; len(r) != 1 || r[0].Method != "GET" {
		t.Fatalf("learned %+v", r[0])
	}
	// The same member twice: the line is not read.
	twice := benign[:len(benign)-1] + `,"input":` + in + `}`
	if _, err := Read(strings.NewReader(twice+"\n"), Options{}); !errors.Is(err, ErrNoInput) {
		t.Fatalf("a line with input twice: %v", err)
	}
}

// draftEngine writes d and loads it as the broker would.
func draftEngine(t *testing.T, d *Draft) *policy.Engine {
	t.Helper()
	dir := t.TempDir()
	if err := Write(dir, d, false); err != nil {
		t.Fatal(err)
	}
	e, err := policy.NewDir(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// decide decides a request-phase input with the protocol parts in sem.
func decide(t *testing.T, e *policy.Engine, agent, method, host string, port int, path string, sem map[string]any) policy.Decision {
	t.Helper()
	in := map[string]any{"phase": "request", "agent": map[string]any{"id": agent, "labels": map[string]any{}},
		"request": map[string]any{"method": method, "scheme": "https", "host": host, "port": port, "path": path}}
	for k, v := range sem {
		in[k] = v
	}
	got, err := e.DecideValue(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func gqlOp(typ, name string, fields ...any) map[string]any {
	return map[string]any{"type": typ, "name": name, "fields": fields}
}

// TestDraftAllowsOnlyWhatWasSeen: GraphQL is learned by operation type and top-level field,
// never by name; MCP by method and tool (or resource, or prompt); JSON-RPC by method. What
// was not seen is denied, and so is a request on a rule learned with a protocol whose input
// lacks it.
func TestDraftAllowsOnlyWhatWasSeen(t *testing.T) {
	log := strings.Join([]string{
		ev("request", "a", "POST", "api.example", 443, "/graphql", nil, map[string]any{"graphql": []any{gqlOp("mutation", "AddNote", "addNote"), gqlOp("query", "Q", "viewer", "notes")}}),
		ev("request", "a", "POST", "api.example", 443, "/graphql", nil, map[string]any{"graphql": []any{map[string]any{"type": "persisted", "name": "P", "fields": []any{}, "hash": "abc"}}}),
		ev("request", "a", "POST", "mcp.example", 443, "/mcp", nil, map[string]any{"mcp": []any{
			map[string]any{"method": "tools/call", "tool": "echo", "arguments": map[string]any{"x": "secret-arg"}, "uri": ""},
			map[string]any{"method": "resources/read", "tool": "", "uri": "test://static/1"},
		}}),
		ev("request", "a", "GET", "mcp.example", 443, "/mcp", nil, map[string]any{"mcp": []any{}}),
		ev("request", "a", "POST", "rpc.example", 443, "/", nil, map[string]any{"jsonrpc": []any{map[string]any{"method": "eth_call"}}}),
	}, "\n") + "\n"
	d, err := Read(strings.NewReader(log), Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := draftEngine(t, d)
	for _, c := range []struct {
		name, method, host, path string
		sem                      map[string]any
		allow                    bool
		reason                   string
	}{
		{"seen mutation", "POST", "api.example", "/graphql", map[string]any{"graphql": []any{gqlOp("mutation", "AddNote", "addNote")}}, true, ""},
		{"seen mutation under another name", "POST", "api.example", "/graphql", map[string]any{"graphql": []any{gqlOp("mutation", "Whatever", "addNote")}}, true, ""},
		{"seen name, unseen field", "POST", "api.example", "/graphql", map[string]any{"graphql": []any{gqlOp("mutation", "AddNote", "deleteEverything")}}, false, "GraphQL mutation deleteEverything"},
		{"seen field and an unseen one", "POST", "api.example", "/graphql", map[string]any{"graphql": []any{gqlOp("mutation", "AddNote", "addNote", "deleteEverything")}}, false, "GraphQL mutation deleteEverything"},
		{"a query's field as a mutation", "POST", "api.example", "/graphql", map[string]any{"graphql": []any{gqlOp("mutation", "Q", "viewer")}}, false, "GraphQL mutation viewer"},
		{"seen query fields, one at a time", "POST", "api.example", "/graphql", map[string]any{"graphql": []any{gqlOp("query", "", "notes")}}, true, ""},
		{"seen persisted hash", "POST", "api.example", "/graphql", map[string]any{"graphql": []any{map[string]any{"type": "persisted", "name": "P", "fields": []any{}, "hash": "abc"}}}, true, ""},
		{"unseen persisted hash", "POST", "api.example", "/graphql", map[string]any{"graphql": []any{map[string]any{"type": "persisted", "name": "P", "fields": []any{}, "hash": "abd"}}}, false, "GraphQL persisted #abd"},
		{"GraphQL no longer read", "POST", "api.example", "/graphql", nil, false, "does not read the graphql of api.example/graphql"},
		{"seen tool", "POST", "mcp.example", "/mcp", map[string]any{"mcp": []any{map[string]any{"method": "tools/call", "tool": "echo", "arguments": map[string]any{"y": 1}}}}, true, ""},
		{"unseen tool", "POST", "mcp.example", "/mcp", map[string]any{"mcp": []any{map[string]any{"method": "tools/call", "tool": "delete_repository"}}}, false, "MCP tools/call delete_repository"},
		{"seen tool batched with an unseen one", "POST", "mcp.example", "/mcp", map[string]any{"mcp": []any{map[string]any{"method": "tools/call", "tool": "echo"}, map[string]any{"method": "tools/call", "tool": "rm"}}}, false, "MCP tools/call rm"},
		{"unseen resource", "POST", "mcp.example", "/mcp", map[string]any{"mcp": []any{map[string]any{"method": "resources/read", "uri": "file:///etc/passwd"}}}, false, "MCP resources/read file:///etc/passwd"},
		{"seen resource", "POST", "mcp.example", "/mcp", map[string]any{"mcp": []any{map[string]any{"method": "resources/read", "uri": "test://static/1"}}}, true, ""},
		{"seen GET, no message", "GET", "mcp.example", "/mcp", map[string]any{"mcp": []any{}}, true, ""},
		{"MCP no longer read", "POST", "mcp.example", "/mcp", nil, false, "list it under protocols.mcp"},
		{"seen JSON-RPC method", "POST", "rpc.example", "/", map[string]any{"jsonrpc": []any{map[string]any{"method": "eth_call"}}}, true, ""},
		{"unseen JSON-RPC method", "POST", "rpc.example", "/", map[string]any{"jsonrpc": []any{map[string]any{"method": "eth_sendTransaction"}}}, false, "JSON-RPC eth_sendTransaction"},
		{"MCP message without a method", "POST", "mcp.example", "/mcp", map[string]any{"mcp": []any{map[string]any{"tool": "echo"}}}, false, "MCP  echo"},
		{"GraphQL operation without a type", "POST", "api.example", "/graphql", map[string]any{"graphql": []any{map[string]any{"fields": []any{"addNote"}}}}, false, "GraphQL  addNote"},
		{"JSON-RPC message without a method", "POST", "rpc.example", "/", map[string]any{"jsonrpc": []any{map[string]any{}}}, false, "JSON-RPC "},
		{"MCP on the JSON-RPC endpoint", "POST", "rpc.example", "/", map[string]any{"jsonrpc": []any{}, "mcp": []any{map[string]any{"method": "tools/call", "tool": "x"}}}, false, "MCP tools/call x"},
	} {
		got := decide(t, e, "a", c.method, c.host, 443, c.path, c.sem)
		if got.Allow != c.allow || !c.allow && !strings.Contains(got.Reason, c.reason) {
			t.Errorf("%s: decided %+v, want allow %v, reason with %q", c.name, got, c.allow, c.reason)
		}
	}
	data, _ := json.Marshal(d)
	if bytes.Contains(data, []byte("secret-arg")) || bytes.Contains(data, []byte("AddNote")) {
		t.Errorf("the draft carries arguments or operation names: %s", data)
	}
	// The draft's own tests pass, near misses on each protocol included.
	dir := t.TempDir()
	if err := Write(dir, d, false); err != nil {
		t.Fatal(err)
	}
	tests := Tests(d)
	for _, want := range []string{"_unseen_graphql_field_denied", "_unseen_mcp_tool_denied", "_unseen_jsonrpc_method_denied", "_mcp_unread_denied"} {
		if !strings.Contains(tests, want) {
			t.Errorf("the draft's tests lack a %s case", want)
		}
	}
	runDraftTests(t, dir)
}

// runDraftTests runs the draft's own tests in dir and fails for any that does not pass.
func runDraftTests(t *testing.T, dir string) {
	t.Helper()
	ch, err := policy.RunTests(context.Background(), os.DirFS(dir), dir, policy.TestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for r := range ch {
		n++
		if r.Fail || r.Error != nil {
			t.Errorf("%s failed: %v", r.Name, r.Error)
		}
	}
	if n == 0 {
		t.Fatal("no draft tests ran")
	}
}
