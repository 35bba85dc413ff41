package policy

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/capbroker/capbroker/broker/wire/strictjson"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/open-policy-agent/opa/v1/ast"
)

// Phases of a decision.
const (
	PhaseConnect = "connect"
	PhaseRequest = "request"
	// PhaseSSH decides a git command over SSH (CONTRACT §8b): input.ssh says what it does.
	PhaseSSH = "ssh"
)

// Input is the policy input (CONTRACT §4).
type Input struct {
	Phase    string
	AgentID  string
	Labels   map[string]string
	SourceIP string
	// Mode is input.source.mode: "explicit" (the agent asked the proxy) or "transparent"
	// (its connection was redirected to the broker). Empty is "explicit".
	Mode   string
	Method string
	Scheme string
	Host   string
	Port   int
	// Path is the normalised path, which the broker sends upstream: dot-segments removed,
	// escapes of unreserved characters decoded, other escapes' hex upper-case (RFC 3986
	// §6.2.2). RawPath is the path as the agent sent it.
	Path    string
	RawPath string
	Query   map[string][]string
	Headers map[string]string // lower-case names, credential-bearing headers already removed
	// ReadHeaders, when set, supplies Headers. Like ReadBody, the Engine calls it only when
	// the policy deciding can see them: no shipped policy reads a header, and building the map
	// was a good part of building the input.
	ReadHeaders func() map[string]string
	Body        any // parsed JSON body, or nil
	BodySize    int64
	Credentials []string // configured credentials whose hosts match Host
	// ReadBody, when set, supplies the body as JSON text (nil when it is not JSON) and
	// BodySize. The Engine calls it (once) only when the policy deciding can see them, so a
	// request whose policy never looks at its body has it neither buffered nor parsed. The
	// text becomes Body only when the whole input is needed: the decision cache reads just
	// the members it keys on (an LLM request's model, not its prompt).
	ReadBody func() (text []byte, size int64)
	// AWS, when set, is input.aws: what an AWS request does (service, region, operation,
	// bucket, key), for requests to hosts an aws_sigv4 credential is bound to.
	AWS map[string]any
	// SSH, when set, is input.ssh (phase "ssh", CONTRACT §8b): {host, port, user, service,
	// repository, refs}.
	SSH map[string]any
	// ReadUsage, when set, supplies input.usage: the counters of the budgets that apply to
	// the agent. The Engine calls it only when the policy refers to input.usage.
	ReadUsage func() map[string]any
	// ReadMCP and ReadJSONRPC, when set, derive input.mcp and input.jsonrpc from the body's
	// text (nil when there is no JSON body), for a request to an endpoint configured under
	// protocols (broker/rpc). The Engine calls them only when the policy refers to those
	// parts; an error (a body that is not JSON-RPC) is a deny with the error as its reason.
	ReadMCP, ReadJSONRPC func(text []byte) ([]any, error)

	// ReadGraphQL, when set, supplies input.graphql (CONTRACT §8) from the body's text (nil
	// when there is none), for a request to a GraphQL endpoint. The Engine calls it only when
	// the policy refers to input.graphql; an error denies the request, with its text as the
	// reason.
	ReadGraphQL func(body []byte) ([]any, error)

	graphql      []any          // from ReadGraphQL
	graphqlErr   error          // ReadGraphQL's error
	usage        map[string]any // from ReadUsage
	mcp, jsonrpc []any          // from ReadMCP, ReadJSONRPC
	// mcpValue, jsonrpcValue are mcp and jsonrpc as the evaluator's values, converted once:
	// the cache's key and a miss's evaluation both read them.
	mcpValue, jsonrpcValue ast.Value
	bodyText               []byte // from ReadBody, not yet parsed into Body
	// bodyMembers, when set, are the only paths into the body the policy deciding reads
	// (decisionCache.bodyMembers): astValue builds a body of these alone from bodyText.
	bodyMembers []ast.Ref
	bodyChecked bool  // bodyText has been checked (strictjson.Check), its answer in bodyErr
	bodyErr     error // strictjson.Check's error for bodyText
}

// ErrBodyNotJSON is wrapped by Decide's error for a body sent as JSON, which the policy reads,
// that is not valid JSON: a server's lenient parser might read what the policy saw as null.
var ErrBodyNotJSON = errors.New("the request body is sent as JSON and is not valid JSON")

// textValid reports whether bodyText is one JSON value that every server reads the same way
// (strictjson.Check), checking it once per request: the decision cache's key and a cache
// miss's evaluation both look into it. A body that is not is null to the policy; Decide
// refuses it first (checkBody) when the policy reads the body.
func (in *Input) textValid() bool {
	if !in.bodyChecked {
		in.bodyChecked, in.bodyErr = true, strictjson.Check(in.bodyText)
	}
	return in.bodyErr == nil
}

// checkBody is the error that refuses a request whose body the policy reads: a body whose
// members a server may read otherwise than the policy (strictjson.ErrAmbiguous), or one sent
// as JSON that is not JSON (ErrBodyNotJSON). A body of whitespace alone is no body (null).
func (in *Input) checkBody() error {
	if in.bodyText == nil || in.textValid() {
		return nil
	}
	if errors.Is(in.bodyErr, strictjson.ErrAmbiguous) {
		return fmt.Errorf("the request body is ambiguous: %w", in.bodyErr)
	}
	if len(bytes.Trim(in.bodyText, " \t\r\n")) == 0 {
		return nil
	}
	return fmt.Errorf("%w (%v)", ErrBodyNotJSON, in.bodyErr)
}

// loadBody reads the body's text and size from ReadBody, if that has not been done.
func (in *Input) loadBody() {
	if in.ReadBody != nil {
		in.bodyText, in.BodySize = in.ReadBody()
		in.ReadBody = nil
	}
}

// loadHeaders fills Headers from ReadHeaders, if that has not been done.
func (in *Input) loadHeaders() {
	if in.ReadHeaders != nil {
		in.Headers, in.ReadHeaders = in.ReadHeaders(), nil
	}
}

// loadUsage fills usage from ReadUsage, if that has not been done.
func (in *Input) loadUsage() {
	if in.ReadUsage != nil {
		in.usage, in.ReadUsage = in.ReadUsage(), nil
	}
}

// loadRPC fills input.mcp (when mcp) and input.jsonrpc (when jsonrpc) from ReadMCP and
// ReadJSONRPC, reading the body first.
func (in *Input) loadRPC(mcp, jsonrpc bool) error {
	if !(mcp && in.ReadMCP != nil || jsonrpc && in.ReadJSONRPC != nil) {
		return nil
	}
	in.loadBody()
	text := in.bodyText
	if mcp && in.ReadMCP != nil {
		l, err := in.ReadMCP(text)
		if err != nil {
			return err
		}
		v, err := ast.InterfaceToValue(l)
		if err != nil {
			return err
		}
		in.mcp, in.mcpValue, in.ReadMCP = l, v, nil
	}
	if jsonrpc && in.ReadJSONRPC != nil {
		l, err := in.ReadJSONRPC(text)
		if err != nil {
			return err
		}
		v, err := ast.InterfaceToValue(l)
		if err != nil {
			return err
		}
		in.jsonrpc, in.jsonrpcValue, in.ReadJSONRPC = l, v, nil
	}
	return nil
}

// MCP returns input.mcp, if the policy deciding has read it.
func (in *Input) MCP() []any { return in.mcp }

// BodyString returns the top-level string member name of a JSON object body (an LLM
// request's model), reading the body as the policy would (ReadBody) if it has not been read;
// "" when there is none. The text is scanned, not decoded.
func (in *Input) BodyString(name string) string {
	in.loadBody()
	switch {
	case in.bodyText != nil:
		if !in.textValid() {
			return ""
		}
		text := bytes.Trim(in.bodyText, " \t\r\n")
		if text[0] != '{' {
			return ""
		}
		member, ok := objectMember(text, name)
		if !ok {
			return ""
		}
		if s, ok := plainString(member); ok {
			return string(s)
		}
		return unquote(member)
	case in.Body != nil:
		m, _ := in.Body.(map[string]any)
		s, _ := m[name].(string)
		return s
	}
	return ""
}

// parseBody turns the text loadBody read into Body: nil when it is not valid JSON.
func (in *Input) parseBody() {
	if in.bodyText != nil {
		in.Body = parseJSON(in.bodyText)
		in.bodyText = nil
	}
}

// parseJSON decodes text (strictjson.Value: numbers as their text, so that a number no float64
// holds does not leave the body null): nil when it is not JSON every server reads the same way.
func parseJSON(text []byte) any {
	v, err := strictjson.Value(text)
	if err != nil {
		return nil
	}
	return v
}

// unquote returns the string a JSON string's text (valid, from a checked body) decodes to, or
// "" when it is not a string.
func unquote(text []byte) string {
	s, err := jsontext.AppendUnquote(nil, text)
	if err != nil {
		return ""
	}
	return string(s)
}

// value builds the JSON-shaped document the policy sees as input.
func (in *Input) value() map[string]any {
	in.parseBody()
	labels := make(map[string]any, len(in.Labels))
	for k, v := range in.Labels {
		labels[k] = v
	}
	creds := make([]any, len(in.Credentials))
	for i, c := range in.Credentials {
		creds[i] = c
	}
	req := map[string]any{"method": in.Method, "host": in.Host, "port": in.Port}
	if in.Phase == PhaseRequest {
		query := make(map[string]any, len(in.Query))
		for k, vs := range in.Query {
			l := make([]any, len(vs))
			for i, v := range vs {
				l[i] = v
			}
			query[k] = l
		}
		headers := make(map[string]any, len(in.Headers))
		for k, v := range in.Headers {
			headers[k] = v
		}
		req["scheme"] = in.Scheme
		req["path"] = in.Path
		req["raw_path"] = in.RawPath
		req["query"] = query
		req["headers"] = headers
		req["body"] = in.Body
		req["body_size"] = in.BodySize
	}
	doc := map[string]any{
		"phase":       in.Phase,
		"agent":       map[string]any{"id": in.AgentID, "labels": labels},
		"source":      map[string]any{"ip": in.SourceIP, "mode": in.mode()},
		"request":     req,
		"credentials": creds,
	}
	if in.AWS != nil {
		doc["aws"] = in.AWS
	}
	if in.SSH != nil {
		doc["ssh"] = in.SSH
	}
	if in.usage != nil {
		doc["usage"] = in.usage
	}
	if in.graphql != nil {
		doc["graphql"] = in.graphql
	}
	if in.mcp != nil {
		doc["mcp"] = in.mcp
	}
	if in.jsonrpc != nil {
		doc["jsonrpc"] = in.jsonrpc
	}
	return doc
}

// Document returns the input as the policy sees it, for the audit log (audit.include_input),
// with the headers read, and the body when withBody is set. Without it the body is null here,
// neither parsed nor, when the policy did not read it, read: it goes on streaming.
func (in *Input) Document(withBody bool) map[string]any {
	in.loadHeaders()
	if !withBody {
		// input.mcp's arguments are the body's: left out with it.
		text, body, mcp := in.bodyText, in.Body, in.mcp
		in.bodyText, in.Body, in.mcp = nil, nil, withoutArguments(in.mcp)
		defer func() { in.bodyText, in.Body, in.mcp = text, body, mcp }()
		return in.value()
	}
	in.loadBody()
	return in.value()
}

// withoutArguments is input.mcp with each item's arguments empty.
func withoutArguments(l []any) []any {
	if l == nil {
		return nil
	}
	out := make([]any, len(l))
	for i, item := range l {
		m, ok := item.(map[string]any)
		if !ok {
			out[i] = item
			continue
		}
		c := make(map[string]any, len(m))
		for k, v := range m {
			c[k] = v
		}
		if _, ok := c["arguments"]; ok {
			c["arguments"] = map[string]any{}
		}
		out[i] = c
	}
	return out
}

// astValue builds the same document as value, directly as the evaluator's value: converting a
// map[string]any by reflection was the largest single cost of a decision.
func (in *Input) astValue() (ast.Value, error) {
	pruned, isPruned := in.prunedBody()
	if !isPruned {
		in.parseBody()
	}
	labels := make([][2]*ast.Term, 0, len(in.Labels))
	for k, v := range in.Labels {
		labels = append(labels, [2]*ast.Term{ast.StringTerm(k), ast.StringTerm(v)})
	}
	creds := make([]*ast.Term, len(in.Credentials))
	for i, c := range in.Credentials {
		creds[i] = ast.StringTerm(c)
	}
	req := [][2]*ast.Term{
		ast.Item(ast.StringTerm("method"), ast.StringTerm(in.Method)),
		ast.Item(ast.StringTerm("host"), ast.StringTerm(in.Host)),
		ast.Item(ast.StringTerm("port"), ast.IntNumberTerm(in.Port)),
	}
	if in.Phase == PhaseRequest {
		query := make([][2]*ast.Term, 0, len(in.Query))
		for k, vs := range in.Query {
			l := make([]*ast.Term, len(vs))
			for i, v := range vs {
				l[i] = ast.StringTerm(v)
			}
			query = append(query, ast.Item(ast.StringTerm(k), ast.ArrayTerm(l...)))
		}
		headers := make([][2]*ast.Term, 0, len(in.Headers))
		for k, v := range in.Headers {
			headers = append(headers, ast.Item(ast.StringTerm(k), ast.StringTerm(v)))
		}
		body := ast.Value(ast.Null{})
		if isPruned {
			body = pruned
		} else if in.Body != nil {
			var err error
			if body, err = ast.InterfaceToValue(in.Body); err != nil {
				return nil, err
			}
		}
		req = append(req,
			ast.Item(ast.StringTerm("scheme"), ast.StringTerm(in.Scheme)),
			ast.Item(ast.StringTerm("path"), ast.StringTerm(in.Path)),
			ast.Item(ast.StringTerm("raw_path"), ast.StringTerm(in.RawPath)),
			ast.Item(ast.StringTerm("query"), ast.ObjectTerm(query...)),
			ast.Item(ast.StringTerm("headers"), ast.ObjectTerm(headers...)),
			ast.Item(ast.StringTerm("body"), ast.NewTerm(body)),
			ast.Item(ast.StringTerm("body_size"), ast.NumberTerm(json.Number(strconv.FormatInt(in.BodySize, 10)))),
		)
	}
	var more [][2]*ast.Term
	if in.AWS != nil {
		v, err := ast.InterfaceToValue(in.AWS)
		if err != nil {
			return nil, err
		}
		more = append(more, ast.Item(ast.StringTerm("aws"), ast.NewTerm(v)))
	}
	if in.SSH != nil {
		v, err := ast.InterfaceToValue(in.SSH)
		if err != nil {
			return nil, err
		}
		more = append(more, ast.Item(ast.StringTerm("ssh"), ast.NewTerm(v)))
	}
	if in.usage != nil {
		v, err := ast.InterfaceToValue(in.usage)
		if err != nil {
			return nil, err
		}
		more = append(more, ast.Item(ast.StringTerm("usage"), ast.NewTerm(v)))
	}
	if in.graphql != nil {
		v, err := ast.InterfaceToValue(in.graphql)
		if err != nil {
			return nil, err
		}
		more = append(more, ast.Item(ast.StringTerm("graphql"), ast.NewTerm(v)))
	}
	if in.mcpValue != nil {
		more = append(more, ast.Item(ast.StringTerm("mcp"), ast.NewTerm(in.mcpValue)))
	}
	if in.jsonrpcValue != nil {
		more = append(more, ast.Item(ast.StringTerm("jsonrpc"), ast.NewTerm(in.jsonrpcValue)))
	}
	return ast.NewObject(append([][2]*ast.Term{
		ast.Item(ast.StringTerm("phase"), ast.StringTerm(in.Phase)),
		ast.Item(ast.StringTerm("agent"), ast.ObjectTerm(
			ast.Item(ast.StringTerm("id"), ast.StringTerm(in.AgentID)),
			ast.Item(ast.StringTerm("labels"), ast.ObjectTerm(labels...)),
		)),
		ast.Item(ast.StringTerm("source"), ast.ObjectTerm(
			ast.Item(ast.StringTerm("ip"), ast.StringTerm(in.SourceIP)),
			ast.Item(ast.StringTerm("mode"), ast.StringTerm(in.mode())),
		)),
		ast.Item(ast.StringTerm("request"), ast.ObjectTerm(req...)),
		ast.Item(ast.StringTerm("credentials"), ast.ArrayTerm(creds...)),
	}, more...)...), nil
}

// mode is input.source.mode.
func (in *Input) mode() string {
	if in.Mode == "" {
		return "explicit"
	}
	return in.Mode
}

// prunedBody returns the body as the evaluator needs it when the policy reads only
// bodyMembers of it: an object of those members, each found in bodyText without decoding the
// rest (an LLM request's model, not its prompt). The body's text stays as it is, for Document.
// It reports false when the body must be parsed whole: no bodyMembers, or a body that is not
// a JSON object.
func (in *Input) prunedBody() (ast.Value, bool) {
	if in.bodyMembers == nil || in.bodyText == nil {
		return nil, false
	}
	if !in.textValid() {
		return ast.Null{}, true
	}
	if t := bytes.TrimLeft(in.bodyText, " \t\r\n"); t[0] != '{' {
		return nil, false
	}
	obj := ast.NewObject()
	for _, m := range in.bodyMembers {
		f, err := findInValidText(in.bodyText, m, nil)
		if err != nil {
			continue // no such member: undefined, as in the whole body
		}
		setMember(obj, m, f.value())
	}
	return obj, true
}

// setMember sets the member at path (object member names) in obj to v, making the objects on
// the way. Paths from minimalPrefixes never lead through one another's values.
func setMember(obj ast.Object, path ast.Ref, v ast.Value) {
	for _, k := range path[:len(path)-1] {
		if t := obj.Get(k); t != nil {
			if next, ok := t.Value.(ast.Object); ok {
				obj = next
				continue
			}
		}
		o := ast.NewObject()
		obj.Insert(k, ast.NewTerm(o))
		obj = o
	}
	obj.Insert(path[len(path)-1], ast.NewTerm(v))
}

// errNoValue is find's answer for a path the input has no value at.
var errNoValue = errors.New("no value at this path")

// found is a value find returns: a string as it is, any other value as an ast.Value. The
// decision cache reads several strings of every request, and making each an ast.Value (an
// interface) would allocate.
type found struct {
	s string
	// b, when not nil, is the string instead of s: the text of a JSON string without escapes
	// in a request body (findInValidText), which the cache key copies without a conversion.
	b []byte
	// num, when isNum, is the value: an integer (the request's port).
	num   int64
	isNum bool
	v     ast.Value // nil: the value is s, b or num
}

// value is f as an ast.Value.
func (f found) value() ast.Value {
	switch {
	case f.v != nil:
		return f.v
	case f.isNum:
		return ast.Number(strconv.FormatInt(f.num, 10))
	case f.b != nil:
		return ast.String(f.b)
	}
	return ast.String(f.s)
}

// str returns the string f is, if it is one.
func (f found) str() (string, bool) {
	switch {
	case f.v != nil:
		s, ok := f.v.(ast.String)
		return string(s), ok
	case f.isNum:
		return "", false
	case f.b != nil:
		return string(f.b), true
	}
	return f.s, true
}

// appendKey appends f as the decision cache keys it (decisionCache.key): a string as 's', its
// length and its bytes; any other value as 'v' and its text as a complete Rego term, then a
// NUL. It writes what appending f.value() would, without making the value.
func (f found) appendKey(buf []byte) ([]byte, error) {
	switch {
	case f.v == nil && f.isNum:
		// An integer's term is its decimal digits, as ast.Number's text is.
		return append(strconv.AppendInt(append(buf, 'v'), f.num, 10), 0), nil
	case f.v == nil && f.b != nil:
		return appendKeyString(buf, f.b), nil // without str's conversion
	}
	if s, ok := f.str(); ok {
		return appendKeyString(buf, s), nil
	}
	return appendTerm(append(buf, 'v'), f.v)
}

// appendKeyString appends a string as the decision cache keys one: 's', its length, its bytes.
func appendKeyString[S string | []byte](buf []byte, s S) []byte {
	buf = append(buf, 's')
	buf = binary.AppendUvarint(buf, uint64(len(s)))
	return append(buf, s...)
}

// refName is a term of a ref as find reads it: the string it is, if it is one.
type refName struct {
	s  string
	ok bool
}

// namesOf returns the terms of r as find reads them. The decision cache keeps those of its
// paths, built once, side by side: find reads them for every request, and the terms of a
// compiled ref, each a pointer to a Term among the policy's, cost a cache miss each.
func namesOf(r ast.Ref) []refName {
	out := make([]refName, len(r))
	for i, t := range r {
		if s, ok := t.Value.(ast.String); ok {
			out[i] = refName{string(s), true}
		}
	}
	return out
}

// find returns the value astValue().Find(path[1:]) would, building only the part of the input
// the path leads into (the decision cache reads a few fields of every request).
func (in *Input) find(path ast.Ref) (found, error) {
	return in.findNamed(path, namesOf(path))
}

// findNamed is find for a path whose names (namesOf) are known.
func (in *Input) findNamed(path ast.Ref, names []refName) (found, error) {
	key := func(i int) string {
		if i < len(names) {
			return names[i].s // "" for a term that is not a string
		}
		return ""
	}
	request := in.Phase == PhaseRequest
	switch key(1) {
	case "phase":
		return findString(in.Phase, path[2:])
	case "usage":
		if in.usage == nil {
			return found{}, errNoValue
		}
		v, err := ast.InterfaceToValue(in.usage)
		if err != nil {
			return found{}, err
		}
		return findIn(v, path[2:])
	case "graphql":
		if in.graphql == nil {
			return found{}, errNoValue
		}
		v, err := ast.InterfaceToValue(in.graphql)
		if err != nil {
			return found{}, err
		}
		return findIn(v, path[2:])
	case "mcp", "jsonrpc":
		v := in.mcpValue
		if key(1) == "jsonrpc" {
			v = in.jsonrpcValue
		}
		if v == nil {
			return found{}, errNoValue
		}
		return findIn(v, path[2:])
	case "aws", "ssh":
		m := in.AWS
		if key(1) == "ssh" {
			m = in.SSH
		}
		if m == nil {
			return found{}, errNoValue
		}
		v, err := ast.InterfaceToValue(m)
		if err != nil {
			return found{}, err
		}
		return findIn(v, path[2:])
	case "agent":
		switch key(2) {
		case "id":
			return findString(in.AgentID, path[3:])
		case "labels":
			if len(path) > 3 {
				v, ok := in.Labels[key(3)]
				if !ok {
					return found{}, errNoValue
				}
				return findString(v, path[4:])
			}
		}
	case "request":
		switch k := key(2); {
		case k == "method":
			return findString(in.Method, path[3:])
		case k == "host":
			return findString(in.Host, path[3:])
		case k == "port" && len(path) == 3:
			return found{num: int64(in.Port), isNum: true}, nil
		case k == "port":
			return findIn(ast.Number(strconv.Itoa(in.Port)), path[3:])
		case !request && requestOnly[k]:
			return found{}, errNoValue
		case k == "scheme":
			return findString(in.Scheme, path[3:])
		case k == "path":
			return findString(in.Path, path[3:])
		case k == "raw_path":
			return findString(in.RawPath, path[3:])
		case k == "headers" && len(path) > 3:
			v, ok := in.Headers[key(3)]
			if !ok {
				return found{}, errNoValue
			}
			return findString(v, path[4:])
		case k == "query" && len(path) > 3:
			vs, ok := in.Query[key(3)]
			if !ok {
				return found{}, errNoValue
			}
			l := make([]*ast.Term, len(vs))
			for i, v := range vs {
				l[i] = ast.StringTerm(v)
			}
			return findIn(ast.NewArray(l...), path[4:])
		case k == "body" && in.bodyText != nil:
			if !in.textValid() {
				return findIn(ast.Null{}, path[3:])
			}
			return findInValidText(in.bodyText, path[3:], names[3:])
		case k == "body":
			body, rest := in.Body, path[3:]
			for len(rest) > 0 { // walk the parsed JSON while the path names object members
				m, ok := body.(map[string]any)
				s, isKey := rest[0].Value.(ast.String)
				if !ok || !isKey {
					break
				}
				if body, ok = m[string(s)]; !ok {
					return found{}, errNoValue
				}
				rest = rest[1:]
			}
			return findInJSON(body, rest)
		}
	}
	if k := key(1); k != "" && !inputMembers[k] {
		// A member no HTTP-side input has (input.postgres, which the Postgres front door's
		// own input holds): absent, without building the whole input to find that out.
		return found{}, errNoValue
	}
	v, err := in.astValue() // any other path: build the whole input
	if err != nil {
		return found{}, err
	}
	return findIn(v, path[1:])
}

// inputMembers are the members astValue can give the input (TestInputMembers).
var inputMembers = map[string]bool{
	"phase": true, "agent": true, "source": true, "request": true, "credentials": true,
	"aws": true, "ssh": true, "usage": true, "graphql": true, "mcp": true, "jsonrpc": true,
}

// findInValidText is find for a path into a body still held as JSON text, which textValid
// has accepted. It walks the objects on the way without decoding them and decodes only the
// value found, so an LLM request's prompt beside its model is scanned, never built. The
// answers are those of the parsed body. names, when not nil, are rest's (namesOf).
func findInValidText(text []byte, rest ast.Ref, names []refName) (found, error) {
	if names == nil {
		names = namesOf(rest)
	}
	text = bytes.Trim(text, " \t\r\n") // the whitespace around a value is no part of it
	for len(rest) > 0 && text[0] == '{' {
		if !names[0].ok {
			break
		}
		member, ok := objectMember(text, names[0].s)
		if !ok {
			return found{}, errNoValue
		}
		text, rest, names = member, rest[1:], names[1:]
	}
	if s, ok := plainString(text); ok {
		if len(rest) == 0 && s != nil {
			return found{b: s}, nil // an LLM request's model, say: no decoder, no copy
		}
		return findString(string(s), rest)
	}
	return findInJSON(parseJSON(text), rest)
}

// findInJSON is findIn for a value decoded from JSON (nil is null).
func findInJSON(v any, rest ast.Ref) (found, error) {
	if v == nil {
		return findIn(ast.Null{}, rest)
	}
	value, err := ast.InterfaceToValue(v)
	if err != nil {
		return found{}, err
	}
	return findIn(value, rest)
}

// plainString returns the bytes between the quotes of a JSON string that has no escapes and
// is valid UTF-8: they are the string it decodes to, as they stand.
func plainString(text []byte) ([]byte, bool) {
	if len(text) < 2 || text[0] != '"' {
		return nil, false
	}
	inner := text[1 : len(text)-1]
	if bytes.IndexByte(inner, '\\') >= 0 || !utf8.Valid(inner) {
		return nil, false
	}
	return inner, true
}

// objectMember returns the text of the member named key in obj, a JSON object textValid has
// accepted (so no other member has its name).
func objectMember(obj []byte, key string) (member []byte, found bool) {
	i := skipSpace(obj, 1)
	for obj[i] != '}' {
		nameEnd := skipString(obj, i)
		name := obj[i:nameEnd]
		start := skipSpace(obj, skipSpace(obj, nameEnd)+1) // past the colon
		end := skipValue(obj, start)
		if memberNamed(name, key) {
			member, found = obj[start:end], true
		}
		if i = skipSpace(obj, end); obj[i] == ',' {
			i = skipSpace(obj, i+1)
		}
	}
	return member, found
}

// memberNamed reports whether name, a member name as JSON text, decodes to key.
func memberNamed(name []byte, key string) bool {
	if s, ok := plainString(name); ok {
		return string(s) == key // compared without a copy
	}
	return unquote(name) == key
}

// skipString returns the index just past the JSON string starting at b[i], in text that
// textValid accepted: the checks the text has passed are not made again.
func skipString(b []byte, i int) int {
	for i++; ; {
		for plainInString[b[i]] { // the run up to a quote or a backslash
			i++
		}
		switch b[i] {
		case '"':
			return i + 1
		case '\\':
			i += 2 // the escaped byte; the hex digits of a \u escape are plain
		default:
			i++
		}
	}
}

// skipValue returns the index just past the JSON value starting at b[i].
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
	default: // a number, true, false or null
		for i < len(b) && !strings.ContainsRune(",}] \t\r\n", rune(b[i])) {
			i++
		}
		return i
	}
}

// skipSpace returns the index of the first byte of b at or after i that is not JSON
// whitespace, or len(b).
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// plainInString marks the bytes that stand for themselves inside a JSON string: all but the
// quote, the backslash and the control characters.
var plainInString = func() (t [256]bool) {
	for c := range t {
		t[c] = c >= 0x20 && c != '"' && c != '\\'
	}
	return t
}()

// requestOnly are the members of input.request in the request phase only.
var requestOnly = map[string]bool{"scheme": true, "path": true, "raw_path": true, "query": true, "headers": true, "body": true, "body_size": true}

// findIn is v.Find(rest), and v itself for an empty rest.
func findIn(v ast.Value, rest ast.Ref) (found, error) {
	if len(rest) == 0 {
		return found{v: v}, nil
	}
	v, err := v.Find(rest)
	return found{v: v}, err
}

// findString is findIn for a string.
func findString(s string, rest ast.Ref) (found, error) {
	if len(rest) == 0 {
		return found{s: s}, nil
	}
	return findIn(ast.String(s), rest)
}
