package llm

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/capbroker/capbroker/broker/usage"
	"github.com/capbroker/capbroker/broker/wire/strictjson"
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
	bad       bool      // usage that did not parse, or a body whose usage could not be found
	ended     bool      // the response was read to its end
	text      int64     // bytes of generated text (streams) or of the body (JSON), for an estimate
	cap       *capState // a hard budget applies (cap.go), or nil
	stream    bool      // the response is a stream of events
}

// Options say how a call is metered.
type Options struct {
	// Budgeted: a tokens or cost budget applies to the call. A request body the broker cannot
	// read, and a Responses request run in the background, are then refused.
	Budgeted bool
	// Size is the request body's length when body is nil (-1 unknown), for an estimate.
	Size int64
}

// Start meters a call to ep whose request body is body (nil when it is not in memory). The
// body is read through strictjson: an ambiguous one is refused (an error wrapping
// strictjson.ErrAmbiguous or ErrAmbiguous), and so is a stream member of no clear value
// (ErrUnreadable). When the broker rewrote the request (the stream decision written
// canonically, usage asked for), it returns the body to send instead; otherwise nil.
func Start(ep Endpoint, body []byte, o Options) (*Meter, []byte, error) {
	req, nb, err := readRequest(ep, body, o.Budgeted)
	if body == nil {
		req.Size = o.Size
	}
	m := &Meter{ep: ep, req: req}
	if err != nil {
		return m, nil, err
	}
	if o.Budgeted && req.Background {
		return m, nil, &RequestError{"a background response (background: true) carries no usage the broker can meter, and a tokens or cost budget applies; send it without background", ErrUnreadable}
	}
	m.asked = req.Stream && ep.AskUsage && !req.IncludeUsage && (ep.API == ChatCompletions || ep.API == Completions)
	return m, nb, nil
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
		m.stream = true
		s := &sse{event: m.streamEvent, big: m.root}
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
		resp.Body = &jsonBody{src: resp.Body, m: m, f: f, s: skeleton{root: m.root}}
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

// Call is the call as read so far. A call whose usage was read whole counts what its
// provider reported. One whose usage could not be read (none, malformed, ambiguous, or the
// response cut short before it came) is charged an estimate, never nothing: the larger of what
// was reported and the request body's bytes / 4 for input, the generated text's bytes / 4 for
// output (a JSON body's bytes when its text could not be read); Estimated says so. A response
// with an error status is counted with no tokens (providers do not bill errors).
func (m *Meter) Call() usage.Call {
	c := usage.Call{Provider: m.ep.Provider, Model: m.req.Model}
	if c.Model == "" {
		c.Model = m.respModel
	}
	ok := m.status >= 200 && m.status < 300
	c.Reported = m.have && !m.bad && ok
	if c.Reported {
		c.In, c.Out, c.Cached = m.in, m.out, m.cached
	}
	estOut := (m.text + bytesPerToken - 1) / bytesPerToken
	if !m.ended && !m.stream {
		// A JSON answer is generated whole before it is sent: one the agent left before its
		// end cost what the request allowed, not the part of it that came.
		estOut = max(estOut, m.req.MaxOut)
	}
	switch {
	case m.cap != nil && m.cap.cutBy != "":
		// Cut at a hard budget: what was let through counts, estimated where not reported.
		c.In, c.Out, c.Cached = m.in, max(m.out, estOut), m.cached
		if !m.have || m.bad {
			c.In = max(m.in, m.estIn())
		}
		c.Estimated = c.Out != m.out || !c.Reported
	case ok && (!c.Reported || !m.ended):
		c.In, c.Out = max(m.in, m.estIn()), max(m.out, estOut)
		if c.Reported {
			c.Cached = m.cached
		}
		c.Estimated = c.In != m.in || c.Out != m.out || !c.Reported
	}
	return c
}

// estIn is the input estimate: the request body's bytes / 4.
func (m *Meter) estIn() int64 {
	if m.req.Size <= 0 {
		return 0
	}
	return (m.req.Size + bytesPerToken - 1) / bytesPerToken
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
	} else {
		p.f.m.text += int64(n) // unreadable: the output is estimated from its bytes
	}
	if err == io.EOF && !p.eof {
		p.eof = true
		p.f.m.ended = true
		if p.s != nil {
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
				b.f.m.ended = true
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

// jsonBody passes a JSON body on as it comes, finding its usage on the side (skeleton),
// whatever its size, in bounded memory.
type jsonBody struct {
	src  io.ReadCloser
	m    *Meter
	f    *finish
	s    skeleton
	read bool
}

func (j *jsonBody) Read(p []byte) (int, error) {
	n, err := j.src.Read(p)
	j.s.feed(p[:n])
	j.m.text += int64(n)
	if err == io.EOF && !j.read {
		j.read = true
		j.m.ended = true
		if !j.s.end() {
			j.m.bad = true
		}
	}
	return n, err
}

func (j *jsonBody) Close() error {
	err := j.src.Close()
	if !j.read {
		j.m.bad = true // cut short: what arrived is estimated
	}
	j.f.call()
	return err
}

// root reads the skeleton of one response object (a JSON body, an element of a JSON array of
// them, or a server-sent event too large to hold): a Responses API object has its usage at
// the top, as response.completed has it under response.
func (m *Meter) root(skel []byte) {
	if m.ep.API != Responses || bytes.Contains(skel, []byte(`"type"`)) {
		m.event(skel)
		return
	}
	var v struct {
		Model string         `json:"model"`
		Usage jsontext.Value `json:"usage"`
	}
	if !m.decode(skel, &v) {
		m.bad = true
		return
	}
	m.model(v.Model)
	m.responsesUsage(v.Usage)
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

// streamEvent reads one server-sent event's data, counting its generated text for an
// estimate.
func (m *Meter) streamEvent(data []byte) bool {
	m.text += deltaText(m.ep.API, data)
	return m.event(data)
}

// event reads one event's data (or a whole response's skeleton) through strictjson; it
// returns false for the usage-only chunk the broker asked for.
func (m *Meter) event(data []byte) bool {
	switch m.ep.API {
	case ChatCompletions, Completions, Embeddings:
		if !hasMember(data, `"usage"`) {
			if m.respModel == "" {
				m.peekModel(data)
			}
			return true
		}
		var v struct {
			Model   string           `json:"model"`
			Choices []jsontext.Value `json:"choices"`
			Usage   jsontext.Value   `json:"usage"`
		}
		if !m.decode(data, &v) {
			m.bad = true
			return true
		}
		m.model(v.Model)
		if m.ep.API == Embeddings {
			m.embeddingsUsage(v.Usage)
		} else {
			m.chatUsage(v.Usage)
		}
		return !(m.asked && len(v.Choices) == 0)
	case Responses:
		if !hasMember(data, `"usage"`) {
			return true
		}
		var v struct {
			Response *struct {
				Model string         `json:"model"`
				Usage jsontext.Value `json:"usage"`
			} `json:"response"`
		}
		if !m.decode(data, &v) || v.Response == nil {
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
				Model string         `json:"model"`
				Usage jsontext.Value `json:"usage"`
			} `json:"message"`
			Usage jsontext.Value `json:"usage"`
		}
		if !m.decode(data, &v) {
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
			ModelVersion  string         `json:"modelVersion"`
			UsageMetadata jsontext.Value `json:"usageMetadata"`
		}
		if !m.decode(data, &v) {
			m.bad = true
			return true
		}
		m.model(v.ModelVersion)
		m.geminiUsage(v.UsageMetadata)
	}
	return true
}

// decode reads an event (or a skeleton) through strictjson. An event with usage in two
// spellings a client may read as one (usage and Usage, a member twice) is not believed: each
// is read alone and the largest counts are kept, and the call is marked unreadable, so that it
// is charged at least those and at least the estimate (Call).
func (m *Meter) decode(data []byte, v any) bool {
	err := strictjson.Unmarshal(data, v)
	if errors.Is(err, strictjson.ErrAmbiguous) {
		m.largest(data, 0)
	}
	return err == nil
}

// largest reads, one by one, the members of an ambiguous object that are spelled like a usage
// member (at the top, or under response or message), and keeps the largest counts read.
func (m *Meter) largest(data []byte, depth int) {
	d := jsontext.NewDecoder(bytes.NewBuffer(data), jsontext.AllowDuplicateNames(true))
	if tok, err := d.ReadToken(); err != nil || tok.Kind() != '{' {
		return
	}
	for d.PeekKind() != '}' {
		tok, err := d.ReadToken()
		if err != nil {
			return
		}
		q, _ := jsontext.AppendQuote(nil, tok.String())
		v, err := d.ReadValue()
		if err != nil {
			return
		}
		switch {
		case looksLike(q, []string{"usage", "usagemetadata"}):
			one := &Meter{ep: m.ep}
			switch m.ep.API {
			case ChatCompletions, Completions:
				one.chatUsage(v)
			case Embeddings:
				one.embeddingsUsage(v)
			case Responses:
				one.responsesUsage(v)
			case Messages:
				one.anthropicUsage(v, true)
			case GenerateContent:
				one.geminiUsage(v)
			}
			if one.have {
				m.in, m.out, m.cached = max(m.in, one.in), max(m.out, one.out), 0
			}
		case depth == 0 && looksLike(q, innerNames) && len(v) > 0 && v[0] == '{':
			m.largest(bytes.Clone(v), 1)
		}
	}
	m.bad = true
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
	if strictjson.Unmarshal(data, &v) == nil {
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
func (m *Meter) chatUsage(raw jsontext.Value) {
	var u struct {
		PromptTokens        *int64         `json:"prompt_tokens"`
		CompletionTokens    *int64         `json:"completion_tokens"`
		PromptTokensDetails *cachedDetails `json:"prompt_tokens_details"`
	}
	ok := strictjson.Unmarshal(raw, &u) == nil
	in, out := count(u.PromptTokens, &ok), count(u.CompletionTokens, &ok)
	var cached int64
	if u.PromptTokensDetails != nil {
		cached = optional(u.PromptTokensDetails.CachedTokens, &ok)
	}
	m.set(ok, in, out, cached)
}

// embeddingsUsage: usage of embeddings (prompt_tokens, total_tokens; no output). A
// total_tokens larger than prompt_tokens counts the difference as output.
func (m *Meter) embeddingsUsage(raw jsontext.Value) {
	var u struct {
		PromptTokens *int64 `json:"prompt_tokens"`
		TotalTokens  *int64 `json:"total_tokens"`
	}
	ok := strictjson.Unmarshal(raw, &u) == nil
	in := count(u.PromptTokens, &ok)
	total := optional(u.TotalTokens, &ok)
	m.set(ok, in, max(total-in, 0), 0)
}

// responsesUsage: usage of a response (input_tokens, output_tokens,
// input_tokens_details.cached_tokens).
func (m *Meter) responsesUsage(raw jsontext.Value) {
	var u struct {
		InputTokens        *int64         `json:"input_tokens"`
		OutputTokens       *int64         `json:"output_tokens"`
		InputTokensDetails *cachedDetails `json:"input_tokens_details"`
	}
	ok := strictjson.Unmarshal(raw, &u) == nil
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
func (m *Meter) anthropicUsage(raw jsontext.Value, start bool) {
	var u struct {
		InputTokens   *int64 `json:"input_tokens"`
		OutputTokens  *int64 `json:"output_tokens"`
		CacheCreation *int64 `json:"cache_creation_input_tokens"`
		CacheRead     *int64 `json:"cache_read_input_tokens"`
	}
	ok := strictjson.Unmarshal(raw, &u) == nil
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
func (m *Meter) geminiUsage(raw jsontext.Value) {
	var u struct {
		Prompt   *int64 `json:"promptTokenCount"`
		ToolUse  *int64 `json:"toolUsePromptTokenCount"`
		Outputs  *int64 `json:"candidatesTokenCount"`
		Thoughts *int64 `json:"thoughtsTokenCount"`
		Cached   *int64 `json:"cachedContentTokenCount"`
	}
	ok := strictjson.Unmarshal(raw, &u) == nil
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
