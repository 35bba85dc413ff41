package learn

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/format"
)

//go:embed module.rego
var module []byte

// Files the draft is written as.
const (
	DataFile   = "learned.json"
	ModuleFile = "learned.rego"
	TestFile   = "learned_test.rego"
)

// Near-miss values: names no learning run produces.
const (
	otherHost   = "not-seen.learn.invalid"
	otherAgent  = "not-seen-agent"
	otherSeg    = "not-seen-sibling"
	otherTool   = "not_seen_tool"
	otherField  = "notSeenField"
	otherMethod = "not_seen/method"
)

// Write writes the draft into dir (created if missing): the data, the module and its tests.
// It refuses to overwrite any of the three unless force.
func Write(dir string, d *Draft, force bool) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if !force {
		for _, f := range []string{DataFile, ModuleFile, TestFile} {
			if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
				return fmt.Errorf("%s exists (use --force to overwrite)", filepath.Join(dir, f))
			}
		}
	}
	data, err := json.MarshalIndent(map[string]any{"learned": d}, "", "  ")
	if err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		b    []byte
	}{{DataFile, append(data, '\n')}, {ModuleFile, module}, {TestFile, []byte(Tests(d))}} {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// allows reports whether the draft allows a request (Go's mirror of the module, used to keep
// near misses that some other learned rule allows out of the tests).
func (d *Draft) allows(agent, method, scheme, host string, port int, path string) bool {
	a := d.Agents[agent]
	if a == nil {
		return false
	}
	for _, r := range a.Requests {
		if r.Method == method && r.Scheme == scheme && r.Host == host && r.Port == port && Matches(r.Path, path) {
			return true
		}
	}
	return false
}

type testCase struct {
	name  string
	allow bool
	input map[string]any
}

func connectInput(agent, host string, port int) map[string]any {
	return map[string]any{
		"phase":   "connect",
		"agent":   map[string]any{"id": agent, "labels": map[string]any{}},
		"request": map[string]any{"method": "CONNECT", "host": host, "port": port},
	}
}

func requestInput(agent string, r *Rule, method, host, path string) map[string]any {
	return map[string]any{
		"phase": "request",
		"agent": map[string]any{"id": agent, "labels": map[string]any{}},
		"request": map[string]any{
			"method": method, "scheme": r.Scheme, "host": host, "port": r.Port,
			"path": path, "query": map[string]any{}, "headers": map[string]any{}, "body": nil,
		},
	}
}

// sibling is path with its last segment that the pattern fixes (not a wildcard, not empty)
// replaced: "/a/b/123" under "/a/b/*" is "/a/not-seen-sibling/123". It returns "" when the
// pattern fixes no segment.
func sibling(pattern, path string) string {
	ps, xs := strings.Split(pattern, "/"), strings.Split(path, "/")
	for i := len(ps) - 1; i >= 0; i-- {
		if ps[i] != Wildcard && ps[i] != "" && i < len(xs) {
			xs[i] = otherSeg
			return strings.Join(xs, "/")
		}
	}
	return ""
}

// cases are the tests: every observed connect and request is allowed; near misses (another
// method, a sibling path, another host, another agent, an unseen MCP tool or GraphQL
// operation) are denied.
func (d *Draft) cases() []testCase {
	var out []testCase
	agents := make([]string, 0, len(d.Agents))
	for id := range d.Agents {
		agents = append(agents, id)
	}
	slices.Sort(agents)
	stranger := otherAgent
	for d.Agents[stranger] != nil {
		stranger += "-x"
	}
	for ai, id := range agents {
		a := d.Agents[id]
		for ci, e := range a.Connect {
			p := fmt.Sprintf("a%d_connect%d", ai, ci)
			out = append(out,
				testCase{p + "_allowed", true, connectInput(id, e.Host, e.Port)},
				testCase{p + "_other_host_denied", false, connectInput(id, otherHost, e.Port)},
				testCase{p + "_other_agent_denied", false, connectInput(stranger, e.Host, e.Port)})
			if !slices.Contains(a.Connect, Endpoint{e.Host, e.Port + 1}) {
				out = append(out, testCase{p + "_other_port_denied", false, connectInput(id, e.Host, e.Port+1)})
			}
		}
		for ri, r := range a.Requests {
			p := fmt.Sprintf("a%d_request%d", ai, ri)
			for si, path := range r.Seen {
				in := requestInput(id, r, r.Method, r.Host, path)
				for k, v := range r.seenSemantic[si] {
					in[k] = v
				}
				// Every protocol the rule requires is in the input (a request seen before the
				// broker read it has an empty list).
				for _, k := range r.Protocols {
					if _, ok := in[k]; !ok {
						in[k] = []any{}
					}
				}
				out = append(out, testCase{fmt.Sprintf("%s_seen%d_allowed", p, si), true, in})
			}
			path := r.Seen[0]
			for _, m := range []string{"DELETE", "PUT", "PATCH", "POST", "GET"} {
				if !d.allows(id, m, r.Scheme, r.Host, r.Port, path) {
					out = append(out, testCase{p + "_other_method_denied", false, requestInput(id, r, m, r.Host, path)})
					break
				}
			}
			if s := sibling(r.Path, path); s != "" && !d.allows(id, r.Method, r.Scheme, r.Host, r.Port, s) {
				out = append(out, testCase{p + "_sibling_path_denied", false, requestInput(id, r, r.Method, r.Host, s)})
			}
			out = append(out,
				testCase{p + "_other_host_denied", false, requestInput(id, r, r.Method, otherHost, path)},
				testCase{p + "_other_agent_denied", false, requestInput(stranger, r, r.Method, r.Host, path)})
			if len(d.rulesFor(id, r, path)) == 1 {
				out = append(out, r.unseenCases(p, id, path)...)
			}
		}
	}
	return out
}

// unseenCases are the near misses of rule r on protocols it was learned reading: an unseen
// MCP tool, a GraphQL operation named as a seen one running an unseen field, an unseen
// JSON-RPC method, and the protocol missing from the input.
func (r *Rule) unseenCases(p, agent, path string) []testCase {
	var out []testCase
	with := func(k string, v any) map[string]any {
		in := requestInput(agent, r, r.Method, r.Host, path)
		for _, q := range r.Protocols {
			in[q] = []any{}
		}
		in[k] = v
		return in
	}
	for _, k := range r.Protocols {
		switch k {
		case "mcp":
			out = append(out, testCase{p + "_unseen_mcp_tool_denied", false, with(k, []any{MCPCall{Method: "tools/call", Tool: otherTool}})})
		case "graphql":
			name := ""
			for _, s := range r.seenSemantic {
				for _, o := range objects(s["graphql"]) {
					if str(o, "type") == "mutation" || name == "" {
						name = str(o, "name")
					}
				}
			}
			op := map[string]any{"type": "mutation", "name": name, "fields": []any{otherField}}
			out = append(out, testCase{p + "_unseen_graphql_field_denied", false, with(k, []any{op})})
		case "jsonrpc":
			out = append(out, testCase{p + "_unseen_jsonrpc_method_denied", false, with(k, []any{map[string]any{"method": otherMethod}})})
		}
		in := requestInput(agent, r, r.Method, r.Host, path)
		out = append(out, testCase{p + "_" + k + "_unread_denied", false, in})
	}
	return out
}

// rulesFor returns the agent's rules matching r's method, host and port and path.
func (d *Draft) rulesFor(agent string, r *Rule, path string) []*Rule {
	var out []*Rule
	for _, x := range d.Agents[agent].Requests {
		if x.Method == r.Method && x.Scheme == r.Scheme && x.Host == r.Host && x.Port == r.Port && Matches(x.Path, path) {
			out = append(out, x)
		}
	}
	return out
}

// Tests returns the _test.rego module of the draft, formatted as opa fmt does.
func Tests(d *Draft) string {
	src := tests(d)
	if b, err := format.SourceWithOpts(TestFile, []byte(src), format.Opts{RegoVersion: ast.RegoV1}); err == nil {
		return string(b)
	}
	return src
}

func tests(d *Draft) string {
	var b strings.Builder
	b.WriteString("# Drafted by `broker policy learn`: each observed connect and request is allowed; near\n")
	b.WriteString("# misses (another method, a sibling path, another host or port, another agent, an unseen\n")
	b.WriteString("# MCP tool or GraphQL operation) are denied.\n")
	b.WriteString("package broker_test\n\nimport rego.v1\n")
	for _, c := range d.cases() {
		in, _ := json.Marshal(c.input)
		fmt.Fprintf(&b, "\ntest_%s if {\n\td := data.broker.decision with input as %s\n", c.name, in)
		if c.allow {
			b.WriteString("\td.allow == true\n}\n")
		} else {
			b.WriteString("\td.allow == false\n\tstartswith(d.reason, \"learned policy:\")\n}\n")
		}
	}
	return b.String()
}
