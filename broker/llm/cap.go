package llm

import (
	"bytes"
	"encoding/json" // only to write the cut stream's last event, never to read

	"github.com/capbroker/capbroker/broker/usage"
)

// A Limiter answers whether a call in progress, with its tokens so far, stays within the hard
// budgets that apply to it, and names the one it overruns when not (broker/budget's Budgets).
type Limiter interface {
	Within(c usage.Call) (ok bool, budget string)
}

// capState is what a meter with a hard cap keeps: set only when a hard budget applies, so a
// call without one does no per-event work for it.
type capState struct {
	lim   Limiter
	call  usage.Call // agent, labels, provider
	asked int64      // the tokens last asked about
	cutBy string     // the budget the stream was cut for
}

// bytesPerToken is the estimate of output tokens from the text of content deltas: used only
// to cut a stream whose output tokens are not reported as it goes, never to count a call.
const bytesPerToken = 4

// Cap makes a streamed response be cut when its tokens so far overrun a hard budget l
// enforces; agent and labels are the caller's. Call it before Wrap, and only when a hard
// budget applies to the call: a nil l does nothing.
func (m *Meter) Cap(l Limiter, agent string, labels map[string]string) {
	if l == nil {
		return
	}
	m.cap = &capState{lim: l, call: usage.Call{Agent: agent, Labels: labels, Provider: m.ep.Provider}}
}

// CutBy names the budget the stream was cut for, or "".
func (m *Meter) CutBy() string {
	if m.cap == nil {
		return ""
	}
	return m.cap.cutBy
}

// capEvent reads one event of a capped stream, then asks the limiter whether the tokens so
// far (reported, or for output the estimate when larger) still fit. The event that overruns
// is not passed on; after it, nothing is read.
func (m *Meter) capEvent(data []byte) bool {
	c := m.cap
	if c.cutBy != "" {
		return false
	}
	keep := m.streamEvent(data)
	call := c.call
	call.Model = m.req.Model
	if call.Model == "" {
		call.Model = m.respModel
	}
	call.In, call.Out, call.Cached = m.in, max(m.out, m.text/bytesPerToken), m.cached
	if n := call.In + call.Out; n != c.asked {
		c.asked = n
		if ok, name := c.lim.Within(call); !ok {
			c.cutBy = name
			return false
		}
	}
	return keep
}

// cutEvent is the event that ends a cut stream, in the stream error shape of the API:
// Anthropic's error event, or (the others) an OpenAI-style error object.
func (m *Meter) cutEvent() []byte {
	msg := "the response was cut by the broker: it would overrun the hard budget " + m.cap.cutBy
	type detail struct {
		Type    string `json:"type"`
		Code    string `json:"code,omitempty"`
		Message string `json:"message"`
	}
	if m.ep.API == Messages {
		b, _ := json.Marshal(struct {
			Type  string `json:"type"`
			Error detail `json:"error"`
		}{"error", detail{Type: "budget_exceeded", Message: msg}})
		return append(append([]byte("event: error\ndata: "), b...), "\n\n"...)
	}
	b, _ := json.Marshal(struct {
		Error detail `json:"error"`
	}{detail{"budget_exceeded", "budget_exceeded", msg}})
	return append(append([]byte("data: "), b...), "\n\n"...)
}

// deltaKeys are the members whose string values are generated text, by API: content,
// reasoning and tool-call arguments of a chat chunk; a completion chunk's text; a Responses
// delta event's delta (the ".done" events restate the text under other names); Anthropic's
// text, JSON and thinking deltas; Gemini's parts.
var deltaKeys = map[API][][]byte{
	ChatCompletions: {[]byte(`"content"`), []byte(`"reasoning_content"`), []byte(`"reasoning"`), []byte(`"refusal"`), []byte(`"arguments"`)},
	Completions:     {[]byte(`"text"`)},
	Responses:       {[]byte(`"delta"`)},
	Messages:        {[]byte(`"text"`), []byte(`"partial_json"`), []byte(`"thinking"`)},
	GenerateContent: {[]byte(`"text"`)},
}

// deltaText is the length of the generated text an event carries, as written in its JSON (an
// escape counts its bytes): the string values of the API's deltaKeys, found in one pass from
// string to string without decoding the event. It is what a call is estimated from when its
// usage cannot be read.
func deltaText(api API, data []byte) int64 {
	keys := deltaKeys[api]
	var n int64
	i := 0
	if a := deltaAnchors[api]; a != nil {
		// The text is inside this member: the members before it are skipped in one search.
		if i = memberAt(data, a); i < 0 {
			return 0
		}
	}
	for {
		q := bytes.IndexByte(data[i:], '"')
		if q < 0 {
			return n
		}
		i += q
		end := stringEnd(data, i)
		if end < 0 {
			return n
		}
		for _, k := range keys {
			if end-i != len(k) || !bytes.Equal(data[i:end], k) {
				continue
			}
			v := bytes.TrimLeft(data[end:], " \t\r\n")
			if len(v) == 0 || v[0] != ':' {
				break
			}
			v = bytes.TrimLeft(v[1:], " \t\r\n")
			if len(v) == 0 || v[0] != '"' {
				break
			}
			start := len(data) - len(v)
			if vEnd := stringEnd(data, start); vEnd > 0 {
				n += int64(vEnd - start - 2)
				end = vEnd
			}
			break
		}
		i = end
	}
}

// deltaAnchors name the member each API's generated text is inside of.
var deltaAnchors = map[API][]byte{
	ChatCompletions: []byte(`"choices"`),
	Completions:     []byte(`"choices"`),
	Responses:       []byte(`"delta"`),
	Messages:        []byte(`"delta"`),
	GenerateContent: []byte(`"candidates"`),
}

// memberAt is the index of the first member named name (quoted) in data, or -1: a match
// preceded by '{' or ',' (and spaces) is a member name, not the end of an escaped quote in a
// string.
func memberAt(data, name []byte) int {
	for off := 0; ; {
		i := bytes.Index(data[off:], name)
		if i < 0 {
			return -1
		}
		i += off
		j := i - 1
		for j >= 0 && (data[j] == ' ' || data[j] == '\t' || data[j] == '\r' || data[j] == '\n') {
			j--
		}
		if j >= 0 && (data[j] == '{' || data[j] == ',') {
			return i
		}
		off = i + 1
	}
}

// stringEnd: data[i] is a quote; the index just past the string's closing quote, or -1.
func stringEnd(data []byte, i int) int {
	for j := i + 1; ; {
		q := bytes.IndexByte(data[j:], '"')
		if q < 0 {
			return -1
		}
		q += j
		bs := 0 // backslashes right before the quote: an odd number escapes it
		for k := q - 1; k > i && data[k] == '\\'; k-- {
			bs++
		}
		if bs%2 == 0 {
			return q + 1
		}
		j = q + 1
	}
}
