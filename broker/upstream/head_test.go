package upstream

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"testing"
)

// writeSimple writes the very bytes Request.Write writes, for every request it takes, and
// takes the requests the broker sends without a body or with one in memory.
func TestWriteSimpleAsRequestWrite(t *testing.T) {
	// checkWith has writeSimple and Request.Write each write a request made by mk.
	checkWith := func(t *testing.T, mk func() *http.Request, wantTaken bool) {
		t.Helper()
		var got, want bytes.Buffer
		bw := bufio.NewWriter(&got)
		req := mk()
		taken := writeSimple(bw, req)
		bw.Flush()
		if taken != wantTaken {
			t.Fatalf("writeSimple took %s %v (Host %q, header %q, body %T %d, close %v) = %v, want %v",
				req.Method, req.URL, req.Host, req.Header, req.Body, req.ContentLength, req.Close, taken, wantTaken)
		}
		if !taken {
			if got.Len() != 0 {
				t.Fatalf("writeSimple wrote %q for a request it did not take", got.String())
			}
			return
		}
		bw = bufio.NewWriter(&want)
		if err := mk().Write(bw); err != nil {
			t.Fatalf("Request.Write: %v (writeSimple wrote %q)", err, got.String())
		}
		bw.Flush()
		if got.String() != want.String() {
			t.Fatalf("writeSimple wrote\n%q\nRequest.Write\n%q", got.String(), want.String())
		}
	}
	check := func(t *testing.T, req *http.Request, wantTaken bool) {
		t.Helper()
		checkWith(t, func() *http.Request { return req }, wantTaken)
	}
	newReq := func(method, rawURL string) *http.Request {
		req, err := http.NewRequest(method, rawURL, nil)
		if err != nil {
			t.Fatal(err)
		}
		return req
	}

	t.Run("cases", func(t *testing.T) {
		methods := []string{"", "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "PROPFIND"}
		urls := []string{
			"https://api.example.com/", "https://api.example.com", "http://127.0.0.1:8080/v1/x?a=b&c=d",
			"https://example.com/a%20b/c?", "https://example.com/p/../q;x=1#frag",
			"https://[::1]:8443/x", "https://example.com/%E2%82%AC?q=%00", "https://example.com/a b",
			"https://xn--bcher-kva.example/", "https://example.com:443/?",
		}
		headers := []http.Header{
			nil,
			{},
			{"User-Agent": {"agent/1.0"}},
			{"User-Agent": {""}},
			{"User-Agent": {"  spaced\t "}, "Accept": {"*/*"}},
			{"User-Agent": {"first", "second"}},
			{"Authorization": {"Bearer xyz"}, "Accept": {"a", "b"}, "X-Empty": {""}, "X-None": {}},
			{"Host": {"other.example"}, "Content-Length": {"5"}, "Transfer-Encoding": {"chunked"}, "Trailer": {"X"}},
			{"host": {"lower.example"}, "content-length": {"7"}, "x-lower": {"v"}, "Zz": {"last"}, "Aa": {"first"}},
			{"Connection": {"keep-alive"}, "Te": {"trailers"}, "X-Trim": {" \t v \t "}, "X-Break": {"a\r\nb\nc\r"}},
			{"Bad Name": {"v"}, "X-Ok": {"v"}, "": {"empty name"}},
			{"Accept-Encoding": {"gzip"}, "Cookie": {"a=b; c=d"}, "X-Obs": {"caf\xc3\xa9"}},
		}
		for _, m := range methods {
			for _, u := range urls {
				for _, h := range headers {
					req := newReq("GET", u)
					req.Method = m
					req.Header = h.Clone()
					check(t, req, true)
				}
			}
		}
	})

	t.Run("host", func(t *testing.T) {
		for _, tc := range []struct {
			host  string
			taken bool
		}{
			{"override.example", true},
			{"override.example:8443", true},
			{"[::1]:443", true},
			{"[fe80::1%25en0]:443", false}, // a zone, taken out
			{"bücher.example", false},      // punycode
			{"bad host", false},            // invalid: sent empty
			{"a/b", false},
		} {
			req := newReq("GET", "https://api.example.com/x")
			req.Host = tc.host
			check(t, req, tc.taken)
		}
		req := newReq("GET", "https://api.example.com/x")
		req.Host, req.URL.Host = "", "[fe80::1%en0]:443"
		check(t, req, false)
		req.URL.Host = "url.example:8443"
		check(t, req, true)
	})

	t.Run("bodies", func(t *testing.T) {
		const text = "{\"model\":\"m\",\"messages\":[]}"
		big := strings.Repeat("0123456789", 1000) // past the bufio.Writer's buffer
		for _, tc := range []struct {
			name   string
			method string
			body   func() io.ReadCloser
			length int64
			taken  bool
		}{
			{"bytes.Reader", "POST", func() io.ReadCloser { return io.NopCloser(bytes.NewReader([]byte(text))) }, int64(len(text)), true},
			{"strings.Reader", "PUT", func() io.ReadCloser { return io.NopCloser(strings.NewReader(text)) }, int64(len(text)), true},
			{"bytes.Buffer", "PATCH", func() io.ReadCloser { return io.NopCloser(bytes.NewBufferString(text)) }, int64(len(text)), true},
			{"big", "POST", func() io.ReadCloser { return io.NopCloser(strings.NewReader(big)) }, int64(len(big)), true},
			{"a custom method", "QUERY", func() io.ReadCloser { return io.NopCloser(strings.NewReader(text)) }, int64(len(text)), true},
			{"a reader partly read", "POST", func() io.ReadCloser {
				r := strings.NewReader("xx" + text)
				r.Seek(2, io.SeekStart)
				return io.NopCloser(r)
			}, int64(len(text)), true},
			{"shorter than its length", "POST", func() io.ReadCloser { return io.NopCloser(strings.NewReader(text)) }, int64(len(text)) + 1, false},
			{"longer than its length", "POST", func() io.ReadCloser { return io.NopCloser(strings.NewReader(text)) }, int64(len(text)) - 1, false},
			{"an unknown length", "POST", func() io.ReadCloser { return io.NopCloser(strings.NewReader(text)) }, -1, false},
			{"not in memory", "POST", func() io.ReadCloser { return io.NopCloser(io.MultiReader(strings.NewReader(text))) }, int64(len(text)), false},
			{"not a NopCloser", "POST", func() io.ReadCloser { return readCloser{strings.NewReader(text), io.NopCloser(nil)} }, int64(len(text)), false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				for _, h := range []http.Header{{}, {"Content-Type": {"application/json"}, "Content-Length": {"999"}, "User-Agent": {"sdk/2"}}} {
					checkWith(t, func() *http.Request {
						req := newReq(tc.method, "https://api.example.com/v1/chat?x=1")
						req.Body, req.ContentLength, req.Header = tc.body(), tc.length, h.Clone()
						return req
					}, tc.taken)
				}
			})
		}
	})

	t.Run("not taken", func(t *testing.T) {
		for name, mod := range map[string]func(*http.Request){
			"NoBody, a length":  func(r *http.Request) { r.Body, r.ContentLength = http.NoBody, 5 },
			"a length":          func(r *http.Request) { r.ContentLength = 3 },
			"an unknown length": func(r *http.Request) { r.ContentLength = -1 },
			"transfer-encoding": func(r *http.Request) { r.TransferEncoding = []string{"chunked"} },
			"trailers":          func(r *http.Request) { r.Trailer = http.Header{"X-T": nil} },
			"close":             func(r *http.Request) { r.Close = true },
			"CONNECT":           func(r *http.Request) { r.Method = http.MethodConnect },
			"a control byte":    func(r *http.Request) { r.URL.Opaque = "/a\x01b" },
			"a trace": func(r *http.Request) {
				*r = *r.WithContext(httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{}))
			},
			"no URL": func(r *http.Request) { r.URL = nil },
		} {
			t.Run(name, func(t *testing.T) {
				req := newReq("POST", "https://api.example.com/x")
				mod(req)
				check(t, req, false)
			})
		}
		// A body that is not one: NoBody, or an empty Trailer, is taken.
		req := newReq("POST", "https://api.example.com/x")
		req.Body, req.Trailer = http.NoBody, http.Header{}
		check(t, req, true)
	})

	t.Run("random", func(t *testing.T) {
		r := rand.New(rand.NewPCG(25, 1))
		alphabet := []string{"a", "B", "-", "_", " ", "\t", "\r", "\n", ":", "é", "\x7f", "0", "host", "user-agent", "Content-Length"}
		word := func(n int) string {
			var b strings.Builder
			for range r.IntN(n) {
				b.WriteString(alphabet[r.IntN(len(alphabet))])
			}
			return b.String()
		}
		for i := range 2000 {
			req := newReq("GET", fmt.Sprintf("https://h%d.example:%d/%s?%s", i, 1+r.IntN(65535), url.PathEscape(word(6)), url.QueryEscape(word(4))))
			req.Method = []string{"", "GET", "HEAD", "POST", "DELETE", "X"}[r.IntN(6)]
			for range r.IntN(8) {
				k := word(5)
				for range r.IntN(3) {
					req.Header[k] = append(req.Header[k], word(8))
				}
			}
			if r.IntN(3) > 0 {
				check(t, req, true)
				continue
			}
			text := "b" + word(20)
			req.ContentLength = int64(len(text))
			checkWith(t, func() *http.Request {
				cp := req.Clone(context.Background())
				cp.Body = io.NopCloser(strings.NewReader(text))
				return cp
			}, true)
		}
	})
}

type readCloser struct {
	io.Reader
	io.Closer
}

// writeSimple allocates nothing for a request the broker sends: one with a small body in
// memory, a few header fields, no query.
func TestWriteSimpleAllocs(t *testing.T) {
	body := []byte(`{"model":"m","messages":[]}`)
	req, err := http.NewRequest(http.MethodPost, "https://api.example.com/v1/chat", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer x")
	bw := bufio.NewWriter(io.Discard)
	r := bytes.NewReader(body)
	req.Body = io.NopCloser(r)
	allocs := testing.AllocsPerRun(100, func() {
		r.Reset(body)
		if !writeSimple(bw, req) {
			t.Fatal("writeSimple did not take the request")
		}
		bw.Flush()
	})
	if allocs != 0 {
		t.Fatalf("writeSimple allocated %v times per request, want 0", allocs)
	}
}
