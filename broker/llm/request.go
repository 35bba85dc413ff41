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
	var v struct {
		Model         json.RawMessage `json:"model"`
		Stream        json.RawMessage `json:"stream"`
		StreamOptions *struct {
			IncludeUsage json.RawMessage `json:"include_usage"`
		} `json:"stream_options"`
	}
	if json.Unmarshal(body, &v) != nil {
		return r
	}
	var model string
	if json.Unmarshal(v.Model, &model) == nil && r.Model == "" {
		r.Model = cut(model)
	}
	r.Stream = bytes.Equal(v.Stream, []byte("true"))
	r.IncludeUsage = v.StreamOptions != nil && bytes.Equal(v.StreamOptions.IncludeUsage, []byte("true"))
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
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil || top == nil {
		return nil, false
	}
	so, ok := top["stream_options"]
	if !ok {
		// The usual case: the member is inserted first, the rest of the body left as it is.
		i := bytes.IndexByte(body, '{')
		rest := bytes.TrimLeft(body[i+1:], " \t\r\n")
		out := make([]byte, 0, len(body)+48)
		out = append(out, body[:i+1]...)
		out = append(out, `"stream_options":{"include_usage":true}`...)
		if len(rest) > 0 && rest[0] != '}' {
			out = append(out, ',')
		}
		return append(out, rest...), true
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
