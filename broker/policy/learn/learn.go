// Package learn drafts a policy from an audit log of a monitor-mode run (`broker policy
// learn`): per agent, the hosts it connected to and the requests it made, with identifiers in
// paths generalised, the credentials it was granted, and what each request asked of the
// protocols the broker reads (CONTRACT §8): the MCP calls, the GraphQL operations by type and
// top-level field, the JSON-RPC methods.
//
// It reads, from each decision event's `input` (audit.include_input metadata or more):
// phase, agent.id, request.method, request.host, request.port, request.path, and, when
// present, input.mcp[] (method, tool, uri, prompt), input.graphql[] (type, fields, hash) and
// input.jsonrpc[] (method); the broker records these for every endpoint under its config's
// protocols while inputs are recorded, whatever the recording policy reads. From the event
// itself it reads the credentials granted (`credentials`, on events that were not
// would_deny). Header values, query values, bodies, MCP arguments and GraphQL operation
// names are never read into the draft.
package learn

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/capbroker/capbroker/broker/audit/ocsf"
	"github.com/go-json-experiment/json"
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

// Protocols whose meaning the broker reads into the input (input.mcp, input.graphql,
// input.jsonrpc), in the order a rule lists them.
var Protocols = []string{"graphql", "jsonrpc", "mcp"}

// Rule is one kind of request: a method on a host and port, on paths matching Path
// (segments of Wildcard match any one segment).
type Rule struct {
	Method      string   `json:"method"`
	Scheme      string   `json:"scheme"`
	Host        string   `json:"host"`
	Port        int      `json:"port"`
	Path        string   `json:"path"`
	Credentials []string `json:"credentials"`
	// Protocols are the protocols whose meaning the recording carried for requests on this
	// rule ("graphql", "jsonrpc", "mcp"): the draft then requires it in the input, so that
	// a broker that stopped reading it does not let every operation through.
	Protocols []string `json:"protocols,omitempty"`
	// MCP, GraphQL and JSONRPC are the only MCP calls, GraphQL fields and JSON-RPC methods
	// the rule allows. Empty: none (a request on the rule carrying any is denied).
	MCP     []MCPCall      `json:"mcp,omitempty"`
	GraphQL []GraphQLField `json:"graphql,omitempty"`
	JSONRPC []string       `json:"jsonrpc,omitempty"`
	Seen    []string       `json:"-"` // observed paths, for the tests
	// seenSemantic holds, for each of Seen, the protocol parts of the first input with that
	// path (input.mcp, input.graphql, input.jsonrpc), for the tests.
	seenSemantic []map[string]any
}

// MCPCall is an MCP message: its JSON-RPC method and, where the method has them, the tool
// (tools/call), the resource URI (resources/read, subscribe, unsubscribe) and the prompt
// (prompts/get); "" otherwise.
type MCPCall struct {
	Method string `json:"method"`
	Tool   string `json:"tool"`
	URI    string `json:"uri"`
	Prompt string `json:"prompt"`
}

// GraphQLField is what a GraphQL operation may run: one top-level field of an operation of a
// type ("query", "mutation", "subscription"), or, for a persisted query, its hash (Field "").
// An operation is allowed when each of its fields is learned for its type; its name does not
// count: a name says nothing about what runs.
type GraphQLField struct {
	Type  string `json:"type"`
	Field string `json:"field"`
	Hash  string `json:"hash"`
}

type event struct {
	Msg         string         `json:"msg"`
	Message     string         `json:"message"`
	WouldDeny   bool           `json:"would_deny"`
	Decision    string         `json:"decision"`
	Credentials []string       `json:"credentials"`
	Input       map[string]any `json:"input"`
}

// Options change what Read learns.
type Options struct {
	// SkipDenied leaves out the events whose request the recording policy denied (decision
	// "deny", or would_deny in monitor mode): the draft then allows only what was allowed.
	SkipDenied bool
}

// Read learns from an audit log, one JSON event a line (the broker's own, or OCSF: ocsf.Native);
// lines that are not decision events are skipped. It fails with ErrNoInput when no decision
// event carries its input.
func Read(r io.Reader, o Options) (*Draft, error) {
	d := &Draft{Agents: map[string]*Agent{}}
	br := bufio.NewReader(r)
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if native, ok := ocsf.Native(line); ok { // a log written with audit.format: ocsf
			line = native
		}
		if len(bytes.TrimSpace(line)) > 0 {
			// JSON v2: member names match exactly, a name given twice is an error; any other
			// member of the event is ignored. Not strictjson.Check: the line is the broker's
			// own, and the names it folds together legitimately differ in the maps it holds
			// (query and header names such as x-a and x_a); the members read here are the
			// broker's, matched exactly.
			var ev event
			if json.Unmarshal(line, &ev) == nil && (ev.Msg == "decision" || ev.Message == "decision") && ev.Input != nil {
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
	v, ok := m[k].(float64)
	return int(v), ok && v == float64(int(v))
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
	sem, err := semantic(in)
	if err != nil {
		return err
	}
	if !slices.Contains(found.Seen, path) {
		found.Seen = append(found.Seen, path)
		found.seenSemantic = append(found.seenSemantic, sem)
	}
	if ev.Decision == "allow" && !ev.WouldDeny {
		for _, c := range ev.Credentials {
			if !slices.Contains(found.Credentials, c) {
				found.Credentials = append(found.Credentials, c)
			}
		}
	}
	for p := range sem {
		found.Protocols = addOnce(found.Protocols, p)
	}
	for _, c := range mcpCalls(sem["mcp"]) {
		found.MCP = addOnce(found.MCP, c)
	}
	for _, f := range graphqlFields(sem["graphql"]) {
		found.GraphQL = addOnce(found.GraphQL, f)
	}
	for _, m := range jsonrpcMethods(sem["jsonrpc"]) {
		found.JSONRPC = addOnce(found.JSONRPC, m)
	}
	return nil
}

func addOnce[T comparable](l []T, x T) []T {
	if slices.Contains(l, x) {
		return l
	}
	return append(l, x)
}

// semantic returns the protocol parts of an input: each of input.mcp, input.graphql and
// input.jsonrpc it has, which must be lists of objects.
func semantic(in map[string]any) (map[string]any, error) {
	out := map[string]any{}
	for _, p := range Protocols {
		v, ok := in[p]
		if !ok {
			continue
		}
		l, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("input.%s is not a list", p)
		}
		for _, x := range l {
			if _, ok := x.(map[string]any); !ok {
				return nil, fmt.Errorf("an item of input.%s is not an object", p)
			}
		}
		out[p] = l
	}
	return out, nil
}

func objects(v any) []map[string]any {
	l, _ := v.([]any)
	out := make([]map[string]any, 0, len(l))
	for _, x := range l {
		out = append(out, x.(map[string]any)) // semantic checked each is one
	}
	return out
}

func mcpCalls(v any) []MCPCall {
	var out []MCPCall
	for _, m := range objects(v) {
		out = addOnce(out, MCPCall{Method: str(m, "method"), Tool: str(m, "tool"), URI: str(m, "uri"), Prompt: str(m, "prompt")})
	}
	return out
}

// graphqlFields returns what each operation runs: a persisted query's hash, or each of its
// top-level fields under its type.
func graphqlFields(v any) []GraphQLField {
	var out []GraphQLField
	for _, m := range objects(v) {
		t := str(m, "type")
		if t == "persisted" {
			out = addOnce(out, GraphQLField{Type: t, Hash: str(m, "hash")})
			continue
		}
		fields, _ := m["fields"].([]any)
		if len(fields) == 0 {
			fields = []any{""} // nothing to run: learned as such, so that the draft allows it again
		}
		for _, f := range fields {
			if name, ok := f.(string); ok {
				out = addOnce(out, GraphQLField{Type: t, Field: name})
			}
		}
	}
	return out
}

func jsonrpcMethods(v any) []string {
	var out []string
	for _, m := range objects(v) {
		out = addOnce(out, str(m, "method"))
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
			slices.Sort(r.Protocols)
			slices.SortFunc(r.MCP, func(x, y MCPCall) int {
				return strings.Compare(strings.Join([]string{x.Method, x.Tool, x.URI, x.Prompt}, "\x00"), strings.Join([]string{y.Method, y.Tool, y.URI, y.Prompt}, "\x00"))
			})
			slices.SortFunc(r.GraphQL, func(x, y GraphQLField) int {
				return strings.Compare(x.Type+"\x00"+x.Field+"\x00"+x.Hash, y.Type+"\x00"+y.Field+"\x00"+y.Hash)
			})
			slices.Sort(r.JSONRPC)
		}
	}
}
