package llm

import (
	"bytes"
	"encoding/json"
)

// maxModel is the longest model name kept; a longer one is cut (it comes from the agent or
// the upstream, and ends up in audit events and metrics).
const maxModel = 128

// Request is what the request of a metered call says.
type Request struct {
	Model string
	// Stream: the request asks for a streamed response.
	Stream bool
	// IncludeUsage: a chat completion stream that asks for usage (stream_options.include_usage).
	IncludeUsage bool
}

// ParseRequest reads a metered call's request body (nil when unknown). A body that is not the
// JSON object expected reads as an empty Request.
func ParseRequest(ep Endpoint, body []byte) Request {
	r := Request{Model: ep.Model}
	if body == nil {
		return r
	}
	names := [...]string{"model", "stream", "stream_options"}
	var vals [3][]byte
	if !topMembers(body, names[:], vals[:]) {
		var v map[string]json.RawMessage
		if json.Unmarshal(body, &v) != nil {
			return r
		}
		for i, n := range names {
			vals[i] = v[n]
		}
	}
	var model string
	if r.Model == "" && len(vals[0]) > 0 && json.Unmarshal(vals[0], &model) == nil {
		r.Model = cut(model)
	}
	r.Stream = bytes.Equal(vals[1], []byte("true"))
	if so := vals[2]; len(so) > 0 && so[0] == '{' {
		var opts struct {
			IncludeUsage json.RawMessage `json:"include_usage"`
		}
		r.IncludeUsage = json.Unmarshal(so, &opts) == nil && bytes.Equal(opts.IncludeUsage, []byte("true"))
	}
	return r
}

func cut(model string) string {
	if len(model) > maxModel {
		return model[:maxModel]
	}
	return model
}

// askUsage returns body with stream_options.include_usage set to true, or false when it
// cannot (the body is not a JSON object, or its stream_options is not one).
func askUsage(body []byte) ([]byte, bool) {
	names := [...]string{"stream_options"}
	var vals [1][]byte
	if topMembers(body, names[:], vals[:]) && vals[0] == nil {
		return insertUsage(body), true
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil || top == nil {
		return nil, false
	}
	so, ok := top["stream_options"]
	if !ok {
		return insertUsage(body), true
	}
	opts := map[string]json.RawMessage{}
	if !bytes.Equal(so, []byte("null")) && (json.Unmarshal(so, &opts) != nil || opts == nil) {
		return nil, false
	}
	opts["include_usage"] = json.RawMessage("true")
	top["stream_options"], _ = json.Marshal(opts)
	out, err := json.Marshal(top)
	return out, err == nil
}

// insertUsage puts stream_options first in a JSON object, the rest of it left as it is.
func insertUsage(body []byte) []byte {
	i := bytes.IndexByte(body, '{')
	rest := bytes.TrimLeft(body[i+1:], " \t\r\n")
	out := make([]byte, 0, len(body)+48)
	out = append(out, body[:i+1]...)
	out = append(out, `"stream_options":{"include_usage":true}`...)
	if len(rest) > 0 && rest[0] != '}' {
		out = append(out, ',')
	}
	return append(out, rest...)
}
