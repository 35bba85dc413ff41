package broker

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/broker/scrub"
)

// serveRange answers a Range field over text as a server would: a 206 of the satisfiable part.
func serveRange(t *testing.T, text, field string) *http.Response {
	t.Helper()
	r, ok := parseRange(field)
	if !ok {
		t.Fatalf("the broker sent %q", field)
	}
	first, last, ok := r.within(int64(len(text)))
	if !ok {
		t.Fatalf("the widened range %q is not satisfiable", field)
	}
	part := text[first : last+1]
	h := http.Header{}
	h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", first, last, len(text)))
	return &http.Response{StatusCode: 206, Header: h, Body: io.NopCloser(strings.NewReader(part)), ContentLength: int64(len(part))}
}

// TestRangesJoinScrubbed: however an agent cuts a representation holding a secret into
// ranges, each range is answered as a 206 of its exact bytes, the secret masked in place, and
// the ranges join into the masked whole: no piece of the secret in any of them.
func TestRangesJoinScrubbed(t *testing.T) {
	const secret = "sk-canary-0123456789abcdef"
	s := scrub.New(secret, redacted, "c2stY2FuYXJ5", redacted) // a form shorter than the secret
	text := strings.Repeat("x", 100) + secret + strings.Repeat("y", 30) + secret + "z"
	masked := s.Masking().String(text)
	if len(masked) != len(text) || strings.Contains(masked, "canary") {
		t.Fatalf("masked whole: %q", masked)
	}
	for _, size := range []int{1, 3, 7, 25, 26, 64} {
		var joined strings.Builder
		for first := 0; first < len(text); first += size {
			field := fmt.Sprintf("bytes=%d-%d", first, first+size-1)
			if first+size >= len(text) && size%2 == 1 {
				field = fmt.Sprintf("bytes=%d-", first) // open-ended, for the last one
			}
			out := &http.Request{Header: http.Header{"Range": {field}}}
			rng := narrowRange(out, s)
			if rng == nil {
				t.Fatalf("%s: not sent as a range", field)
			}
			resp := serveRange(t, text, out.Header.Get("Range"))
			if err := scrubResponse(resp, s, false, rng); err != nil {
				t.Fatalf("%s: %v", field, err)
			}
			body, err := io.ReadAll(resp.Body)
			if err != nil || resp.ContentLength != int64(len(body)) {
				t.Fatalf("%s: %q, %v; length %d", field, body, err, resp.ContentLength)
			}
			last := min(first+size, len(text)) - 1
			if want := fmt.Sprintf("bytes %d-%d/%d", first, last, len(text)); resp.Header.Get("Content-Range") != want {
				t.Fatalf("%s: Content-Range %q, want %q", field, resp.Header.Get("Content-Range"), want)
			}
			joined.Write(body)
		}
		if joined.String() != masked {
			t.Fatalf("ranges of %d joined: %q, want %q", size, joined.String(), masked)
		}
	}
	// A suffix range is widened on its one side.
	out := &http.Request{Header: http.Header{"Range": {"bytes=-5"}}}
	rng := narrowRange(out, s)
	resp := serveRange(t, text, out.Header.Get("Range"))
	if err := scrubResponse(resp, s, false, rng); err != nil {
		t.Fatal(err)
	}
	if body, _ := io.ReadAll(resp.Body); string(body) != masked[len(masked)-5:] {
		t.Fatalf("suffix: %q", body)
	}
}

// TestRangeRefusals: what the broker does not send as a range, and answers it cannot cut.
func TestRangeRefusals(t *testing.T) {
	s := scrub.New("sk-canary-0123456789abcdef", redacted)
	for _, field := range []string{"bytes=0-1,5-9", "bytes=9-2", "items=0-5", "bytes=-0", "bytes=x-"} {
		out := &http.Request{Header: http.Header{"Range": {field}, "If-Range": {`"e"`}}}
		if rng := narrowRange(out, s); rng != nil || out.Header.Get("Range") != "" || out.Header.Get("If-Range") != "" {
			t.Errorf("%q: sent as %q (%v)", field, out.Header.Get("Range"), rng)
		}
	}
	text := strings.Repeat("a", 200)
	for name, c := range map[string]struct {
		contentRange, encoding string
	}{
		"narrower than asked": {"bytes 50-99/200", ""},
		"another part":        {"bytes 0-19/200", ""},
		"unknown size":        {"bytes 25-124/*", ""},
		"encoded":             {"bytes 25-124/200", "gzip"},
	} {
		out := &http.Request{Header: http.Header{"Range": {"bytes=50-99"}}}
		rng := narrowRange(out, s)
		h := http.Header{"Content-Range": {c.contentRange}}
		if c.encoding != "" {
			h.Set("Content-Encoding", c.encoding)
		}
		resp := &http.Response{StatusCode: 206, Header: h, Body: io.NopCloser(strings.NewReader(text[:100]))}
		if err := scrubResponse(resp, s, false, rng); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Past the end: the upstream had a satisfiable widened range; the agent gets the 416 it asked for.
	out := &http.Request{Header: http.Header{"Range": {"bytes=205-"}}}
	rng := narrowRange(out, s)
	resp := serveRange(t, text, out.Header.Get("Range"))
	if err := scrubResponse(resp, s, false, rng); err != nil || resp.StatusCode != 416 || resp.Header.Get("Content-Range") != "bytes */200" {
		t.Fatalf("past the end: %v, %d %q", err, resp.StatusCode, resp.Header.Get("Content-Range"))
	}
}
