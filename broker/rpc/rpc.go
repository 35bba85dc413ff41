// Package rpc reads what a JSON-RPC 2.0 request body asks for (CONTRACT §8): the methods of
// its messages for input.jsonrpc, and for an MCP server each message's meaning for
// input.mcp (the tool called, its arguments, the resource read).
package rpc

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/capbroker/capbroker/broker/wire/strictjson"
	"github.com/go-json-experiment/json/jsontext"
)

// ErrNotJSONRPC is the reason a body on a JSON-RPC or MCP endpoint that is not a JSON-RPC
// message (or batch of them) is refused when the policy depends on its meaning.
var ErrNotJSONRPC = errors.New("the body is not a JSON-RPC message")

// Message is one JSON-RPC 2.0 message an agent sent: a request (with an ID), a notification,
// or a response to a request of the server's (Response; Method is then "").
type Message struct {
	Method   string
	ID       jsontext.Value // as sent; nil when absent
	Response bool
	Params   jsontext.Value // nil when absent
}

type wire struct {
	JSONRPC string         `json:"jsonrpc"`
	Method  *string        `json:"method"`
	ID      jsontext.Value `json:"id"`
	Params  jsontext.Value `json:"params"`
	Result  jsontext.Value `json:"result"`
	Error   jsontext.Value `json:"error"`
}

// Parse reads a body that is one JSON-RPC 2.0 message or a non-empty batch of them, through
// strictjson: names are matched exactly, and a body with two members a server may read as one
// ("method" and "Method", "params" twice), or with a member a server may take for one of the
// message's ("Method" alone), at any depth, is an error wrapping strictjson.ErrAmbiguous. Anything
// else that is not JSON-RPC (not JSON, another version, a message with neither a method nor a
// result or error, an empty batch, a member of another type) is ErrNotJSONRPC.
func Parse(body []byte) ([]Message, error) {
	t := bytes.TrimLeft(body, " \t\r\n")
	if len(t) == 0 {
		return nil, ErrNotJSONRPC
	}
	var ws []wire
	var err error
	if t[0] == '[' {
		err = strictjson.Unmarshal(t, &ws)
	} else {
		ws = make([]wire, 1)
		err = strictjson.Unmarshal(t, &ws[0])
	}
	if errors.Is(err, strictjson.ErrAmbiguous) {
		return nil, fmt.Errorf("the JSON-RPC message is ambiguous: %w", err)
	}
	if err != nil || len(ws) == 0 {
		return nil, ErrNotJSONRPC
	}
	msgs := make([]Message, 0, len(ws))
	for _, w := range ws {
		if w.JSONRPC != "2.0" {
			return nil, ErrNotJSONRPC
		}
		m := Message{ID: w.ID}
		switch {
		case w.Method != nil:
			m.Method = *w.Method
			if w.Params != nil && string(w.Params) != "null" {
				m.Params = w.Params
			}
		case w.Result != nil || w.Error != nil:
			m.Response = true
		default:
			return nil, ErrNotJSONRPC
		}
		msgs = append(msgs, m)
	}
	return msgs, nil
}

// JSONRPC is input.jsonrpc for msgs: a list of {method} (a response: method ""). Its
// signature is MCP's; it never fails.
func JSONRPC(msgs []Message) ([]any, error) {
	l := make([]any, len(msgs))
	for i, m := range msgs {
		l[i] = map[string]any{"method": m.Method}
	}
	return l, nil
}

// MCP is input.mcp for msgs: for each message {method, tool, arguments, uri}, and, where the
// method has them, prompt (prompts/get's name), client {name, version} and protocol_version
// (initialize). Members a message does not have are "" (arguments: an empty object), so that
// a policy comparing them needs no default. A response the agent sends to the server's
// request has method "response". The params of the methods read are decoded through
// strictjson: a member of another type than MCP gives it ("arguments" that are not an object),
// or one a server may take for a member read ("Name", "ARGUMENTS", "argumentſ"), is an error,
// never a member left out.
func MCP(msgs []Message) ([]any, error) {
	l := make([]any, len(msgs))
	for i, m := range msgs {
		item := map[string]any{"method": m.Method, "tool": "", "arguments": map[string]any{}, "uri": ""}
		if m.Response {
			item["method"] = "response"
		}
		var p struct {
			Name            string         `json:"name"`
			Arguments       map[string]any `json:"arguments"`
			URI             string         `json:"uri"`
			ProtocolVersion string         `json:"protocolVersion"`
			ClientInfo      struct {
				Name    string `json:"name"`
				Version string `json:"version"`
			} `json:"clientInfo"`
		}
		switch m.Method {
		case "tools/call", "resources/read", "resources/subscribe", "resources/unsubscribe", "prompts/get", "initialize":
			if m.Params == nil {
				break
			}
			if err := strictjson.Unmarshal(m.Params, &p); errors.Is(err, strictjson.ErrAmbiguous) {
				return nil, fmt.Errorf("the MCP %s call is ambiguous: %w", m.Method, err)
			} else if err != nil {
				return nil, fmt.Errorf("the MCP %s call's params are not of the shape MCP gives them", m.Method)
			}
		}
		switch m.Method {
		case "tools/call":
			item["tool"] = p.Name
			if p.Arguments != nil {
				item["arguments"] = p.Arguments
			}
		case "resources/read", "resources/subscribe", "resources/unsubscribe":
			item["uri"] = p.URI
		case "prompts/get":
			item["prompt"] = p.Name
			if p.Arguments != nil {
				item["arguments"] = p.Arguments
			}
		case "initialize":
			item["protocol_version"] = p.ProtocolVersion
			item["client"] = map[string]any{"name": p.ClientInfo.Name, "version": p.ClientInfo.Version}
		}
		l[i] = item
	}
	return l, nil
}
