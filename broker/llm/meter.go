package llm

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"

	"github.com/capbroker/capbroker/broker/usage"
)

// Meter reads the usage of one call. Start it with the request, Wrap the response with it:
// when the response body is closed (after its end, or when the agent went away), done is
// called once with the call.
type Meter struct {
	ep  Endpoint
	req Request
	// asked: the broker asked for usage the agent did not; the usage-only chunk is removed.
	asked bool

	status    int
	respModel string
	in, out   int64
	cached    int64
	have      bool      // usage was read
	bad       bool      // usage that did not parse, or an event too large to read
	cap       *capState // a hard budget applies (cap.go), or nil
}

// Start meters a call to ep whose request body is body (nil when it is not in memory). When
// the call streams chat completions without asking for usage, and ep lets the broker ask, it
// returns the body to send instead, which asks for it; otherwise nil.
func Start(ep Endpoint, body []byte) (*Meter, []byte) {
	m := &Meter{ep: ep, req: ParseRequest(ep, body)}
	if ep.API == ChatCompletions && ep.AskUsage && m.req.Stream && !m.req.IncludeUsage {
		if nb, ok := askUsage(body); ok {
			m.asked = true
			return m, nb
		}
	}
	return m, nil
}

// Asked reports whether the request was rewritten to ask for usage.
func (m *Meter) Asked() bool { return m.asked }

// Wrap makes resp's body metered; done is called once, when it is closed. A body still
// gzip-encoded is decoded first (the broker asks for unencoded bodies from metered APIs); one
// in another coding is passed on unread and counted as unreported.
func (m *Meter) Wrap(resp *http.Response, done func(usage.Call)) {
	m.status = resp.StatusCode
	f := &finish{m: m, done: done}
	readable := true
	if ce := resp.Header.Values("Content-Encoding"); len(ce) > 0 {
		switch c := strings.ToLower(strings.TrimSpace(strings.Join(ce, ","))); c {
		case "", "identity":
		case "gzip", "x-gzip":
			if zr, err := gzip.NewReader(resp.Body); err == nil {
				resp.Body = struct {
					io.Reader
					io.Closer
				}{zr, resp.Body}
				resp.Header.Del("Content-Encoding")
				resp.Header.Del("Content-Length")
				resp.ContentLength = -1
			} else {
				readable = false
			}
		default:
			readable = false
		}
	}
	switch {
	case !readable || resp.Body == nil || resp.Body == http.NoBody:
		m.bad = true
		resp.Body = &passBody{src: bodyOrEmpty(resp.Body), f: f}
	case isEventStream(resp.Header.Get("Content-Type")):
		s := &sse{event: m.event}
		if m.cap != nil {
			s.event = m.capEvent
		}
		if m.asked || m.cap != nil { // events are passed on whole: a cut stream ends on one
			resp.Body = &filterBody{src: resp.Body, s: s, f: f, buf: make([]byte, 32<<10), strip: m.asked}
			resp.Header.Del("Content-Length")
			resp.ContentLength = -1
		} else {
			resp.Body = &passBody{src: resp.Body, s: s, f: f}
		}
	default:
		resp.Body = &jsonBody{src: resp.Body, m: m, f: f}
	}
}

func bodyOrEmpty(b io.ReadCloser) io.ReadCloser {
	if b == nil {
		return http.NoBody
	}
	return b
}

func isEventStream(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "text/event-stream"
}

// Call is the call as read so far.
func (m *Meter) Call() usage.Call {
	c := usage.Call{Provider: m.ep.Provider, Model: m.req.Model}
	if c.Model == "" {
		c.Model = m.respModel
	}
	c.Reported = m.have && !m.bad && m.status >= 200 && m.status < 300
	if c.Reported {
		c.In, c.Out, c.Cached = m.in, m.out, m.cached
	}
	if m.cap != nil && m.cap.cutBy != "" {
		// Cut at a hard budget: what was let through counts, estimated where not reported.
		c.In, c.Out, c.Cached = m.in, max(m.out, m.cap.text/bytesPerToken), m.cached
		c.Estimated = c.Out != m.out || !c.Reported
	}
	return c
}

// finish calls done once.
type finish struct {
	m    *Meter
	done func(usage.Call)
	once sync.Once
}

func (f *finish) call() {
	f.once.Do(func() {
		if f.done != nil {
			f.done(f.m.Call())
		}
	})
}

// passBody passes the upstream's bytes on as they come, reading events from them on the side.
type passBody struct {
	src io.ReadCloser
	s   *sse // nil: nothing to read
	f   *finish
	eof bool
}

func (p *passBody) Read(b []byte) (int, error) {
	n, err := p.src.Read(b)
	if p.s != nil {
		p.s.feed(b[:n], nil)
		if err == io.EOF && !p.eof {
			p.eof = true
			p.s.end()
		}
	}
	return n, err
}

func (p *passBody) Close() error {
	err := p.src.Close()
	if p.s != nil && p.s.skipped {
		p.f.m.bad = true
	}
	p.f.call()
	return err
}

// filterBody passes events on whole, each as soon as it has ended, leaving out the ones the
// meter drops. An event too large to hold is passed on as it comes.
type filterBody struct {
	src     io.ReadCloser
	s       *sse
	f       *finish
	buf     []byte
	out     []byte // ready for the agent, from off
	off     int
	hold    []byte // the current event, not yet ended
	passing bool   // the current event is too large to hold
	strip   bool   // the broker asked for usage: `"usage":null` is removed from chunks
	cut     bool   // the stream was cut (a hard budget): the upstream body is closed
	closed  bool
	err     error
}

func (b *filterBody) Read(p []byte) (int, error) {
	for b.off == len(b.out) && b.err == nil {
		b.out, b.off = b.out[:0], 0
		n, err := b.src.Read(b.buf)
		b.process(b.buf[:n])
		if b.cut {
			b.closed, b.err = true, io.EOF
			b.src.Close()
			break
		}
		if err != nil {
			b.err = err
			if err == io.EOF {
				b.s.end()
				if b.f.m.CutBy() != "" { // the event the stream ended in overran
					b.out = append(b.out, b.f.m.cutEvent()...)
				} else {
					b.out = append(b.out, b.hold...) // an event the stream ended in
				}
				b.hold = b.hold[:0]
			}
		}
	}
	if b.off < len(b.out) {
		n := copy(p, b.out[b.off:])
		b.off += n
		return n, nil
	}
	return 0, b.err
}

func (b *filterBody) process(chunk []byte) {
	start := 0
	b.s.feed(chunk, func(i int, keep bool) {
		switch {
		case b.cut:
		case b.passing:
			b.out = append(b.out, chunk[start:i]...)
		case keep:
			b.hold = append(b.hold, chunk[start:i]...)
			if b.strip {
				// With include_usage, every other chunk carries "usage": null too; OpenAI
				// writes it compactly, and a quote inside a JSON string is escaped.
				b.out = append(b.out, bytes.ReplaceAll(b.hold, []byte(`,"usage":null`), nil)...)
			} else {
				b.out = append(b.out, b.hold...)
			}
		}
		if !b.cut && b.f.m.CutBy() != "" {
			b.cut = true
			b.out = append(b.out, b.f.m.cutEvent()...)
		}
		b.hold, b.passing, start = b.hold[:0], false, i
	})
	if b.cut {
		b.hold = b.hold[:0]
		return
	}
	rest := chunk[start:]
	if b.passing {
		b.out = append(b.out, rest...)
		return
	}
	b.hold = append(b.hold, rest...)
	if len(b.hold) > maxEvent {
		b.out = append(b.out, b.hold...)
		b.hold, b.passing = b.hold[:0], true
	}
}

func (b *filterBody) Close() error {
	var err error
	if !b.closed {
		b.closed = true
		err = b.src.Close()
	}
	if b.s.skipped {
		b.f.m.bad = true
	}
	b.f.call()
	return err
}

// jsonBody passes a JSON body on as it comes, keeping a copy of up to maxEvent bytes, read
// when the body ends.
type jsonBody struct {
	src  io.ReadCloser
	m    *Meter
	f    *finish
	text []byte
	over bool
	read bool
}

func (j *jsonBody) Read(p []byte) (int, error) {
	n, err := j.src.Read(p)
	if !j.over {
		if len(j.text)+n > maxEvent {
			j.over, j.text = true, nil
		} else {
			j.text = append(j.text, p[:n]...)
		}
	}
	if err == io.EOF && !j.read {
		j.read = true
		if j.over {
			j.m.bad = true
		} else {
			j.m.whole(j.text)
		}
		j.text = nil
	}
	return n, err
}

func (j *jsonBody) Close() error {
	err := j.src.Close()
	j.f.call()
	return err
}

// whole reads a JSON response body: one response object, or (Gemini's stream without
// alt=sse) an array of them.
func (m *Meter) whole(body []byte) {
	body = bytes.TrimSpace(body)
	if len(body) > 0 && body[0] == '[' {
		var parts []json.RawMessage
		if json.Unmarshal(body, &parts) != nil {
			m.bad = true
			return
		}
		for _, p := range parts {
			m.event(p)
		}
		return
	}
	if m.ep.API == Responses {
		// A response object as a whole is what response.completed carries.
		var v struct {
			Model string          `json:"model"`
			Usage json.RawMessage `json:"usage"`
		}
		if json.Unmarshal(body, &v) != nil {
			m.bad = true
			return
		}
		m.model(v.Model)
		m.responsesUsage(v.Usage)
		return
	}
	m.event(body)
}

func (m *Meter) model(s string) {
	if m.respModel == "" && s != "" {
		m.respModel = cut(s)
	}
}

// hasMember reports whether data has a member key whose value is not null. Inside a JSON
// string a quote is escaped: `"key"` in data is a member name.
func hasMember(data []byte, key string) bool {
	for {
		i := bytes.Index(data, []byte(key))
		if i < 0 {
			return false
		}
		data = bytes.TrimLeft(data[i+len(key):], " \t\r\n")
		if len(data) > 0 && data[0] == ':' {
			data = bytes.TrimLeft(data[1:], " \t\r\n")
			if len(data) > 0 && data[0] != 'n' {
				return true
			}
		}
	}
}

// event reads one event's data (or a whole response); it returns false for the usage-only
// chunk the broker asked for.
func (m *Meter) event(data []byte) bool {
	switch m.ep.API {
	case ChatCompletions:
		if !hasMember(data, `"usage"`) {
			if m.respModel == "" {
				m.peekModel(data)
			}
			return true
		}
		var v struct {
			Model   string            `json:"model"`
			Choices []json.RawMessage `json:"choices"`
			Usage   json.RawMessage   `json:"usage"`
		}
		if json.Unmarshal(data, &v) != nil {
			m.bad = true
			return true
		}
		m.model(v.Model)
		m.chatUsage(v.Usage)
		return !(m.asked && len(v.Choices) == 0)
	case Responses:
		if !hasMember(data, `"usage"`) {
			return true
		}
		var v struct {
			Response *struct {
				Model string          `json:"model"`
				Usage json.RawMessage `json:"usage"`
			} `json:"response"`
		}
		if json.Unmarshal(data, &v) != nil || v.Response == nil {
			m.bad = true
			return true
		}
		m.model(v.Response.Model)
		if len(v.Response.Usage) > 0 && !bytes.Equal(v.Response.Usage, []byte("null")) {
			m.responsesUsage(v.Response.Usage)
		}
	case Messages:
		if !hasMember(data, `"usage"`) && !hasMember(data, `"model"`) {
			return true
		}
		var v struct {
			Type    string `json:"type"`
			Model   string `json:"model"`
			Message *struct {
				Model string          `json:"model"`
				Usage json.RawMessage `json:"usage"`
			} `json:"message"`
			Usage json.RawMessage `json:"usage"`
		}
		if json.Unmarshal(data, &v) != nil {
			m.bad = true
			return true
		}
		switch v.Type {
		case "message_start":
			if v.Message == nil {
				m.bad = true
				return true
			}
			m.model(v.Message.Model)
			m.anthropicUsage(v.Message.Usage, true)
		case "message": // a whole response
			m.model(v.Model)
			m.anthropicUsage(v.Usage, true)
		case "message_delta":
			m.anthropicUsage(v.Usage, false)
		}
	case GenerateContent:
		if !hasMember(data, `"usageMetadata"`) {
			if m.respModel == "" {
				m.peekModel(data)
			}
			return true
		}
		var v struct {
			ModelVersion  string          `json:"modelVersion"`
			UsageMetadata json.RawMessage `json:"usageMetadata"`
		}
		if json.Unmarshal(data, &v) != nil {
			m.bad = true
			return true
		}
		m.model(v.ModelVersion)
		m.geminiUsage(v.UsageMetadata)
	}
	return true
}

// peekModel reads the model an event names, when the request did not say.
func (m *Meter) peekModel(data []byte) {
	if m.req.Model != "" || !bytes.Contains(data, []byte(`"model`)) {
		return
	}
	var v struct {
		Model        string `json:"model"`
		ModelVersion string `json:"modelVersion"`
	}
	if json.Unmarshal(data, &v) == nil {
		m.model(v.Model)
		m.model(v.ModelVersion)
	}
}

// count is a token count that must be present and not negative.
func count(p *int64, ok *bool) int64 {
	if p == nil || *p < 0 {
		*ok = false
		return 0
	}
	return *p
}

// optional is a token count that may be absent (0).
func optional(p *int64, ok *bool) int64 {
	if p == nil {
		return 0
	}
	return count(p, ok)
}

type cachedDetails struct {
	CachedTokens *int64 `json:"cached_tokens"`
}

// chatUsage: usage of a chat completion (prompt_tokens, completion_tokens,
// prompt_tokens_details.cached_tokens).
func (m *Meter) chatUsage(raw json.RawMessage) {
	var u struct {
		PromptTokens        *int64         `json:"prompt_tokens"`
		CompletionTokens    *int64         `json:"completion_tokens"`
		PromptTokensDetails *cachedDetails `json:"prompt_tokens_details"`
	}
	ok := json.Unmarshal(raw, &u) == nil
	in, out := count(u.PromptTokens, &ok), count(u.CompletionTokens, &ok)
	var cached int64
	if u.PromptTokensDetails != nil {
		cached = optional(u.PromptTokensDetails.CachedTokens, &ok)
	}
	m.set(ok, in, out, cached)
}

// responsesUsage: usage of a response (input_tokens, output_tokens,
// input_tokens_details.cached_tokens).
func (m *Meter) responsesUsage(raw json.RawMessage) {
	var u struct {
		InputTokens        *int64         `json:"input_tokens"`
		OutputTokens       *int64         `json:"output_tokens"`
		InputTokensDetails *cachedDetails `json:"input_tokens_details"`
	}
	ok := json.Unmarshal(raw, &u) == nil
	in, out := count(u.InputTokens, &ok), count(u.OutputTokens, &ok)
	var cached int64
	if u.InputTokensDetails != nil {
		cached = optional(u.InputTokensDetails.CachedTokens, &ok)
	}
	m.set(ok, in, out, cached)
}

// anthropicUsage: a message's usage (start) or a message_delta's. Anthropic's input_tokens
// leaves out the tokens read from and written to its cache: In is the three together, Cached
// the ones read. message_delta's counts are cumulative, and may restate the input ones.
func (m *Meter) anthropicUsage(raw json.RawMessage, start bool) {
	var u struct {
		InputTokens   *int64 `json:"input_tokens"`
		OutputTokens  *int64 `json:"output_tokens"`
		CacheCreation *int64 `json:"cache_creation_input_tokens"`
		CacheRead     *int64 `json:"cache_read_input_tokens"`
	}
	ok := json.Unmarshal(raw, &u) == nil
	if start {
		input := count(u.InputTokens, &ok)
		read := optional(u.CacheRead, &ok)
		in := input + optional(u.CacheCreation, &ok) + read
		m.set(ok, in, optional(u.OutputTokens, &ok), read)
		return
	}
	out := count(u.OutputTokens, &ok)
	if !ok {
		m.bad = true
		return
	}
	if !m.have {
		m.bad = true // a delta without the message_start it adds to
		return
	}
	m.out = out
	if u.InputTokens != nil {
		read := optional(u.CacheRead, &ok)
		if u.CacheRead == nil {
			read = m.cached
		}
		in := count(u.InputTokens, &ok) + optional(u.CacheCreation, &ok) + read
		if ok {
			m.in, m.cached = in, read
		}
	}
	if !ok {
		m.bad = true
	}
}

// geminiUsage: usageMetadata (promptTokenCount, candidatesTokenCount, thoughtsTokenCount,
// cachedContentTokenCount, toolUsePromptTokenCount). Members that are zero are left out, but
// a usageMetadata without promptTokenCount is no usage. Thinking tokens are output.
func (m *Meter) geminiUsage(raw json.RawMessage) {
	var u struct {
		Prompt   *int64 `json:"promptTokenCount"`
		ToolUse  *int64 `json:"toolUsePromptTokenCount"`
		Outputs  *int64 `json:"candidatesTokenCount"`
		Thoughts *int64 `json:"thoughtsTokenCount"`
		Cached   *int64 `json:"cachedContentTokenCount"`
	}
	ok := json.Unmarshal(raw, &u) == nil
	in := count(u.Prompt, &ok) + optional(u.ToolUse, &ok)
	out := optional(u.Outputs, &ok) + optional(u.Thoughts, &ok)
	m.set(ok, in, out, optional(u.Cached, &ok))
}

// set records usage read whole; usage that did not parse marks the call unreported.
func (m *Meter) set(ok bool, in, out, cached int64) {
	if !ok {
		m.bad = true
		return
	}
	m.in, m.out, m.cached, m.have = in, out, cached, true
}
