package broker

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"strconv"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/broker/scrub"
	"github.com/capbroker/capbroker/broker/upstream"
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

	for _, major := range []int{1, 2} {
		t.Run(fmt.Sprintf("HTTP/%d known length is scrubbed whole and keeps an exact length", major), func(t *testing.T) {
			resp, up := response(int64(len(text)), major)
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
	}

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
		"unknown length":                            {-1, 1},
		"over the whole limit":                      {maxWholeScrub + 1, 1},
		"HTTP/0 (not a response read off the wire)": {int64(len(text)), 0},
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

// upstreamFunc answers each request with what its function builds.
type upstreamFunc struct {
	memoryUpstream
	answer func(*http.Request) *http.Response
	got    *http.Request
}

func (u *upstreamFunc) RoundTrip(r *http.Request, _ upstream.Pool) (*http.Response, error) {
	u.got = r
	return u.answer(r), nil
}

// answer is an upstream HTTP/1.1 response with header h and body.
func answer(r *http.Request, code int, h http.Header, body string) *http.Response {
	if h == nil {
		h = http.Header{}
	}
	return &http.Response{StatusCode: code, Status: strconv.Itoa(code) + " " + http.StatusText(code), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(strings.NewReader(body)), ContentLength: -1, Request: r}
}

func gzipped(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := io.WriteString(zw, s); err != nil || zw.Close() != nil {
		t.Fatal("gzip")
	}
	return b.String()
}

// chatRequest is the request the shipped policies grant the openai credential for.
func chatRequest() *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"gpt-4.1-mini"}`))
	r.Host = "api.openai.com"
	r.Header.Set("Content-Type", "application/json")
	return r
}

// holdsSecretFold reports whether s holds the secret in any letter case, as a header name
// that net/http has put in canonical form would.
func holdsSecretFold(s string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(benchSecret))
}

// TestScrubbedResponseShapes drives responses of every shape a scrubbed host could send
// through the pipeline, with the openai credential granted: the agent gets them scrubbed
// whole, or a 502.
func TestScrubbedResponseShapes(t *testing.T) {
	reflect := "auth=Bearer " + benchSecret + " end"
	scrubbed := "auth=Bearer " + redacted + " end"
	tests := map[string]struct {
		header http.Header
		code   int
		body   string
		want   int    // status the agent gets
		body2  string // the body the agent gets, when 200
	}{
		"the secret in header names": {
			header: http.Header{"X-" + benchSecret: {"1"}, textproto.CanonicalMIMEHeaderKey("X-" + benchSecret + "-b"): {"2"}, "X-Kept": {benchSecret}},
			code:   200, body: reflect, want: 200, body2: scrubbed,
		},
		"identity, then gzip, on two lines":   {header: http.Header{"Content-Encoding": {"identity", "gzip"}}, code: 200, body: "gz:" + reflect, want: 200, body2: scrubbed},
		"identity, then gzip, on one line":    {header: http.Header{"Content-Encoding": {"identity, gzip"}}, code: 200, body: "gz:" + reflect, want: 200, body2: scrubbed},
		"x-gzip in capitals":                  {header: http.Header{"Content-Encoding": {" X-GZIP "}}, code: 200, body: "gz:" + reflect, want: 200, body2: scrubbed},
		"gzip twice, on two lines":            {header: http.Header{"Content-Encoding": {"gzip", "gzip"}}, code: 200, body: "gz:gz:" + reflect, want: 502},
		"gzip twice, on one line":             {header: http.Header{"Content-Encoding": {"gzip,gzip"}}, code: 200, body: "gz:gz:" + reflect, want: 502},
		"gzip, then br":                       {header: http.Header{"Content-Encoding": {"gzip", "br"}}, code: 200, body: "gz:" + reflect, want: 502},
		"an unknown coding":                   {header: http.Header{"Content-Encoding": {"x-custom"}}, code: 200, body: reflect, want: 502},
		"gzip and per-message gRPC":           {header: http.Header{"Content-Encoding": {"gzip"}, "Grpc-Encoding": {"identity", "gzip"}}, code: 200, body: "gz:" + reflect, want: 502},
		"a 206":                               {header: http.Header{"Content-Range": {"bytes 0-9/40"}}, code: 206, body: reflect[:10], want: 502},
		"a 200 that says it is a range":       {header: http.Header{"Content-Range": {"bytes 10-19/40"}}, code: 200, body: reflect[10:20], want: 502},
		"multipart/byteranges":                {header: http.Header{"Content-Type": {"Multipart/Byteranges; boundary=x"}}, code: 200, body: reflect, want: 502},
		"a 416 names the length, and is sent": {header: http.Header{"Content-Range": {"bytes */40"}}, code: 416, body: "", want: 416},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			br, tun := benchBroker(t, true)
			body := tc.body
			for strings.HasPrefix(body, "gz:") {
				body = gzipped(t, strings.TrimPrefix(body, "gz:"))
			}
			br.setTransport(&upstreamFunc{answer: func(r *http.Request) *http.Response { return answer(r, tc.code, tc.header, body) }})
			w := httptest.NewRecorder()
			br.serveTunnel(w, chatRequest(), tun)
			if w.Code != tc.want {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.want, w.Body)
			}
			for k, vs := range w.Header() {
				if holdsSecretFold(k) || holdsSecretFold(strings.Join(vs, ",")) {
					t.Errorf("the agent got the secret in header %q: %q", k, vs)
				}
			}
			if strings.Contains(w.Body.String(), benchSecret) {
				t.Errorf("the agent got the secret in the body: %q", w.Body)
			}
			if tc.want == 200 {
				if w.Body.String() != tc.body2 {
					t.Errorf("body %q, want %q", w.Body, tc.body2)
				}
				if w.Header().Get("Content-Encoding") != "" {
					t.Errorf("a decoded body still says Content-Encoding %q", w.Header().Get("Content-Encoding"))
				}
			}
			if name == "the secret in header names" && w.Header().Get("X-Kept") != redacted {
				t.Errorf("a header holding the secret in its value only: %q", w.Header().Get("X-Kept"))
			}
		})
	}
}

// TestTrailerNamesAreScrubbed: a trailer named after the secret is neither announced to the
// agent nor sent, whether the upstream announced it or not.
func TestTrailerNamesAreScrubbed(t *testing.T) {
	br, tun := benchBroker(t, true)
	announced, late := "X-A-"+benchSecret, "x-l-"+benchSecret
	br.setTransport(&upstreamFunc{answer: func(r *http.Request) *http.Response {
		resp := answer(r, 200, nil, "body")
		resp.Trailer = http.Header{announced: nil, "X-Ok": nil}
		resp.Body = &trailerFiller{Reader: strings.NewReader("body"), fill: func() {
			resp.Trailer[announced] = []string{"v"}
			resp.Trailer[late] = []string{"v " + benchSecret}
			resp.Trailer["X-Ok"] = []string{"ok " + benchSecret}
		}}
		return resp
	}})
	w := httptest.NewRecorder()
	br.serveTunnel(w, chatRequest(), tun)
	res := w.Result()
	if _, err := io.ReadAll(res.Body); err != nil {
		t.Fatal(err)
	}
	for _, h := range []http.Header{w.Header(), res.Trailer} {
		for k, vs := range h {
			if holdsSecretFold(k) || holdsSecretFold(strings.Join(vs, ",")) {
				t.Errorf("the agent got the secret in %q: %q", k, vs)
			}
		}
	}
	if got := res.Trailer.Get("X-Ok"); got != "ok "+redacted {
		t.Errorf("trailer X-Ok = %q", got)
	}
}

// trailerFiller is a body whose trailers are filled in at its end, as the transport does.
type trailerFiller struct {
	io.Reader
	fill func()
}

func (f *trailerFiller) Read(p []byte) (int, error) {
	n, err := f.Reader.Read(p)
	if err == io.EOF {
		f.fill()
	}
	return n, err
}

func (*trailerFiller) Close() error { return nil }

// TestReasonPhraseIsStandard: the agent never gets the upstream's reason phrase, which could
// carry a secret: a 101's status line is written as respond leaves it.
func TestReasonPhraseIsStandard(t *testing.T) {
	br, _ := benchBroker(t, true)
	for code, want := range map[int]string{101: "101 Switching Protocols", 200: "200 OK", 599: "599 status code 599"} {
		for _, s := range []*scrub.Replacer{scrub.New(), scrub.New(benchSecret, redacted)} {
			r := chatRequest()
			x := br.begin("request", r)
			up := answer(r, code, nil, "")
			up.Status = strconv.Itoa(code) + " " + benchSecret
			up.Body = http.NoBody
			if code == 101 {
				up.Body = upstreamConn{strings.NewReader("")}
			}
			resp, err := x.respond(up, s, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Status != want {
				t.Errorf("status %q, want %q", resp.Status, want)
			}
			resp.Body.Close()
		}
	}
}

// TestRangeHeadersWidened: a range request to a host with a credential bound, granted or not,
// goes with its range widened by the longest secret's forms (ranges.go); to another host, as
// the agent sent it.
func TestRangeHeadersWidened(t *testing.T) {
	for name, c := range map[string]struct {
		full    bool
		host    string
		widened bool
	}{
		"granted":                     {true, "api.openai.com", true},
		"not granted, but bound":      {false, "api.openai.com", true},
		"a host without a credential": {false, "example.net", false},
	} {
		t.Run(name, func(t *testing.T) {
			br, tun := benchBroker(t, c.full)
			tun.target = newTarget("https", c.host, 443)
			up := &recordingUpstream{}
			br.setTransport(up)
			r := chatRequest()
			r.Host = c.host
			r.Header.Set("Range", "bytes=20-29")
			r.Header.Set("If-Range", `"etag"`)
			w := httptest.NewRecorder()
			br.serveTunnel(w, r, tun)
			if w.Code != 200 || up.got == nil {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			got := up.got.Header.Get("Range")
			if up.got.Header.Get("If-Range") != `"etag"` {
				t.Errorf("If-Range %q reached the upstream", up.got.Header.Get("If-Range"))
			}
			if !c.widened {
				if got != "bytes=20-29" {
					t.Errorf("Range %q reached the upstream, want the agent's", got)
				}
				return
			}
			// At least the secret's length less one on each side (its longest form is longer).
			var first, last int
			if _, err := fmt.Sscanf(got, "bytes=%d-%d", &first, &last); err != nil || first != 0 || last < 29+len(benchSecret)-1 {
				t.Errorf("Range %q reached the upstream; want 20-29 widened by at least %d", got, len(benchSecret)-1)
			}
		})
	}
}

// TestDecodeForScrubErrorsHoldNoUpstreamText: the refusal is audited, and a coding's name is
// the upstream's text, which could be a secret.
func TestDecodeForScrubErrorsHoldNoUpstreamText(t *testing.T) {
	for _, h := range []http.Header{
		{"Content-Encoding": {"gzip", benchSecret}},
		{"Grpc-Encoding": {benchSecret}},
	} {
		resp := &http.Response{Header: h, Body: io.NopCloser(strings.NewReader("x"))}
		err := decodeForScrub(resp)
		if err == nil || strings.Contains(err.Error(), benchSecret) {
			t.Errorf("%v: err = %v, want a refusal without the upstream's text", h, err)
		}
	}
	// Nothing to decode in a response without a body, whatever it says.
	if err := decodeForScrub(&http.Response{Header: http.Header{"Content-Encoding": {"br"}}, Body: http.NoBody}); err != nil {
		t.Errorf("a bodiless br response: %v", err)
	}
}

// TestHTTP2WholeBodyTrailers: a small HTTP/2 response of known length is read whole, over a
// real HTTP/2 connection, where trailers nobody announced arrive with the body's end. Without
// trailers it reaches the agent with its exact length, unflushed (headers and body in one
// write); with them, chunked, its trailers scrubbed, names and values.
func TestHTTP2WholeBodyTrailers(t *testing.T) {
	body := "auth=Bearer " + benchSecret + " end"
	scrubbed := "auth=Bearer " + redacted + " end"
	late := "X-L-" + benchSecret
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		io.WriteString(w, body)
		if r.URL.Query().Get("trailers") != "" {
			w.Header().Set(http.TrailerPrefix+"X-Ok", "ok "+benchSecret)
			w.Header().Set(http.TrailerPrefix+late, "v")
		}
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	client := srv.Client()

	for _, trailers := range []bool{false, true} {
		t.Run(fmt.Sprintf("trailers %v", trailers), func(t *testing.T) {
			br, tun := benchBroker(t, true)
			var proto int
			br.setTransport(&upstreamFunc{answer: func(r *http.Request) *http.Response {
				u := srv.URL + "/"
				if trailers {
					u += "?trailers=1"
				}
				resp, err := client.Get(u)
				if err != nil {
					t.Error(err)
					return answer(r, 599, nil, "")
				}
				proto = resp.ProtoMajor
				return resp
			}})
			w := httptest.NewRecorder()
			br.serveTunnel(w, chatRequest(), tun)
			res := w.Result()
			got, err := io.ReadAll(res.Body)
			if err != nil || w.Code != 200 || proto != 2 {
				t.Fatalf("status %d, upstream HTTP/%d, %v", w.Code, proto, err)
			}
			if string(got) != scrubbed {
				t.Errorf("body %q, want %q", got, scrubbed)
			}
			for _, h := range []http.Header{w.Header(), res.Trailer} {
				for k, vs := range h {
					if holdsSecretFold(k) || holdsSecretFold(strings.Join(vs, ",")) {
						t.Errorf("the agent got the secret in %q: %q", k, vs)
					}
				}
			}
			if !trailers {
				if w.Header().Get("Content-Length") != strconv.Itoa(len(scrubbed)) || w.Flushed {
					t.Errorf("Content-Length %q, flushed %v: the body was not held whole", w.Header().Get("Content-Length"), w.Flushed)
				}
				return
			}
			if w.Header().Get("Content-Length") != "" {
				t.Errorf("Content-Length %q with trailers: they would not reach the agent", w.Header().Get("Content-Length"))
			}
			if got := res.Trailer.Get("X-Ok"); got != "ok "+redacted {
				t.Errorf("trailer X-Ok = %q, want it scrubbed", got)
			}
		})
	}
}
