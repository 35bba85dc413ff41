package upstream

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"testing"
)

// writeBodiless writes the very bytes Request.Write writes, for every request it takes, and
// takes the requests the broker sends without a body.
func TestWriteBodilessAsRequestWrite(t *testing.T) {
	check := func(t *testing.T, req *http.Request, wantTaken bool) {
		t.Helper()
		var got, want bytes.Buffer
		bw := bufio.NewWriter(&got)
		taken := writeBodiless(bw, req)
		bw.Flush()
		if taken != wantTaken {
			t.Fatalf("writeBodiless took %s %v (Host %q, header %q, body %v, close %v) = %v, want %v",
				req.Method, req.URL, req.Host, req.Header, req.Body, req.Close, taken, wantTaken)
		}
		if !taken {
			if got.Len() != 0 {
				t.Fatalf("writeBodiless wrote %q for a request it did not take", got.String())
			}
			return
		}
		bw = bufio.NewWriter(&want)
		if err := req.Write(bw); err != nil {
			t.Fatalf("Request.Write: %v (writeBodiless wrote %q)", err, got.String())
		}
		bw.Flush()
		if got.String() != want.String() {
			t.Fatalf("writeBodiless wrote\n%q\nRequest.Write\n%q", got.String(), want.String())
		}
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

	t.Run("not taken", func(t *testing.T) {
		for name, mod := range map[string]func(*http.Request){
			"a body":            func(r *http.Request) { r.Body, r.ContentLength = http.NoBody, 5 },
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
			check(t, req, true)
		}
	})
}
