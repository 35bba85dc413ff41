package broker

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/broker/policy"
)

func TestNormalisePath(t *testing.T) {
	for raw, want := range map[string]string{
		"/v1/chat/completions":     "/v1/chat/completions",
		"/":                        "/",
		"/v1/models/../files":      "/v1/files",
		"/v1/models/%2e%2e/files":  "/v1/files",
		"/v1/models/%2E%2E/files":  "/v1/files",
		"/v1/models/.%2e/files":    "/v1/files",
		"/v1/./models":             "/v1/models",
		"/v1/models/.":             "/v1/models/",
		"/v1/models/..":            "/v1/",
		"/v1/%6Dodels":             "/v1/models",
		"/a%7eb%2d%5F":             "/a~b-_",
		"//v1/models":              "//v1/models",
		"/v1//models/":             "/v1//models/",
		"/a//../b":                 "/a/b",
		"/@types%2fnode":           "/@types%2Fnode",
		"/api/v4/projects/g%2Fp":   "/api/v4/projects/g%2Fp",
		"/a%3bb":                   "/a%3Bb",
		"/a%20b":                   "/a%20b",
		"/caf\xc3\xa9":             "/caf%C3%A9",
		"/a b":                     "/a%20b",
		"/a\"<>[]{}|^`":            "/a%22%3C%3E%5B%5D%7B%7D%7C%5E%60",
		"/x:y@z!$&'()*+,=":         "/x:y@z!$&'()*+,=",
		"/a..b/...":                "/a..b/...",
		"/a%25b":                   "/a%25b",
		"/a%252541":                "/a%252541",
		"/v1/models/gpt-4.1-mini/": "/v1/models/gpt-4.1-mini/",
		// Other non-ASCII text goes through: an ideographic full stop (U+3002) is no '.' to NFKC.
		"/wiki/%E6%97%A5%E6%9C%AC%E3%80%82": "/wiki/%E6%97%A5%E6%9C%AC%E3%80%82",
		"/wiki/\u00bd":                      "/wiki/%C2%BD", // ½ is 1⁄2 (U+2044), no solidus
	} {
		got, err := normalisePath(raw)
		if err != nil || got != want {
			t.Errorf("normalisePath(%q) = %q, %v; want %q", raw, got, err, want)
		}
	}
}

func TestNormalisePathRefuses(t *testing.T) {
	for raw, want := range map[string]error{
		"*":                      errNotAPath,
		"v1/models":              errNotAPath,
		"/..":                    errAboveRoot,
		"/../v1/files":           errAboveRoot,
		"/v1/../../files":        errAboveRoot,
		"/%2e%2e/files":          errAboveRoot,
		"/v1\\..\\files":         errBackslash,
		"/v1/models\\":           errBackslash,
		"/v1/models/..;/files":   errPathParam,
		"/v1/models;x=y":         errPathParam,
		"/v1#frag":               errFragment,
		"/v1/\x00":               errControl,
		"/v1/%00":                errControl,
		"/v1/%0a":                errControl,
		"/v1/%7F":                errControl,
		"/v1/%zz":                errBadEscape,
		"/v1/%2":                 errBadEscape,
		"/v1/%":                  errBadEscape,
		"/v1/models/..%2ffiles":  errHiddenDots,
		"/v1/models/..%2Ffiles":  errHiddenDots,
		"/v1/models%2F..%2Ffile": errHiddenDots,
		"/v1/models/%2e%2e%5c":   errHiddenDots,
		"/v1/models/..%5Cfiles":  errHiddenDots,
		"/v1/models/%252e%252e":  errHiddenDots,
		"/v1/models/%25252e%2e":  errHiddenDots,
		"/v1/models/..%3B/files": errHiddenDots,
		"/v1/models/%2e%2e%3bx":  errHiddenDots,
		"/v1/models/.%3B":        errHiddenDots,
		"/v1/%2500":              errControl,
		"/v1/%c0%ae%c0%ae/files": errNotUTF8,
		"/v1/%e9t%e9":            errNotUTF8,
		"/a%25252541":            errDeepEscapes,
		// Forms a server normalising with NFKC reads as '.', '/', '\\' and friends.
		"/v1/models/%EF%BC%8E%EF%BC%8E/files": errCompatForm, // U+FF0E twice: ".."
		"/v1/models/%ef%bc%8e./files":         errCompatForm,
		"/v1/models/\uff0e\uff0e/files":       errCompatForm, // raw UTF-8
		"/v1/models%EF%BC%8F..%EF%BC%8Ffiles": errCompatForm, // U+FF0F: '/'
		"/v1/models/%E2%80%A5/files":          errCompatForm, // U+2025 TWO DOT LEADER
		"/v1/models/%E2%80%A4%E2%80%A4":       errCompatForm, // U+2024 ONE DOT LEADER
		"/v1/models/%E2%80%A6":                errCompatForm, // U+2026 ellipsis
		"/v1/models/%EF%B9%92%EF%B9%92":       errCompatForm, // U+FE52 SMALL FULL STOP
		"/v1/models/..%EF%BC%BCfiles":         errCompatForm, // U+FF3C full-width backslash
		"/v1/models%EF%BC%9Bx":                errCompatForm, // U+FF1B full-width ';'
		"/v1/models%EF%BC%85%32%65":           errCompatForm, // U+FF05 full-width '%'
		"/v1/%25EF%25BC%258E%25EF%25BC%258E":  errCompatForm, // encoded twice
		// Each decoding is a pass over the path: the rounds are bounded, not the path's length.
		"/%" + strings.Repeat("25", maxHeaderBytes/2) + "41": errDeepEscapes,
	} {
		got, err := normalisePath(raw)
		if !errors.Is(err, want) || !errors.Is(err, errBadRequest) {
			t.Errorf("normalisePath(%.80q) = %.80q, %v; want %v", raw, got, err, want)
		}
	}
}

// TestRequestPath: the path is taken from the request-target as sent, whatever net/url made of
// it, and a target that is not an absolute path is refused.
func TestRequestPath(t *testing.T) {
	for target, want := range map[string][2]string{
		"/v1/models/%2e%2e/files?x=1":            {"/v1/models/%2e%2e/files", "/v1/files"},
		"/v1/models/%2E%2E/files":                {"/v1/models/%2E%2E/files", "/v1/files"},
		"/a%2Fb":                                 {"/a%2Fb", "/a%2Fb"},
		"/plain":                                 {"/plain", "/plain"},
		"https://api.openai.com/v1/../v1/models": {"/v1/../v1/models", "/v1/models"},
		"https://api.openai.com":                 {"", "/"},
		"https://api.openai.com?x":               {"", "/"},
		"//api.openai.com/v1":                    {"//api.openai.com/v1", "//api.openai.com/v1"},
	} {
		u, err := url.ParseRequestURI(target)
		if err != nil {
			t.Fatal(err)
		}
		raw, clean, err := requestPath(u)
		if err != nil || raw != want[0] || clean != want[1] {
			t.Errorf("%s: raw %q clean %q %v; want %q", target, raw, clean, err, want)
		}
	}
	for _, target := range []string{"x:foo", "http:foo", "mailto:a@b", "*", "http:"} {
		u, err := url.ParseRequestURI(target)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := requestPath(u); !errors.Is(err, errNotAPath) {
			t.Errorf("%s: %v, want %v", target, err, errNotAPath)
		}
	}
}

func TestRequestQuery(t *testing.T) {
	for raw, want := range map[string]error{
		"":            nil,
		"a=1&b=2&a=3": nil,
		"q=a+b%3Bc":   nil,
		"a=1;b=2":     errQuerySemi,
		"service=git-upload-pack;service=git-receive-pack": errQuerySemi,
		"a=%zz&b=1":            errQueryParse,
		"a=1#x":                errQueryParse,
		"a=1&%":                errQueryParse,
		"state=open&per_page=": nil,
	} {
		if _, err := requestQuery(raw); !errors.Is(err, want) && !(want == nil && err == nil) {
			t.Errorf("requestQuery(%q): %v, want %v", raw, err, want)
		}
	}
	q, _ := requestQuery("a=1&b=x+y&a=%2F")
	if got := q["a"]; len(got) != 2 || got[1] != "/" || q.Get("b") != "x y" {
		t.Errorf("parsed %v", q)
	}
}

func TestMethodOverride(t *testing.T) {
	type req struct {
		method, target, contentType, body string
		header                            [2]string
		chunked                           bool
	}
	form := "application/x-www-form-urlencoded"
	multi := "multipart/form-data; boundary=XX"
	part := func(disposition, value string) string {
		return "--XX\r\nContent-Disposition: " + disposition + "\r\n\r\n" + value + "\r\n--XX--\r\n"
	}
	for name, c := range map[string]struct {
		req
		refuse bool
	}{
		"no override":                     {req{method: "POST", target: "/x"}, false},
		"header names another method":     {req{method: "POST", target: "/x", header: [2]string{"X-HTTP-Method-Override", "DELETE"}}, true},
		"X-HTTP-Method":                   {req{method: "GET", target: "/x", header: [2]string{"X-HTTP-Method", "PUT"}}, true},
		"X-Method-Override":               {req{method: "GET", target: "/x", header: [2]string{"X-Method-Override", "delete"}}, true},
		"header names the same method":    {req{method: "POST", target: "/x", header: [2]string{"X-HTTP-Method-Override", "post"}}, false},
		"X-Original-URL":                  {req{method: "GET", target: "/x", header: [2]string{"X-Original-URL", "/admin"}}, true},
		"X-Rewrite-URL":                   {req{method: "GET", target: "/x", header: [2]string{"X-Rewrite-URL", "/admin"}}, true},
		"_method in the query":            {req{method: "GET", target: "/x?_method=DELETE"}, true},
		"encoded _method in the query":    {req{method: "GET", target: "/x?%5Fmethod=DELETE"}, true},
		"_method GET in a GET query":      {req{method: "GET", target: "/x?_method=get"}, false},
		"_method in a form":               {req{method: "POST", target: "/x", contentType: form, body: "a=1&_method=DELETE"}, true},
		"_method after ';' in a form":     {req{method: "POST", target: "/x", contentType: form, body: "a=1;_method=DELETE"}, true},
		"no type: labelled, not a form":   {req{method: "POST", target: "/x", body: "_method=PATCH"}, false},
		"no type, unknown length":         {req{method: "POST", target: "/x", body: "_method=PATCH", chunked: true}, false},
		"_method in multipart/mixed":      {req{method: "POST", target: "/x", contentType: "multipart/mixed; boundary=XX", body: part(`form-data; name="_method"`, "DELETE")}, true},
		"_method in a form, odd type":     {req{method: "POST", target: "/x", contentType: "Application/X-WWW-Form-Urlencoded;;", body: "_method=PATCH"}, true},
		"_method POST in a form":          {req{method: "POST", target: "/x", contentType: form, body: "_method=POST&a=1"}, false},
		"form without _method":            {req{method: "POST", target: "/x", contentType: form, body: "a=1&method=DELETE"}, false},
		"_method in JSON is no form":      {req{method: "POST", target: "/x", contentType: "application/json", body: `{"_method":"DELETE"}`}, false},
		"_method in a PUT form":           {req{method: "PUT", target: "/x", contentType: form, body: "_method=DELETE"}, false},
		"_method in a multipart form":     {req{method: "POST", target: "/x", contentType: multi, body: part(`form-data; name="_method"`, "DELETE")}, true},
		"_method in an attachment part":   {req{method: "POST", target: "/x", contentType: multi, body: part(`attachment; name="_method"`, "DELETE")}, true},
		"multipart without _method":       {req{method: "POST", target: "/x", contentType: multi, body: part(`form-data; name="file"`, "_method=DELETE")}, false},
		"multipart that does not parse":   {req{method: "POST", target: "/x", contentType: multi, body: "garbage"}, true},
		"multipart without a boundary":    {req{method: "POST", target: "/x", contentType: "multipart/form-data", body: part(`form-data; name="a"`, "1")}, true},
		"a form of unknown length":        {req{method: "POST", target: "/x", contentType: form, body: "a=1", chunked: true}, true},
		"a form over 64 KiB":              {req{method: "POST", target: "/x", contentType: form, body: "a=" + strings.Repeat("x", maxSmallBody)}, true},
		"a JSON body of unknown length":   {req{method: "POST", target: "/x", contentType: "application/json", body: "{}", chunked: true}, false},
		"a large octet-stream":            {req{method: "POST", target: "/x", contentType: "application/octet-stream", body: strings.Repeat("x", maxSmallBody+1)}, false},
		"_method in a form read for this": {req{method: "POST", target: "/x", contentType: form, body: "_method=DELETE", header: [2]string{"Expect", "100-continue"}}, true},
	} {
		r := httptest.NewRequest(c.method, c.target, strings.NewReader(c.body))
		if c.contentType != "" {
			r.Header.Set("Content-Type", c.contentType)
		}
		if c.header[0] != "" {
			r.Header.Set(c.header[0], c.header[1])
		}
		if c.chunked {
			r.ContentLength = -1
		}
		if c.body == "" {
			r.Body = http.NoBody
		}
		small, err := readSmallBody(r)
		if err != nil {
			t.Fatal(err)
		}
		q, err := requestQuery(r.URL.RawQuery)
		if err != nil {
			t.Fatal(err)
		}
		err = methodOverride(r, q, small)
		if refused := err != nil; refused != c.refuse || (refused && !errors.Is(err, errBadRequest)) {
			t.Errorf("%s: %v, want refused %v", name, err, c.refuse)
		}
		if ct := r.Header.Get("Content-Type"); c.method == "POST" && c.body != "" && c.contentType == "" && ct != "application/octet-stream" {
			t.Errorf("%s: a POST body without a type goes on as %q, not application/octet-stream", name, ct)
		}
	}
}

// recordingDecider allows every request and keeps the last input it decided on.
type recordingDecider struct{ in *policy.Input }

func (d *recordingDecider) Decide(_ context.Context, in *policy.Input) (policy.Decision, error) {
	d.in = in
	return policy.Decision{Allow: true, Revision: "test"}, nil
}

// TestUpstreamGetsThePolicysPath drives requests through the pipeline: the upstream is sent
// exactly the path the policy saw, and the policy sees the agent's as raw_path; a path the
// upstream could read otherwise never reaches the policy or the upstream, and the agent reads
// why.
func TestUpstreamGetsThePolicysPath(t *testing.T) {
	br, tun := benchBroker(t, false)
	up := &recordingUpstream{}
	dec := &recordingDecider{}
	br.setTransport(up)
	br.policy = dec
	for target, want := range map[string]string{
		"/v1/models/%2e%2e/files":       "/v1/files",
		"/v1/models/../files?a=1":       "/v1/files?a=1",
		"/v1/%6Dodels/x%2fy":            "/v1/models/x%2Fy",
		"//v1//models":                  "//v1//models",
		"/v1/models/x/../../chat?q=%2e": "/v1/chat?q=%2e",
	} {
		up.got, dec.in = nil, nil
		r := httptest.NewRequest(http.MethodGet, target, nil)
		r.Host = "api.openai.com"
		w := httptest.NewRecorder()
		br.serveTunnel(w, r, tun)
		if w.Code != http.StatusOK || up.got == nil || dec.in == nil {
			t.Fatalf("%s: status %d: %s", target, w.Code, w.Body)
		}
		if got := up.got.URL.RequestURI(); got != want {
			t.Errorf("%s: upstream sent %q, want %q", target, got, want)
		}
		if path, _, _ := strings.Cut(want, "?"); dec.in.Path != path {
			t.Errorf("%s: policy saw path %q, want %q", target, dec.in.Path, path)
		}
		if raw, _, _ := strings.Cut(target, "?"); dec.in.RawPath != raw {
			t.Errorf("%s: policy saw raw_path %q, want %q", target, dec.in.RawPath, raw)
		}
	}
	for target, reason := range map[string]string{
		"/v1/models/..%2Ffiles":  errHiddenDots.reason,
		"/v1/models/..;/files":   errPathParam.reason,
		"/../v1/files":           errAboveRoot.reason,
		"/v1/models?a=1;b=2":     errQuerySemi.reason,
		"/v1/models?_method=PUT": "the query parameter _method asks for another method than the request's GET; send the request with the method you mean",
	} {
		up.got, dec.in = nil, nil
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RequestURI = target
		r.URL, _ = url.ParseRequestURI(target)
		r.Host = "api.openai.com"
		w := httptest.NewRecorder()
		br.serveTunnel(w, r, tun)
		var body openAIBody // api.openai.com: the refusal is in OpenAI's shape (errors.go)
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || w.Code != http.StatusBadRequest || body.Error.Code != "bad_request" || body.Reason != reason {
			t.Errorf("%s: status %d %s, want 400 %q", target, w.Code, w.Body, reason)
		}
		if up.got != nil || dec.in != nil {
			t.Errorf("%s: refused, yet reached the policy (%v) or the upstream (%v)", target, dec.in != nil, up.got != nil)
		}
	}
}

// FuzzNormalisePath checks what the broker promises of every path it accepts: it is its own
// normal form, has no dot-segment even to a lenient server, and goes on the wire exactly as
// the policy sees it.
func FuzzNormalisePath(f *testing.F) {
	for _, s := range []string{"/v1/models/../files", "/v1/models/%2e%2e/files", "/a%2Fb", "//x//", "/a/..%2F..",
		"/%252e%252e", "/a;b", "/a\\b", "/caf\xc3\xa9", "/%c0%ae", "/a/./b/../c/", "/%7e%41%2d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if raw == "" {
			return
		}
		clean, err := normalisePath(raw)
		if err != nil {
			if !errors.Is(err, errBadRequest) {
				t.Fatalf("%q: %v is no bad request", raw, err)
			}
			return
		}
		if again, err := normalisePath(clean); err != nil || again != clean {
			t.Fatalf("%q -> %q -> %q, %v: not its own normal form", raw, clean, again, err)
		}
		if !strings.HasPrefix(clean, "/") || strings.ContainsAny(clean, "\\;#? \x00") {
			t.Fatalf("%q -> %q", raw, clean)
		}
		for _, seg := range strings.Split(clean, "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("%q -> %q keeps a dot-segment", raw, clean)
			}
		}
		if err := lenientRead(clean); err != nil {
			t.Fatalf("%q -> %q, which a lenient server reads otherwise: %v", raw, clean, err)
		}
		for i := 0; i < len(clean); i++ {
			if c := clean[i]; c == '%' {
				if v := unhex(clean[i+1])<<4 | unhex(clean[i+2]); isUnreserved(v) || !isHex(clean[i+1]) || !isHex(clean[i+2]) ||
					strings.ToUpper(clean[i:i+3]) != clean[i:i+3] {
					t.Fatalf("%q -> %q: escape %q not in normal form", raw, clean, clean[i:i+3])
				}
			} else if !isPathChar(c) {
				t.Fatalf("%q -> %q: raw %q", raw, clean, c)
			}
		}
		// What net/http writes on the wire for the outbound request.
		u := &url.URL{Scheme: "https", Host: "example.test"}
		sendPath(u, clean)
		if got := u.RequestURI(); got != clean {
			t.Fatalf("%q -> %q, but %q goes upstream", raw, clean, got)
		}
		// And a server parsing that request-target finds the same path again.
		p, err := url.ParseRequestURI(clean)
		if err != nil {
			t.Fatalf("%q -> %q: %v", raw, clean, err)
		}
		if r, c, err := requestPath(p); err != nil || r != clean || c != clean {
			t.Fatalf("%q -> %q parses back as %q, %q, %v", raw, clean, r, c, err)
		}
	})
}

// BenchmarkNormalisePath: the usual path costs a scan and no allocation; the worst a 64 KiB
// request-target can ask for is bounded by maxDecodes passes.
func BenchmarkNormalisePath(b *testing.B) {
	for name, raw := range map[string]string{
		"plain":   "/v1/chat/completions",
		"escaped": "/repos/o/r/contents/docs%2Fa%20b/../c.md",
		"nested":  "/%" + strings.Repeat("25", maxHeaderBytes/2) + "41",
		"escapes": "/" + strings.Repeat("%2F", maxHeaderBytes/3),
		"dots":    strings.Repeat("/a/..", maxHeaderBytes/5),
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = normalisePath(raw)
			}
		})
	}
}
