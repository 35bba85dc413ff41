package broker

import (
	"bytes"
	"encoding/binary"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/broker/scrub"
)

const wsSecret = "sk-secret-1"

// wsFrame is a frame as the tests write and read them.
type wsFrame struct {
	fin     bool
	op      byte
	payload string
}

// upstreamConn is the upstream side of an upgraded connection: it reads what the server
// sent, and takes (and drops) what is written to it.
type upstreamConn struct{ io.Reader }

func (upstreamConn) Write(p []byte) (int, error) { return len(p), nil }
func (upstreamConn) Close() error                { return nil }

// scrubFrames runs raw server bytes through a scrubbed WebSocket and returns what the agent
// would get, and the error that ended the stream.
func scrubFrames(t *testing.T, raw []byte) ([]byte, error) {
	t.Helper()
	resp := &http.Response{Header: http.Header{}, Body: upstreamConn{bytes.NewReader(raw)}}
	if err := scrubWebSocket(resp, scrub.New(wsSecret, redacted)); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	buf := make([]byte, 7) // small reads: frames are returned across several
	for {
		n, err := resp.Body.Read(buf)
		out.Write(buf[:n])
		if err != nil {
			return out.Bytes(), err
		}
	}
}

// parseFrames reads unmasked frames; it fails the test on anything else.
func parseFrames(t *testing.T, b []byte) []wsFrame {
	t.Helper()
	var frames []wsFrame
	for len(b) > 0 {
		if len(b) < 2 || b[1]&0x80 != 0 {
			t.Fatalf("bad frame header % x", b[:min(len(b), 2)])
		}
		n, b0 := uint64(b[1]&0x7f), b[0]
		b = b[2:]
		switch n {
		case 126:
			n, b = uint64(binary.BigEndian.Uint16(b)), b[2:]
		case 127:
			n, b = binary.BigEndian.Uint64(b), b[8:]
		}
		frames = append(frames, wsFrame{b0&0x80 != 0, b0 & 0x0f, string(b[:n])})
		b = b[n:]
	}
	return frames
}

func TestWebSocketFramesAreScrubbed(t *testing.T) {
	long := strings.Repeat("x", 70000) + wsSecret // a 64-bit length, the secret at its end
	in := []wsFrame{
		{false, wsText, "hello sk-sec"},
		{true, 0x9, "ping " + wsSecret}, // a control frame between fragments
		{false, wsContinuation, "ret-1 and sk-"},
		{true, wsContinuation, "more"},
		{true, wsBinary, strings.Repeat("b", 200) + wsSecret},
		{true, wsText, long},
		{true, wsClose, "\x03\xe8bye " + wsSecret},
	}
	var raw []byte
	for _, f := range in {
		raw = appendFrame(raw, f.fin, f.op, []byte(f.payload))
	}
	out, err := scrubFrames(t, raw)
	if err != io.EOF {
		t.Fatalf("stream ended with %v, want io.EOF", err)
	}
	got := parseFrames(t, out)
	want := []wsFrame{
		{false, wsText, "hello "}, // "sk-sec" may begin the secret: held for the next fragment
		{true, 0x9, "ping " + redacted},
		{false, wsContinuation, redacted + " and "},
		{true, wsContinuation, "sk-more"}, // not a secret after all, passed on at the end
		{true, wsBinary, strings.Repeat("b", 200) + redacted},
		{true, wsText, strings.Repeat("x", 70000) + redacted},
		{true, wsClose, "\x03\xe8bye " + redacted},
	}
	if len(got) != len(want) {
		t.Fatalf("%d frames, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("frame %d: %+.80v, want %+.80v", i, got[i], want[i])
		}
	}
	if bytes.Contains(out, []byte(wsSecret)) {
		t.Fatal("the secret reached the agent")
	}
}

func TestWebSocketControlFrameStaysSmall(t *testing.T) {
	s := scrub.New("k", redacted) // every "k" grows to ten bytes
	resp := &http.Response{Header: http.Header{}, Body: upstreamConn{bytes.NewReader(appendFrame(nil, true, 0x9, bytes.Repeat([]byte("k"), 100)))}}
	if err := scrubWebSocket(resp, s); err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	if f := parseFrames(t, out); len(f) != 1 || len(f[0].payload) != maxControlLen || strings.Contains(f[0].payload, "k") {
		t.Fatalf("ping: %+v", f)
	}
}

// TestWebSocketRefusesWhatItCannotScrub: frames that are not a server's plain frames end the
// connection rather than pass unscrubbed.
func TestWebSocketRefusesWhatItCannotScrub(t *testing.T) {
	frame := func(b0, b1 byte, rest ...byte) []byte { return append([]byte{b0, b1}, rest...) }
	cases := map[string][]byte{
		"masked":                  frame(0x81, 0x85, 1, 2, 3, 4, 'a', 'b', 'c', 'd', 'e'),
		"compressed (RSV1)":       frame(0xc1, 0x01, 'a'),
		"over the frame limit":    frame(0x82, 127, 0, 0, 0, 0, 0, 0x20, 0, 0),
		"continuation first":      frame(0x80, 0x01, 'a'),
		"text inside a message":   append(frame(0x01, 0x01, 'a'), frame(0x81, 0x01, 'b')...),
		"fragmented control":      frame(0x09, 0x01, 'a'),
		"long control":            append(frame(0x89, 126, 0, 126), make([]byte, 126)...),
		"reserved opcode":         frame(0x83, 0x01, 'a'),
		"cut inside a frame":      frame(0x81, 0x05, 'a', 'b'),
		"cut inside a length":     frame(0x81, 126, 0),
		"secret, then cut inside": append(appendFrame(nil, true, wsText, []byte(wsSecret)), 0x81),
	}
	for name, raw := range cases {
		t.Run(name, func(t *testing.T) {
			out, err := scrubFrames(t, raw)
			if err == nil || err == io.EOF {
				t.Fatalf("stream ended with %v, want an error", err)
			}
			if bytes.Contains(out, []byte(wsSecret)) {
				t.Fatal("the secret reached the agent")
			}
		})
	}
}

func TestWebSocketExtensionIsRefused(t *testing.T) {
	resp := &http.Response{Header: http.Header{"Sec-Websocket-Extensions": {"permessage-deflate"}}, Body: upstreamConn{strings.NewReader("")}}
	if err := scrubWebSocket(resp, scrub.New(wsSecret, redacted)); err == nil {
		t.Fatal("an upgrade with compressed frames was accepted for scrubbing")
	}
}

// FuzzWebSocketScrub feeds arbitrary server bytes to a scrubbed WebSocket: it never panics,
// what it passes on is well-formed server frames, and no data message or control frame the
// agent can assemble from them holds the secret (go test -fuzz FuzzWebSocketScrub ./broker).
func FuzzWebSocketScrub(f *testing.F) {
	f.Add(appendFrame(appendFrame(nil, false, wsText, []byte("a sk-sec")), true, wsContinuation, []byte("ret-1 b")))
	f.Add(appendFrame(appendFrame(nil, true, 0x9, []byte(wsSecret)), true, wsBinary, []byte("x"+wsSecret)))
	f.Add(appendFrame(nil, true, wsClose, []byte("\x03\xe8"+wsSecret)))
	f.Fuzz(func(t *testing.T, raw []byte) {
		out, _ := scrubFrames(t, raw)
		var message []byte
		for _, fr := range parseFrames(t, out) {
			if fr.op >= wsClose {
				if strings.Contains(fr.payload, wsSecret) {
					t.Fatalf("a control frame carried the secret: %q", fr.payload)
				}
				continue
			}
			if fr.op != wsContinuation {
				message = message[:0]
			}
			message = append(message, fr.payload...)
			if bytes.Contains(message, []byte(wsSecret)) {
				t.Fatalf("a message carried the secret: %q", message)
			}
		}
	})
}

// TestWebSocketAcceptRFC6455: the accept value is the one RFC 6455 §1.3 gives for its sample
// key, so the broker accepts the 101 of every real server, not only of tests that share its
// constant.
func TestWebSocketAcceptRFC6455(t *testing.T) {
	if got, want := webSocketAccept("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="; got != want {
		t.Errorf("webSocketAccept(RFC sample) = %q, want %q", got, want)
	}
}
