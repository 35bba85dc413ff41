package broker

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/broker/scrub"
)

// closeRecorder is an upstream body that records whether it was read to its end and closed.
type closeRecorder struct {
	io.Reader
	eof, closed bool
}

func (c *closeRecorder) Read(p []byte) (int, error) {
	n, err := c.Reader.Read(p)
	if err == io.EOF {
		c.eof = true
	}
	return n, err
}

func (c *closeRecorder) Close() error { c.closed = true; return nil }

func TestScrubBody(t *testing.T) {
	const secret = "sk-canary-0123456789abcdef"
	s := scrub.New(secret, redacted)
	// Larger than net/http's 2 KiB, under which the server works out a Content-Length itself.
	text := strings.Repeat("x", 20<<10) + secret + strings.Repeat("y", 100) + secret
	want := strings.Repeat("x", 20<<10) + redacted + strings.Repeat("y", 100) + redacted

	response := func(length int64, major int) (*http.Response, *closeRecorder) {
		body := &closeRecorder{Reader: strings.NewReader(text)}
		h := http.Header{}
		if length >= 0 {
			h.Set("Content-Length", strconv.FormatInt(length, 10))
		}
		return &http.Response{StatusCode: 200, ProtoMajor: major, Header: h, Body: body, ContentLength: length}, body
	}

	t.Run("known length is scrubbed whole and keeps an exact length", func(t *testing.T) {
		resp, up := response(int64(len(text)), 1)
		if err := scrubBody(resp, s); err != nil {
			t.Fatal(err)
		}
		if !up.eof || !up.closed {
			t.Errorf("upstream body read to its end %v, closed %v: its connection would not go back to the pool", up.eof, up.closed)
		}
		rec := httptest.NewRecorder()
		if !copyFlushing(rec, resp.Body) {
			t.Fatal("copyFlushing did not reach the end of the body")
		}
		if got := rec.Body.Bytes(); string(got) != want {
			t.Fatalf("body not scrubbed: %d bytes, holds the secret: %v", len(got), bytes.Contains(got, []byte(secret)))
		}
		if rec.Flushed {
			t.Error("a body held whole was flushed: its headers and body would not leave in one write")
		}
		if resp.ContentLength != int64(len(want)) || resp.Header.Get("Content-Length") != strconv.Itoa(len(want)) {
			t.Errorf("length %d, header %q; the scrubbed body has %d bytes", resp.ContentLength, resp.Header.Get("Content-Length"), len(want))
		}
	})

	t.Run("a secret as long as its replacement is scrubbed too", func(t *testing.T) {
		const same = "sk-0123456" // len(redacted): the body's length does not change
		body := "a=" + same + " b=" + same
		resp := &http.Response{StatusCode: 200, ProtoMajor: 1, Header: http.Header{"Content-Length": {strconv.Itoa(len(body))}},
			Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body))}
		if err := scrubBody(resp, scrub.New(same, redacted)); err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		if string(got) != "a="+redacted+" b="+redacted || resp.ContentLength != int64(len(body)) {
			t.Fatalf("got %q, length %d", got, resp.ContentLength)
		}
	})

	for name, c := range map[string]struct {
		length int64
		major  int
	}{
		"unknown length":             {-1, 1},
		"over the whole limit":       {maxWholeScrub + 1, 1},
		"HTTP/2 (may have trailers)": {int64(len(text)), 2},
	} {
		t.Run(name+" streams", func(t *testing.T) {
			resp, up := response(c.length, c.major)
			if err := scrubBody(resp, s); err != nil {
				t.Fatal(err)
			}
			if up.eof || up.closed {
				t.Error("the upstream body was read before the agent asked for it")
			}
			if resp.ContentLength != -1 || resp.Header.Get("Content-Length") != "" {
				t.Errorf("length %d, header %q: a streamed scrubbed body has no length", resp.ContentLength, resp.Header.Get("Content-Length"))
			}
			got, _ := io.ReadAll(resp.Body)
			if string(got) != want {
				t.Fatalf("body not scrubbed: holds the secret: %v", bytes.Contains(got, []byte(secret)))
			}
		})
	}

	for name, length := range map[string]int64{"shorter": int64(len(text)) + 10, "longer": int64(len(text)) - 10} {
		t.Run("a body "+name+" than its length is an error", func(t *testing.T) {
			resp, up := response(length, 1)
			err := scrubBody(resp, s)
			if err == nil || strings.Contains(err.Error(), secret) {
				t.Fatalf("err = %v, want an error without the secret", err)
			}
			if !up.closed {
				t.Error("the upstream body was not closed")
			}
		})
	}
}
