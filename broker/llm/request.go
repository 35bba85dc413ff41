package llm

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/capbroker/capbroker/broker/wire/strictjson"
)

// maxModel is the longest model name kept; a longer one is cut (it comes from the agent or
// the upstream, and ends up in audit events and metrics).
const maxModel = 128

// Request is what the request of a metered call says, as the broker sends it.
type Request struct {
	Model string
	// Stream: the request, as sent, asks for a streamed response.
	Stream bool
	// IncludeUsage: the agent itself asked a chat or completions stream for usage
	// (stream_options.include_usage: true, exactly so).
	IncludeUsage bool
	// Background: a Responses API request run in the background (background: true), whose
	// answer carries no usage.
	Background bool
	// Size is the request body's length in bytes (the input estimate of a call whose usage
	// cannot be read), or -1 when not known.
	Size int64
	// MaxOut is the most output tokens the request asks for (max_tokens,
	// max_completion_tokens, max_output_tokens), or 0.
	MaxOut int64
}

// maxOutNames are the members in which the APIs take the most output tokens to generate.
var maxOutNames = []string{"max_tokens", "max_completion_tokens", "max_output_tokens"}

// ErrUnreadable is wrapped by the error refusing a metered call's request body that the broker
// cannot classify: not JSON where a budget needs it read, or a stream, stream_options or
// background member of a type no upstream reads one way. The error's text says which, never a
// value of the body.
var ErrUnreadable = errors.New("the LLM request cannot be metered")

// ErrAmbiguous is wrapped by the error refusing a body with a member whose name a server may
// read as one the broker decides on (Stream for stream, Include_Usage for include_usage): it
// would be read one way here and another there. Duplicate and case-folded members are refused
// by strictjson itself, with strictjson.ErrAmbiguous.
var ErrAmbiguous = errors.New("ambiguous LLM request")

// RequestError is a refused request: Reason is for the agent.
type RequestError struct {
	Reason string
	kind   error
}

func (e *RequestError) Error() string { return e.Reason }
func (e *RequestError) Unwrap() error { return e.kind }

// decided are the top-level members the broker reads or writes in a metered request.
var decided = []string{"model", "stream", "stream_options", "background"}

// readRequest reads a metered call's request body (nil when not in memory) through strictjson
// and returns what it says, and the body to send instead when the broker rewrote it (nil:
// send it as it is). With budgeted, a body the broker cannot read is refused.
//
// The upstream receives the stream decision the broker took, written canonically: a value the
// upstream would take as true (true, 1, "true", "yes", "on"...) or false is sent as JSON true or
// false; anything else is refused. A chat or completions stream (on an endpoint that lets the
// broker ask) is sent with stream_options.include_usage: true, the agent's other stream options
// kept.
func readRequest(ep Endpoint, body []byte, budgeted bool) (Request, []byte, error) {
	r := Request{Model: ep.Model, Size: int64(len(body))}
	if body == nil {
		r.Size = -1
		if budgeted {
			return r, nil, &RequestError{"a metered LLM call under a tokens or cost budget needs its JSON body read by the broker (Content-Type: application/json, uncompressed)", ErrUnreadable}
		}
		return r, nil, nil
	}
	if err := strictjson.Check(body); err != nil {
		if errors.Is(err, strictjson.ErrAmbiguous) {
			return r, nil, err
		}
		if budgeted {
			return r, nil, &RequestError{"the body of a metered LLM call under a tokens or cost budget is not valid JSON (" + err.Error() + ")", ErrUnreadable}
		}
		return r, nil, nil
	}
	top, err := topLevel(body)
	if err != nil {
		if budgeted {
			return r, nil, &RequestError{"the body of a metered LLM call under a tokens or cost budget must be a JSON object", ErrUnreadable}
		}
		return r, nil, nil
	}
	if name, ok := nearMiss(top.names(), decided); ok {
		return r, nil, &RequestError{fmt.Sprintf("the member %q is read by some servers as one the broker decides on (%s); send it with its exact name", cutName(name), strings.Join(decided, ", ")), ErrAmbiguous}
	}
	if v := top.value("model"); v != nil && v[0] == '"' && ep.Model == "" {
		var s string
		if strictjson.Unmarshal(v, &s) == nil {
			r.Model = cut(s)
		}
	}
	for _, n := range maxOutNames {
		var v int64
		if raw := top.value(n); raw != nil && strictjson.Unmarshal(raw, &v) == nil && v > r.MaxOut {
			r.MaxOut = v
		}
	}
	if ep.API == Responses {
		if r.Background, err = flag(top.value("background"), "background"); err != nil {
			return r, nil, err
		}
	}
	if !streams(ep.API) {
		return r, nil, nil
	}
	sv := top.value("stream")
	if r.Stream, err = flag(sv, "stream"); err != nil {
		return r, nil, err
	}
	rewrite := sv != nil && !bytes.Equal(sv, []byte("true")) && !bytes.Equal(sv, []byte("false")) && !bytes.Equal(sv, []byte("null"))
	var opts []byte // the stream_options to send, when rewritten
	if r.Stream && (ep.API == ChatCompletions || ep.API == Completions) {
		o := top.value("stream_options")
		asked, others, err := streamOptions(o)
		if err != nil {
			return r, nil, err
		}
		r.IncludeUsage = asked
		if ep.AskUsage && !asked {
			opts = append(append([]byte(`{"include_usage":true`), others...), '}')
			rewrite = true
		}
	}
	if !rewrite {
		return r, nil, nil
	}
	return r, top.rewrite(r.Stream, opts), nil
}

// streams: the API has a top-level "stream" member the broker decides on.
func streams(api API) bool {
	return api == ChatCompletions || api == Completions || api == Responses || api == Messages
}

// flag classifies a boolean member's value as an upstream would read it (OpenAI's and
// Anthropic's APIs take JSON booleans; servers such as vLLM validate with pydantic, which also
// takes 1, 0 and strings such as "true", "yes", "on", "1"); absent and null are false. A value
// no server reads one way is refused.
func flag(v jsontext.Value, name string) (bool, error) {
	if v == nil {
		return false, nil
	}
	switch v[0] {
	case 't':
		return true, nil
	case 'f', 'n':
		return false, nil
	case '"':
		var s string
		if strictjson.Unmarshal(v, &s) == nil {
			switch strings.ToLower(strings.TrimSpace(s)) {
			case "true", "1", "yes", "y", "on", "t":
				return true, nil
			case "false", "0", "no", "n", "off", "f":
				return false, nil
			}
		}
	default:
		if f, err := strconv.ParseFloat(string(v), 64); err == nil && (f == 0 || f == 1) {
			return f == 1, nil
		}
	}
	return false, &RequestError{fmt.Sprintf("the member %q of a metered LLM call must be true or false", name), ErrUnreadable}
}

// streamOptions reads a stream's stream_options (nil when absent): whether it asks for usage
// exactly (include_usage: true), and its other members, each preceded by a comma, to keep.
func streamOptions(v jsontext.Value) (asked bool, others []byte, err error) {
	if v == nil || bytes.Equal(v, []byte("null")) {
		return false, nil, nil
	}
	o, err := topLevel(v)
	if err != nil {
		return false, nil, &RequestError{`the member "stream_options" of a metered LLM call must be an object`, ErrUnreadable}
	}
	if name, ok := nearMiss(o.names(), []string{"include_usage"}); ok {
		return false, nil, &RequestError{fmt.Sprintf("the member %q of stream_options is read by some servers as include_usage; send include_usage with its exact name", cutName(name)), ErrAmbiguous}
	}
	iu := o.value("include_usage")
	asked = bytes.Equal(iu, []byte("true"))
	if iu != nil && !asked {
		if _, err := flag(iu, "stream_options.include_usage"); err != nil {
			return false, nil, err
		}
	}
	for _, m := range o.members {
		if m.name != "include_usage" {
			others = append(append(others, ','), m.text...)
		}
	}
	return asked, others, nil
}

// object is a JSON object's members as written: each member's decoded name, its value and
// the text of the whole member ("name": value).
type object struct {
	members []member
}

type member struct {
	name  string
	value jsontext.Value
	text  []byte
}

// topLevel splits a JSON object that strictjson.Check accepted into its members, without
// decoding their values.
func topLevel(b []byte) (object, error) {
	var o object
	d := jsontext.NewDecoder(bytes.NewBuffer(b)) // a Buffer is read in place, not copied
	tok, err := d.ReadToken()
	if err != nil || tok.Kind() != '{' {
		return o, errors.New("not a JSON object")
	}
	for d.PeekKind() != '}' {
		start := d.InputOffset()
		tok, err := d.ReadToken()
		if err != nil {
			return o, err
		}
		name := tok.String()
		vStart := d.InputOffset()
		if err := d.SkipValue(); err != nil {
			return o, err
		}
		end := d.InputOffset()
		v := bytes.TrimLeft(b[vStart:end], " \t\r\n:")
		o.members = append(o.members, member{name: name, value: v, text: bytes.TrimLeft(b[start:end], " \t\r\n,")})
	}
	return o, nil
}

func (o object) value(name string) jsontext.Value {
	for _, m := range o.members {
		if m.name == name {
			return m.value
		}
	}
	return nil
}

func (o object) names() []string {
	n := make([]string, len(o.members))
	for i, m := range o.members {
		n[i] = m.name
	}
	return n
}

// rewrite is the object with stream (and stream_options, when opts is not nil) written by the
// broker first, and its other members as they were.
func (o object) rewrite(stream bool, opts []byte) []byte {
	n := 64 + len(opts)
	for _, m := range o.members {
		n += len(m.text) + 1
	}
	out := make([]byte, 0, n)
	out = append(out, `{"stream":`...)
	out = strconv.AppendBool(out, stream)
	if opts != nil {
		out = append(append(out, `,"stream_options":`...), opts...)
	}
	for _, m := range o.members {
		if m.name == "stream" || (opts != nil && m.name == "stream_options") {
			continue
		}
		out = append(append(out, ','), m.text...)
	}
	return append(out, '}')
}

// nearMiss finds a name in names that is not one of wanted but that a server may read as one
// of them (it differs only in case, Unicode folding, '_' or '-'). strictjson decides, on an
// object made of the names and the wanted names absent from them: it refuses exactly such a
// pair.
func nearMiss(names, wanted []string) (string, bool) {
	obj := []byte{'{'}
	add := func(name string) {
		if len(obj) > 1 {
			obj = append(obj, ',')
		}
		obj, _ = jsontext.AppendQuote(obj, name)
		obj = append(obj, ":0"...)
	}
	for _, w := range wanted {
		found := false
		for _, n := range names {
			if n == w {
				found = true
				break
			}
		}
		if !found {
			add(w)
		}
	}
	for _, n := range names {
		add(n)
	}
	obj = append(obj, '}')
	var se *strictjson.Error
	if err := strictjson.Check(obj); errors.As(err, &se) && errors.Is(err, strictjson.ErrAmbiguous) {
		for _, n := range se.Names {
			if !isWanted(n, wanted) {
				return n, true
			}
		}
		return se.Names[1], true
	}
	return "", false
}

func isWanted(n string, wanted []string) bool {
	for _, w := range wanted {
		if n == w {
			return true
		}
	}
	return false
}

// cutName bounds a member name quoted back to the agent.
func cutName(s string) string {
	if len(s) > 64 {
		return strings.ToValidUTF8(s[:64], "") + "…"
	}
	return s
}

func cut(model string) string {
	if len(model) > maxModel {
		return model[:maxModel]
	}
	return model
}
