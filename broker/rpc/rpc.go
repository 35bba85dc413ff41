// Package rpc reads what a JSON-RPC 2.0 request body asks for (CONTRACT §8): the methods of
// its messages for input.jsonrpc, and for an MCP server each message's meaning for
// input.mcp (the tool called, its arguments, the resource read).
package rpc

import (
	"bytes"
	"encoding/json"
	"errors"
)

// ErrNotJSONRPC is the reason a body on a JSON-RPC or MCP endpoint that is not a JSON-RPC
// message (or batch of them) is refused when the policy depends on its meaning.
var ErrNotJSONRPC = errors.New("the body is not a JSON-RPC message")

// Message is one JSON-RPC 2.0 message an agent sent: a request (HasID), a notification, or a
// response to a request of the server's (Response; Method is then "").
type Message struct {
	Method   string
	HasID    bool
	Response bool
	Params   json.RawMessage // nil when absent
}

type wire struct {
	JSONRPC string          `json:"jsonrpc"`
	Method  *string         `json:"method"`
	ID      json.RawMessage `json:"id"`
	Params  json.RawMessage `json:"params"`
	Result  json.RawMessage `json:"result"`
	Error   json.RawMessage `json:"error"`
}

// Parse reads a body that is one JSON-RPC 2.0 message or a non-empty batch of them. Anything
// else (not JSON, another version, a message with neither a method nor a result or error,
// an empty batch) is ErrNotJSONRPC.
func Parse(body []byte) ([]Message, error) {
	t := bytes.TrimLeft(body, " \t\r\n")
	if len(t) == 0 {
		return nil, ErrNotJSONRPC
	}
	var raws []json.RawMessage
	if t[0] == '[' {
		if json.Unmarshal(t, &raws) != nil || len(raws) == 0 {
			return nil, ErrNotJSONRPC
		}
	} else {
		raws = []json.RawMessage{t}
	}
	msgs := make([]Message, 0, len(raws))
	for _, raw := range raws {
		var w wire
		r := bytes.TrimLeft(raw, " \t\r\n")
		if len(r) == 0 || r[0] != '{' || json.Unmarshal(r, &w) != nil || w.JSONRPC != "2.0" {
			return nil, ErrNotJSONRPC
		}
		m := Message{HasID: w.ID != nil}
		switch {
		case w.Method != nil:
			m.Method = *w.Method
			if w.Params != nil && !bytes.Equal(w.Params, []byte("null")) {
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

// JSONRPC is input.jsonrpc for msgs: a list of {method} (a response: method "").
func JSONRPC(msgs []Message) []any {
	l := make([]any, len(msgs))
	for i, m := range msgs {
		l[i] = map[string]any{"method": m.Method}
	}
	return l
}

// MCP is input.mcp for msgs: for each message {method, tool, arguments, uri}, and, where the
// method has them, prompt (prompts/get's name), client {name, version} and protocol_version
// (initialize). Members a message does not have are "" (arguments: an empty object), so that
// a policy comparing them needs no default. A response the agent sends to the server's
// request has method "response".
func MCP(msgs []Message) []any {
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
		if m.Params != nil {
			_ = json.Unmarshal(m.Params, &p) // params of another shape: members stay ""
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
	return l
}
