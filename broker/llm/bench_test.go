package llm

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	"github.com/capbroker/capbroker/broker/usage"
)

// BenchmarkStream reads a chat completion stream of 200 content chunks and the usage chunk, one
// event per read as an upstream sends them: unmetered (the bare body), metered and passed
// through (the agent asked for usage), and metered with the usage chunk taken out (the broker
// asked), and that with a hard budget that applies (an answer from the limiter after each
// event). ns/event is the cost each event pays.
func BenchmarkStream(b *testing.B) {
	var events [][]byte
	chunk := []byte(`data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n")
	for range 200 {
		events = append(events, chunk)
	}
	events = append(events,
		[]byte(`data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":200,"total_tokens":209,"prompt_tokens_details":{"cached_tokens":0}}}`+"\n\n"),
		[]byte("data: [DONE]\n\n"))
	run := func(b *testing.B, wrap func(*http.Response)) {
		buf := make([]byte, 32<<10)
		b.ReportAllocs()
		for b.Loop() {
			resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: io.NopCloser(&eventReader{events: events})}
			wrap(resp)
			for {
				if _, err := resp.Body.Read(buf); err != nil {
					break
				}
			}
			resp.Body.Close()
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(events)), "ns/event")
	}
	b.Run("unmetered", func(b *testing.B) { run(b, func(*http.Response) {}) })
	b.Run("metered", func(b *testing.B) {
		run(b, func(r *http.Response) {
			m, _, _ := Start(chatEP, []byte(`{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true}}`), Options{})
			m.Wrap(r, nil)
		})
	})
	b.Run("metered_asked", func(b *testing.B) {
		run(b, func(r *http.Response) {
			m, _, _ := Start(chatEP, []byte(`{"model":"gpt-4o-mini","stream":true}`), Options{})
			m.Wrap(r, nil)
		})
	})
	b.Run("metered_capped", func(b *testing.B) {
		run(b, func(r *http.Response) {
			m, _, _ := Start(chatEP, []byte(`{"model":"gpt-4o-mini","stream":true}`), Options{})
			m.Cap(&tokenLimit{limit: 1 << 40}, "a", nil)
			m.Wrap(r, nil)
		})
	})
}

// eventReader gives one event per read.
type eventReader struct {
	events [][]byte
	cur    *bytes.Reader
}

func (e *eventReader) Read(p []byte) (int, error) {
	for e.cur == nil || e.cur.Len() == 0 {
		if len(e.events) == 0 {
			return 0, io.EOF
		}
		e.cur = bytes.NewReader(e.events[0])
		e.events = e.events[1:]
	}
	return e.cur.Read(p)
}

// largeAnswer is a 4 MiB chat completion (logprobs with top_logprobs 20), its usage last.
func largeAnswer() []byte {
	var b bytes.Buffer
	b.WriteString(`{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"logprobs":{"content":[`)
	for i := 0; b.Len() < 4<<20; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"token":"tok","logprob":-0.01,"bytes":[116,111,107],"top_logprobs":[`)
		for j := range 20 {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`{"token":"alt","logprob":-1.5,"bytes":[97,108,116]}`)
		}
		b.WriteString("]}")
	}
	b.WriteString(`]},"finish_reason":"stop"}],"usage":{"prompt_tokens":100,"completion_tokens":20,"total_tokens":120}}`)
	return b.Bytes()
}

// BenchmarkLargeJSON reads a 4 MiB JSON answer in 32 KiB reads, as the broker passes it on:
// B/op is what metering holds for it (the read buffer is the benchmark's, not counted).
func BenchmarkLargeJSON(b *testing.B) {
	body := largeAnswer()
	buf := make([]byte, 32<<10)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(bytes.NewReader(body))}
		m, _, _ := Start(chatEP, []byte(`{"model":"m","logprobs":true,"top_logprobs":20}`), Options{})
		var reported bool
		m.Wrap(resp, func(c usage.Call) { reported = c.Reported })
		for {
			if _, err := resp.Body.Read(buf); err != nil {
				break
			}
		}
		resp.Body.Close()
		if !reported {
			b.Fatal("usage not found")
		}
	}
}
