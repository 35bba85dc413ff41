// Package graphql says what a GraphQL request executes (CONTRACT §8, input.graphql): the type,
// name and top-level fields of each operation, read with a GraphQL parser (the document only:
// the broker has no schema). A request the broker cannot read is an error, never "no
// operation": the policy is refused the request rather than shown nothing.
package graphql

import (
	"bytes"
	"errors"
	"fmt"
	"mime"
	"strings"

	"github.com/capbroker/capbroker/broker/wire/strictjson"
	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
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
// reason given to the agent. One whose JSON a server may read otherwise than the broker wraps
// strictjson.ErrAmbiguous.
type Error struct {
	msg string
	err error
}

func (e *Error) Error() string { return e.msg }
func (e *Error) Unwrap() error { return e.err }

// jsonError is the Error for JSON text (the body, the extensions parameter) that strictjson
// refuses, what names it.
func jsonError(what string, err error) error {
	if errors.Is(err, strictjson.ErrAmbiguous) {
		return &Error{fmt.Sprintf("the GraphQL %s is ambiguous: %v", what, err), err}
	}
	if errors.Is(err, strictjson.ErrInvalid) {
		return errorf("the GraphQL %s is not JSON: %v", what, err)
	}
	return errorf("the GraphQL %s is not of the shape GraphQL gives it: %v", what, err)
}

func errorf(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if len(msg) > maxReason {
		msg = msg[:maxReason] + "..."
	}
	return &Error{msg: msg}
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
		var item request
		for _, p := range urlParams {
			if vs, ok := r.Query[p]; ok {
				if len(vs) != 1 {
					return nil, errorf("the GraphQL request has the URL parameter %s %d times", p, len(vs))
				}
				quoted, err := jsontext.AppendQuote(nil, vs[0])
				if err != nil {
					return nil, errorf("the GraphQL request's URL parameter %s is not valid UTF-8", p)
				}
				v := jsontext.Value(quoted)
				if p == "extensions" {
					if err := strictjson.Check([]byte(vs[0])); err != nil {
						return nil, jsonError("request's extensions parameter", err)
					}
					v = jsontext.Value(vs[0])
				}
				*item.member(p) = v
			}
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
	// example sends its JSON as a form), through strictjson: a body with two members a server
	// may read as one ("query" and "Query"), at any depth, or a member of the request object
	// in another case or spelling ("Query", "operation_name" alone), which a case-insensitive
	// server would read, is ambiguous.
	if err := strictjson.Check(body); err != nil {
		return nil, jsonError("request body", err)
	}
	switch body[0] {
	case '{':
		var item request
		if err := strictjson.Unmarshal(body, &item); err != nil {
			return nil, jsonError("request body", err)
		}
		op, err := describeItem(item)
		if err != nil {
			return nil, err
		}
		return []Operation{op}, nil
	case '[':
		var raws []jsontext.Value
		if err := json.Unmarshal(body, &raws); err != nil {
			return nil, jsonError("request body", err)
		}
		if len(raws) == 0 {
			return nil, errorf("the GraphQL request is an empty batch")
		}
		ops := make([]Operation, 0, len(raws))
		for i, raw := range raws {
			if raw.Kind() != '{' {
				return nil, errorf("the GraphQL batch's item %d is not an object", i)
			}
			var item request
			if err := strictjson.Unmarshal(raw, &item); err != nil {
				return nil, jsonError(fmt.Sprintf("batch's item %d", i), err)
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

// request is one request object, its members as they were sent (nil when absent): those a
// server reads, by their exact names.
type request struct {
	Query         jsontext.Value `json:"query"`
	OperationName jsontext.Value `json:"operationName"`
	Variables     jsontext.Value `json:"variables"`
	Extensions    jsontext.Value `json:"extensions"`
	DocumentID    jsontext.Value `json:"documentId"`
	ID            jsontext.Value `json:"id"`
}

// member returns the member of r named p (one of urlParams).
func (r *request) member(p string) *jsontext.Value {
	switch p {
	case "query":
		return &r.Query
	case "operationName":
		return &r.OperationName
	case "variables":
		return &r.Variables
	case "extensions":
		return &r.Extensions
	case "documentId":
		return &r.DocumentID
	}
	return &r.ID
}

// describeItem reads one request object: {query, operationName, variables, extensions}, or a
// persisted query's {extensions.persistedQuery.sha256Hash} or {documentId} or {id}.
func describeItem(item request) (Operation, error) {
	name, err := optString(item.OperationName, "operationName")
	if err != nil {
		return Operation{}, err
	}
	query, err := optString(item.Query, "query")
	if err != nil {
		return Operation{}, err
	}
	if query != "" {
		return operation(query, name)
	}
	hash := ""
	if item.Extensions != nil && item.Extensions.Kind() == '{' {
		var ext struct {
			PersistedQuery *struct {
				Sha256Hash jsontext.Value `json:"sha256Hash"`
			} `json:"persistedQuery"`
		}
		if err := strictjson.Unmarshal(item.Extensions, &ext); err != nil {
			return Operation{}, jsonError("request's extensions", err)
		}
		if ext.PersistedQuery != nil {
			if hash, err = optString(ext.PersistedQuery.Sha256Hash, "persistedQuery.sha256Hash"); err != nil {
				return Operation{}, err
			}
		}
	}
	if hash == "" {
		if hash, err = optString(item.DocumentID, "documentId"); err != nil {
			return Operation{}, err
		}
	}
	if hash == "" {
		if hash, err = optString(item.ID, "id"); err != nil {
			return Operation{}, err
		}
	}
	if hash == "" {
		return Operation{}, errorf("the GraphQL request has no query (and no persisted query hash)")
	}
	return Operation{Type: "persisted", Name: name, Hash: hash, Fields: []string{}}, nil
}

// optString returns the string v is: "" when it is null or absent; an error, naming k, when it
// is not a string.
func optString(v jsontext.Value, k string) (string, error) {
	switch v.Kind() {
	case 0, 'n':
		return "", nil
	case '"':
		s, err := jsontext.AppendUnquote(nil, v)
		if err == nil {
			return string(s), nil
		}
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
