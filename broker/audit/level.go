package audit

import (
	"strings"

	"go.yaml.in/yaml/v3"
)

// Level is how much of the policy input an event carries (audit.include_input). Each level
// writes what the one before it does, and more:
//
//   - InputNone: no input.
//   - InputMetadata: the input without header values, query values and body: the agent, its
//     labels and address, method, scheme, host, port, path, raw_path, the names of the query
//     parameters (each with an empty list), body_size and the credentials.
//   - InputHeaders: and the request's headers, without credential-bearing ones.
//   - InputFull: and the query values and the JSON body: what `broker policy replay` needs to
//     re-decide every request as the broker did.
//
// Credential-bearing headers never appear: the broker removes them from the policy input, and
// the Logger drops any header whose name looks like one (credentialHeader) as well.
type Level string

// Levels; the YAML booleans false and true are InputNone and InputHeaders.
const (
	InputNone     Level = "none"
	InputMetadata Level = "metadata"
	InputHeaders  Level = "headers"
	InputFull     Level = "full"
)

// UnmarshalYAML reads a level or a boolean: false is InputNone; true, which once meant the
// whole input, is InputHeaders, the most the event carries without prompts or query values.
func (l *Level) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!bool" {
		var b bool
		if err := n.Decode(&b); err != nil {
			return err
		}
		*l = InputNone
		if b {
			*l = InputHeaders
		}
		return nil
	}
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	*l = Level(s)
	return nil
}

// Valid reports whether l is a level; "" (not set) is InputNone.
func (l Level) Valid() bool {
	switch l {
	case "", InputNone, InputMetadata, InputHeaders, InputFull:
		return true
	}
	return false
}

// Logs reports whether events at l carry an input at all.
func (l Level) Logs() bool { return l != "" && l != InputNone }

// Body reports whether events at l carry the request's body (and query values).
func (l Level) Body() bool { return l == InputFull }

// reduce returns the part of input, a policy input document, that level l writes. It copies
// what it changes: input itself is left as it is.
func (l Level) reduce(input map[string]any) map[string]any {
	out := make(map[string]any, len(input))
	for k, v := range input {
		out[k] = v
	}
	req, ok := input["request"].(map[string]any)
	if !ok {
		return out
	}
	r := make(map[string]any, len(req))
	for k, v := range req {
		r[k] = v
	}
	out["request"] = r
	if h, ok := req["headers"].(map[string]any); ok {
		if l == InputMetadata {
			delete(r, "headers")
		} else {
			kept := make(map[string]any, len(h))
			for name, v := range h {
				if !credentialHeader(name) {
					kept[name] = v
				}
			}
			r["headers"] = kept
		}
	}
	if l == InputFull {
		return out
	}
	delete(r, "body")
	if q, ok := req["query"].(map[string]any); ok {
		names := make(map[string]any, len(q))
		for name := range q {
			names[name] = []any{}
		}
		r["query"] = names
	}
	return out
}

// credentialHeader reports whether a header name looks like one that carries a credential: the
// ones the broker already keeps from the policy, and any naming a token, key, secret, password,
// session, signature, cookie or authorization. An event is no place to find out it did not.
func credentialHeader(name string) bool {
	name = strings.ToLower(name)
	for _, w := range credentialWords {
		if strings.Contains(name, w) {
			return true
		}
	}
	return false
}

var credentialWords = []string{"auth", "token", "key", "secret", "password", "passwd", "session", "signature", "cookie", "credential"}

// LoggedInput is the policy input as much as the event's InputLevel writes of it, or nil: what
// every encoding of the event carries.
func (e *Event) LoggedInput() map[string]any {
	if !e.InputLevel.Logs() || e.Input == nil {
		return nil
	}
	return e.InputLevel.reduce(e.Input)
}
