package http2srv

import (
	"bytes"
	"io"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/capbroker/capbroker/internal/tcppair"
)

// FuzzConn feeds frames, as an agent would send them after the connection preface, to a
// connection whose handler reads the body and answers with a body and trailers. Whatever the
// frames, the server must not panic, must end the connection when the agent goes away (no
// goroutine left waiting: Serve returns and every handler ends), and must write only well
// formed frames (every one the client side reads parses).
func FuzzConn(f *testing.F) {
	for _, seed := range seedFrames() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		handlers := make(chan struct{}, 1024)
		s := &Server{
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer func() { handlers <- struct{}{} }()
				b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
				w.Header().Set("Trailer", "X-T")
				w.Write(b)
				w.(http.Flusher).Flush()
				w.Header().Set("X-T", r.Trailer.Get("X-T"))
			}),
			ReadHeaderTimeout: time.Second, IdleTimeout: time.Second, PingTimeout: time.Second,
			MaxHeaderBytes: 8 << 10, MaxConcurrentStreams: 8,
		}
		a, b := tcppair.New(t)
		ended := make(chan struct{})
		conn := s.NewConn(b, func() { close(ended) })
		served := make(chan struct{})
		go func() { conn.Serve(); close(served) }()
		// Read what the server writes, frame by frame, until it closes.
		readErr := make(chan error, 1)
		go func() {
			fr := http2.NewFramer(io.Discard, a)
			fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
			fr.SetMaxReadFrameSize(maxFrame)
			for {
				if _, err := fr.ReadFrame(); err != nil {
					var ce http2.ConnectionError
					var se http2.StreamError
					if errorAs(err, &ce) || errorAs(err, &se) {
						readErr <- err
						return
					}
					readErr <- nil
					return
				}
			}
		}()
		_, _ = a.Write(append([]byte(http2.ClientPreface), data...))
		_ = a.CloseWrite() // the agent is done sending
		select {
		case <-served:
		case <-time.After(10 * time.Second):
			t.Fatal("the connection was not ended after the agent went away")
		}
		<-ended
		a.Close()
		if err := <-readErr; err != nil {
			t.Fatalf("the server wrote a malformed frame: %v", err)
		}
	})
}

func errorAs[T error](err error, target *T) bool {
	e, ok := err.(T)
	if ok {
		*target = e
	}
	return ok
}

// seedFrames are frame sequences an agent sends: a GET, a POST with a body and trailers,
// control frames, a header block in CONTINUATIONs, and a few it must not.
func seedFrames() [][]byte {
	var seeds [][]byte
	build := func(f func(fr *http2.Framer, block func(...string) []byte)) {
		var buf bytes.Buffer
		fr := http2.NewFramer(&buf, nil)
		fr.AllowIllegalWrites = true
		var hb bytes.Buffer
		enc := hpack.NewEncoder(&hb)
		block := func(kv ...string) []byte {
			hb.Reset()
			for i := 0; i+1 < len(kv); i += 2 {
				enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
			}
			return append([]byte(nil), hb.Bytes()...)
		}
		fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
		f(fr, block)
		seeds = append(seeds, buf.Bytes())
	}
	req := []string{":method", "POST", ":scheme", "https", ":authority", "a.test", ":path", "/x"}
	build(func(fr *http2.Framer, block func(...string) []byte) {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(":method", "GET", ":scheme", "https", ":authority", "a.test", ":path", "/"), EndStream: true, EndHeaders: true})
	})
	build(func(fr *http2.Framer, block func(...string) []byte) {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(append(req, "trailer", "x-t", "content-length", "5")...), EndHeaders: true})
		fr.WriteData(1, false, []byte("hel"))
		fr.WriteDataPadded(1, false, []byte("lo"), []byte{0, 0, 0})
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block("x-t", "v"), EndStream: true, EndHeaders: true})
		fr.WriteWindowUpdate(0, 1000)
		fr.WritePing(false, [8]byte{1})
	})
	build(func(fr *http2.Framer, block func(...string) []byte) {
		b := block(append(req, "x-long", string(bytes.Repeat([]byte("v"), 300)))...)
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: b[:10]})
		fr.WriteContinuation(3, true, b[10:])
		fr.WriteRSTStream(3, http2.ErrCodeCancel)
		fr.WritePriority(5, http2.PriorityParam{StreamDep: 5})
		fr.WriteData(7, true, []byte("idle"))
	})
	build(func(fr *http2.Framer, block func(...string) []byte) {
		fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1}, http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 14})
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(append(req, "content-length", "1")...), EndHeaders: true})
		fr.WriteData(1, true, []byte("ab"))
		fr.WriteGoAway(0, http2.ErrCodeNo, nil)
	})
	return seeds
}
