// Package learn drafts a policy from an audit log of a monitor-mode run (`broker policy
// learn`): per agent, the hosts it connected to and the requests it made, with identifiers in
// paths generalised, the credentials it was granted, and the MCP tools and GraphQL operations
// it used where the input carries them.
//
// It reads, from each decision event's `input` (audit.include_input metadata or more):
// phase, agent.id, request.method, request.host, request.port, request.path, and, when
// present, input.mcp[].method and input.mcp[].tool, input.graphql[].type and
// input.graphql[].name (CONTRACT §8). From the event itself it reads the credentials granted
// (`credentials`, on events that were not would_deny) and, when the input has no such
// list, the event's `mcp` {method, tool} and `graphql` {type, name} objects. Header values,
// query values and bodies are never read into the draft.
package learn

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// ErrNoInput is returned for a log without any decision event carrying its input.
var ErrNoInput = errors.New("no decision event carries its policy input (record them with audit.include_input: metadata, headers or full)")

// Draft is what a log teaches: by agent id.
type Draft struct {
	Agents map[string]*Agent `json:"agents"`
	// Events is the number of decision events with input that were read.
	Events int `json:"-"`
	// Skipped is the number of events left out by Options.SkipDenied.
	Skipped int `json:"-"`
}

// Agent is what one agent was seen doing.
type Agent struct {
	Connect  []Endpoint `json:"connect"`
	Requests []*Rule    `json:"requests"`
}

// Endpoint is a host and port an agent opened a CONNECT tunnel to.
type Endpoint struct {
	Host string `json:"host"`
	Port int    `json:"port"`
}

// Rule is one kind of request: a method on a host and port, on paths matching Path
// (segments of Wildcard match any one segment).
type Rule struct {
	Method      string   `json:"method"`
	Scheme      string   `json:"scheme"`
	Host        string   `json:"host"`
	Port        int      `json:"port"`
	Path        string   `json:"path"`
	Credentials []string `json:"credentials"`
	// MCP and GraphQL, when not empty, are the only MCP calls and GraphQL operations the
	// rule allows; a rule learned without them does not look at input.mcp or input.graphql.
	MCP     []MCPCall   `json:"mcp,omitempty"`
	GraphQL []GraphQLOp `json:"graphql,omitempty"`
	Seen    []string    `json:"-"` // observed paths, for the tests
	seenMCP [][]MCPCall // observed MCP lists, for the tests
	seenGQL [][]GraphQLOp
}

// MCPCall is an MCP JSON-RPC method and, for tools/call, the tool ("" otherwise).
type MCPCall struct {
	Method string `json:"method"`
	Tool   string `json:"tool"`
}

// GraphQLOp is a GraphQL operation's type and name ("" for an anonymous one).
type GraphQLOp struct {
	Type string `json:"type"`
	Name string `json:"name"`
}

type event struct {
	Msg         string         `json:"msg"`
	Message     string         `json:"message"`
	WouldDeny   bool           `json:"would_deny"`
	Decision    string         `json:"decision"`
	Credentials []string       `json:"credentials"`
	MCP         map[string]any `json:"mcp"`
	GraphQL     map[string]any `json:"graphql"`
	Input       map[string]any `json:"input"`
}

// Options change what Read learns.
type Options struct {
	// SkipDenied leaves out the events whose request the recording policy denied (decision
	// "deny", or would_deny in monitor mode): the draft then allows only what was allowed.
	SkipDenied bool
}

// Read learns from an audit log, one JSON event a line; lines that are not decision events are
// skipped. It fails with ErrNoInput when no decision event carries its input.
func Read(r io.Reader, o Options) (*Draft, error) {
	d := &Draft{Agents: map[string]*Agent{}}
	br := bufio.NewReader(r)
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			var ev event
			dec := json.NewDecoder(bytes.NewReader(line))
			dec.UseNumber()
			if dec.Decode(&ev) == nil && (ev.Msg == "decision" || ev.Message == "decision") && ev.Input != nil {
				if o.SkipDenied && (ev.Decision != "allow" || ev.WouldDeny) {
					d.Skipped++
				} else if lerr := d.add(&ev); lerr != nil {
					return nil, fmt.Errorf("line %d: %w", n, lerr)
				}
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if d.Events == 0 && d.Skipped > 0 {
		return nil, fmt.Errorf("all %d decision events with input were denied, and denied ones are skipped", d.Skipped)
	}
	if d.Events == 0 {
		return nil, ErrNoInput
	}
	d.sort()
	return d, nil
}

func str(m map[string]any, k string) string {
	s, _ := m[k].(string)
	return s
}

func num(m map[string]any, k string) (int, bool) {
	switch v := m[k].(type) {
	case json.Number:
		n, err := strconv.Atoi(v.String())
		return n, err == nil
	case float64:
		return int(v), true
	}
	return 0, false
}

func (d *Draft) add(ev *event) error {
	in := ev.Input
	agent, _ := in["agent"].(map[string]any)
	req, _ := in["request"].(map[string]any)
	id, phase := str(agent, "id"), str(in, "phase")
	host, method := str(req, "host"), strings.ToUpper(str(req, "method"))
	port, ok := num(req, "port")
	if id == "" || host == "" || method == "" || !ok {
		return errors.New("the event's input has no agent.id, request.method, request.host or request.port")
	}
	a := d.Agents[id]
	if a == nil {
		a = &Agent{Connect: []Endpoint{}, Requests: []*Rule{}}
		d.Agents[id] = a
	}
	d.Events++
	switch phase {
	case "connect":
		e := Endpoint{Host: host, Port: port}
		if !slices.Contains(a.Connect, e) {
			a.Connect = append(a.Connect, e)
		}
		return nil
	case "request":
	default:
		return fmt.Errorf("unknown phase %q", phase)
	}
	path := str(req, "path")
	if path == "" {
		return errors.New("a request-phase input without request.path")
	}
	r := &Rule{Method: method, Scheme: str(req, "scheme"), Host: host, Port: port, Path: Generalise(path), Credentials: []string{}}
	var found *Rule
	for _, x := range a.Requests {
		if x.Method == r.Method && x.Scheme == r.Scheme && x.Host == r.Host && x.Port == r.Port && x.Path == r.Path {
			found = x
			break
		}
	}
	if found == nil {
		found = r
		a.Requests = append(a.Requests, r)
	}
	if !slices.Contains(found.Seen, path) {
		found.Seen = append(found.Seen, path)
	}
	if ev.Decision == "allow" && !ev.WouldDeny {
		for _, c := range ev.Credentials {
			if !slices.Contains(found.Credentials, c) {
				found.Credentials = append(found.Credentials, c)
			}
		}
	}
	calls := mcpCalls(in, ev)
	for _, c := range calls {
		if !slices.Contains(found.MCP, c) {
			found.MCP = append(found.MCP, c)
		}
	}
	ops := graphqlOps(in, ev)
	for _, o := range ops {
		if !slices.Contains(found.GraphQL, o) {
			found.GraphQL = append(found.GraphQL, o)
		}
	}
	found.seenMCP = append(found.seenMCP, calls)
	found.seenGQL = append(found.seenGQL, ops)
	return nil
}

// items returns input[key] as a list of objects, or, when the input has no such list, the
// event's object of the same name as a list of one.
func items(in map[string]any, fallback map[string]any, key string) []map[string]any {
	var out []map[string]any
	if l, ok := in[key].([]any); ok {
		for _, x := range l {
			if m, ok := x.(map[string]any); ok {
				out = append(out, m)
			}
		}
		return out
	}
	if fallback != nil {
		out = append(out, fallback)
	}
	return out
}

func mcpCalls(in map[string]any, ev *event) []MCPCall {
	var out []MCPCall
	for _, m := range items(in, ev.MCP, "mcp") {
		if c := (MCPCall{Method: str(m, "method"), Tool: str(m, "tool")}); c.Method != "" && !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}

func graphqlOps(in map[string]any, ev *event) []GraphQLOp {
	var out []GraphQLOp
	for _, m := range items(in, ev.GraphQL, "graphql") {
		if o := (GraphQLOp{Type: str(m, "type"), Name: str(m, "name")}); o.Type != "" && !slices.Contains(out, o) {
			out = append(out, o)
		}
	}
	return out
}

func (d *Draft) sort() {
	for _, a := range d.Agents {
		// An HTTPS request was made inside an intercepted tunnel: its CONNECT is allowed too,
		// even when the log does not hold it.
		for _, r := range a.Requests {
			if e := (Endpoint{Host: r.Host, Port: r.Port}); r.Scheme == "https" && !slices.Contains(a.Connect, e) {
				a.Connect = append(a.Connect, e)
			}
		}
		slices.SortFunc(a.Connect, func(x, y Endpoint) int {
			if c := strings.Compare(x.Host, y.Host); c != 0 {
				return c
			}
			return x.Port - y.Port
		})
		slices.SortFunc(a.Requests, func(x, y *Rule) int {
			for _, c := range []int{strings.Compare(x.Host, y.Host), x.Port - y.Port, strings.Compare(x.Path, y.Path), strings.Compare(x.Method, y.Method), strings.Compare(x.Scheme, y.Scheme)} {
				if c != 0 {
					return c
				}
			}
			return 0
		})
		for _, r := range a.Requests {
			slices.Sort(r.Credentials)
			slices.SortFunc(r.MCP, func(x, y MCPCall) int { return strings.Compare(x.Method+"\x00"+x.Tool, y.Method+"\x00"+y.Tool) })
			slices.SortFunc(r.GraphQL, func(x, y GraphQLOp) int { return strings.Compare(x.Type+"\x00"+x.Name, y.Type+"\x00"+y.Name) })
		}
	}
}
