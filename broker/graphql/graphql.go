// Package graphql says what a GraphQL request executes (CONTRACT §8, input.graphql): the type,
// name and top-level fields of each operation, read with a GraphQL parser (the document only:
// the broker has no schema). A request the broker cannot read is an error, never "no
// operation": the policy is refused the request rather than shown nothing.
package graphql

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"strings"

	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/parser"
)

// Operation is one item of input.graphql.
type Operation struct {
	// Type is "query", "mutation", "subscription", or "persisted" for a persisted query sent
	// by its hash alone (its document is the server's: the broker cannot see it).
	Type string
	// Name is the operation's name (operationName for a persisted query), or "".
	Name string
	// Fields are the top-level fields the operation selects (by name, not alias), fragments
	// spread at the top level resolved, in order, each once. Empty for a persisted query.
	Fields []string
	// Hash is a persisted query's hash or document id.
	Hash string
}

// Value is o as the policy sees it.
func (o Operation) Value() map[string]any {
	fields := make([]any, len(o.Fields))
	for i, f := range o.Fields {
		fields[i] = f
	}
	v := map[string]any{"type": o.Type, "name": o.Name, "fields": fields}
	if o.Type == "persisted" {
		v["hash"] = o.Hash
	}
	return v
}

// Values is ops as the policy sees them: a list of Value.
func Values(ops []Operation) []any {
	l := make([]any, len(ops))
	for i, o := range ops {
		l[i] = o.Value()
	}
	return l
}

// Error is a request that claims to be GraphQL and cannot be read as such. Its message is the
// reason given to the agent.
type Error struct{ msg string }

func (e *Error) Error() string { return e.msg }

func errorf(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if len(msg) > maxReason {
		msg = msg[:maxReason] + "..."
	}
	return &Error{msg}
}

// maxReason bounds a reason's length: a parse error quotes the agent's text.
const maxReason = 300

// maxTokens bounds the parser's work on one document (the body is already bounded by
// policy.max_body_bytes).
const maxTokens = 200_000

// Request is what Describe reads of an HTTP request.
type Request struct {
	ContentType string
	// Query is the URL's query parameters.
	Query map[string][]string
	// Body is the request body; empty when there is none.
	Body []byte
}

// urlParams are the parameters a GraphQL-over-HTTP server reads from the URL.
var urlParams = []string{"query", "operationName", "variables", "extensions", "documentId", "id"}

// Describe returns the operations r executes: for a batch (a JSON array), one per item. A
// request carrying no GraphQL parameters at all has none. An error is an *Error.
func Describe(r Request) ([]Operation, error) {
	body := bytes.TrimSpace(r.Body)
	inURL := false
	for _, p := range urlParams {
		if _, ok := r.Query[p]; ok {
			inURL = true
		}
	}
	if isGraphQLType(r.ContentType) {
		if len(body) == 0 {
			return nil, errorf("the GraphQL request has an application/graphql content type and no document")
		}
		for _, p := range []string{"query", "extensions", "documentId", "id"} {
			if _, ok := r.Query[p]; ok {
				return nil, errorf("the GraphQL request has a document in both the URL (%s) and the body", p)
			}
		}
		if n := len(r.Query["operationName"]); n > 1 {
			return nil, errorf("the GraphQL request has the URL parameter operationName %d times", n)
		}
		op, err := operation(string(body), first(r.Query, "operationName"))
		if err != nil {
			return nil, err
		}
		return []Operation{op}, nil
	}
	if len(body) == 0 {
		if !inURL {
			return nil, nil
		}
		item := map[string]any{}
		for _, p := range urlParams {
			if vs, ok := r.Query[p]; ok {
				if len(vs) != 1 {
					return nil, errorf("the GraphQL request has the URL parameter %s %d times", p, len(vs))
				}
				item[p] = vs[0]
			}
		}
		if ext, ok := item["extensions"].(string); ok {
			var v any
			if err := json.Unmarshal([]byte(ext), &v); err != nil {
				return nil, errorf("the GraphQL request's extensions parameter is not JSON: %v", err)
			}
			item["extensions"] = v
		}
		op, err := describeItem(item)
		if err != nil {
			return nil, err
		}
		return []Operation{op}, nil
	}
	if inURL {
		return nil, errorf("the GraphQL request has parameters in both the URL and the body")
	}
	// Any other content type is read as JSON, as servers do (GitHub's documented curl
	// example sends its JSON as a form).
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	v, err := readValue(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errorf("the GraphQL request body is not JSON: text after the value")
	}
	switch v := v.(type) {
	case map[string]any:
		op, err := describeItem(v)
		if err != nil {
			return nil, err
		}
		return []Operation{op}, nil
	case []any:
		if len(v) == 0 {
			return nil, errorf("the GraphQL request is an empty batch")
		}
		ops := make([]Operation, 0, len(v))
		for i, e := range v {
			item, ok := e.(map[string]any)
			if !ok {
				return nil, errorf("the GraphQL batch's item %d is not an object", i)
			}
			op, err := describeItem(item)
			if err != nil {
				return nil, errorf("the GraphQL batch's item %d: %v", i, err)
			}
			ops = append(ops, op)
		}
		return ops, nil
	}
	return nil, errorf("the GraphQL request body is neither an object nor a batch (array)")
}

// describeItem reads one request object: {query, operationName, variables, extensions}, or a
// persisted query's {extensions.persistedQuery.sha256Hash} or {documentId} or {id}.
func describeItem(item map[string]any) (Operation, error) {
	name, err := optString(item, "operationName")
	if err != nil {
		return Operation{}, err
	}
	query, err := optString(item, "query")
	if err != nil {
		return Operation{}, err
	}
	if query != "" {
		return operation(query, name)
	}
	hash := ""
	if ext, ok := item["extensions"].(map[string]any); ok {
		if pq, ok := ext["persistedQuery"].(map[string]any); ok {
			hash, _ = pq["sha256Hash"].(string)
		}
	}
	for _, k := range []string{"documentId", "id"} {
		if hash != "" {
			break
		}
		if hash, err = optString(item, k); err != nil {
			return Operation{}, err
		}
	}
	if hash == "" {
		return Operation{}, errorf("the GraphQL request has no query (and no persisted query hash)")
	}
	return Operation{Type: "persisted", Name: name, Hash: hash, Fields: []string{}}, nil
}

// optString returns item[k], a string, null or absent ("").
func optString(item map[string]any, k string) (string, error) {
	switch v := item[k].(type) {
	case nil:
		return "", nil
	case string:
		return v, nil
	}
	return "", errorf("the GraphQL request's %s is not a string", k)
}

// operation parses doc and returns the operation that name selects (the only one when name
// is "").
func operation(doc, name string) (Operation, error) {
	d, err := parser.ParseQueryWithTokenLimit(&ast.Source{Input: doc}, maxTokens)
	if err != nil {
		return Operation{}, errorf("the GraphQL document does not parse: %v", err)
	}
	if len(d.Operations) == 0 {
		return Operation{}, errorf("the GraphQL document has no operation")
	}
	var op *ast.OperationDefinition
	if name == "" {
		if len(d.Operations) > 1 {
			return Operation{}, errorf("the GraphQL document has %d operations and the request no operationName", len(d.Operations))
		}
		op = d.Operations[0]
	} else {
		for _, o := range d.Operations {
			if o.Name == "" && len(d.Operations) > 1 {
				return Operation{}, errorf("the GraphQL document has an anonymous operation beside others")
			}
			if o.Name == name {
				if op != nil {
					return Operation{}, errorf("the GraphQL document has two operations named %q", name)
				}
				op = o
			}
		}
		if op == nil {
			return Operation{}, errorf("the GraphQL document has no operation named %q", name)
		}
	}
	fragments := map[string]*ast.FragmentDefinition{}
	for _, f := range d.Fragments {
		if _, dup := fragments[f.Name]; dup {
			return Operation{}, errorf("the GraphQL document defines fragment %q twice", f.Name)
		}
		fragments[f.Name] = f
	}
	fields := []string{}
	seen := map[string]bool{}
	if err := topFields(op.SelectionSet, fragments, map[string]bool{}, seen, &fields); err != nil {
		return Operation{}, err
	}
	return Operation{Type: string(op.Operation), Name: op.Name, Fields: fields}, nil
}

// topFields appends the names of the fields set selects, through fragments, to fields.
func topFields(set ast.SelectionSet, fragments map[string]*ast.FragmentDefinition, spreading, seen map[string]bool, fields *[]string) error {
	for _, s := range set {
		switch s := s.(type) {
		case *ast.Field:
			if !seen[s.Name] {
				seen[s.Name] = true
				*fields = append(*fields, s.Name)
			}
		case *ast.InlineFragment:
			if err := topFields(s.SelectionSet, fragments, spreading, seen, fields); err != nil {
				return err
			}
		case *ast.FragmentSpread:
			f, ok := fragments[s.Name]
			if !ok {
				return errorf("the GraphQL document spreads fragment %q, which it does not define", s.Name)
			}
			if spreading[s.Name] {
				return errorf("the GraphQL document's fragment %q spreads itself", s.Name)
			}
			spreading[s.Name] = true
			err := topFields(f.SelectionSet, fragments, spreading, seen, fields)
			delete(spreading, s.Name)
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// IsError reports whether err is a request Describe could not read.
func IsError(err error) bool {
	var e *Error
	return errors.As(err, &e)
}

func first(q map[string][]string, k string) string {
	if vs := q[k]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}

// isGraphQLType reports whether a content type is application/graphql: the body is the
// document itself.
func isGraphQLType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && strings.EqualFold(mt, "application/graphql")
}

// readValue reads the body's value: an object, or an array of objects, each read by
// readObject; any other value as it is.
func readValue(dec *json.Decoder) (any, error) {
	t, err := dec.Token()
	if err != nil {
		return nil, errorf("the GraphQL request body is not JSON: %v", err)
	}
	switch t {
	case json.Delim('{'):
		return readObject(dec)
	case json.Delim('['):
		l := []any{}
		for dec.More() {
			var item any
			if t, err := dec.Token(); err != nil {
				return nil, errorf("the GraphQL request body is not JSON: %v", err)
			} else if t == json.Delim('{') {
				if item, err = readObject(dec); err != nil {
					return nil, err
				}
			} else {
				item = t // not an object: refused by the caller
				if d, ok := t.(json.Delim); ok {
					return nil, errorf("the GraphQL batch has an item that is not an object (%v)", d)
				}
			}
			l = append(l, item)
		}
		if _, err := dec.Token(); err != nil {
			return nil, errorf("the GraphQL request body is not JSON: %v", err)
		}
		return l, nil
	}
	return t, nil
}

// readObject reads the members of an object whose "{" has been read. A member name given
// twice, in any case, is refused: servers differ on which one counts ("query" and "Query"
// are one member to a Go server decoding into a struct, the last of two to most others), and
// the policy must see the one the server runs.
func readObject(dec *json.Decoder) (map[string]any, error) {
	obj := map[string]any{}
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, errorf("the GraphQL request body is not JSON: %v", err)
		}
		k, _ := t.(string)
		folded := strings.ToLower(k)
		if seen[folded] {
			return nil, errorf("the GraphQL request has the member %q twice (in some case)", k)
		}
		seen[folded] = true
		if known, ok := knownMembers[folded]; ok && known != k {
			return nil, errorf("the GraphQL request has the member %q: did you mean %q?", k, known)
		}
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, errorf("the GraphQL request body is not JSON: %v", err)
		}
		obj[k] = v
	}
	if _, err := dec.Token(); err != nil { // the closing "}"
		return nil, errorf("the GraphQL request body is not JSON: %v", err)
	}
	return obj, nil
}

// knownMembers are the members of a request object the broker reads, by their lower case: a
// member that is one of them in another case is refused (a case-insensitive server would
// read it).
var knownMembers = map[string]string{
	"query": "query", "operationname": "operationName", "variables": "variables",
	"extensions": "extensions", "documentid": "documentId", "id": "id",
}
