package wire

import (
	"errors"
	"net/http"
	"strings"
	"testing"
)

func TestCheckHeaders(t *testing.T) {
	cases := map[string]struct {
		h    http.Header
		want string // the header named in the error; "" for none
	}{
		"none":                    {http.Header{}, ""},
		"usual":                   {http.Header{"Content-Type": {"application/json"}, "Accept": {"a", "b"}, "Cookie": {"a=1", "b=2"}}, ""},
		"quoted comma":            {http.Header{"Content-Type": {`multipart/form-data; boundary="a,b"`}}, ""},
		"list header twice":       {http.Header{"Accept-Encoding": {"gzip", "br"}}, ""},
		"amz meta underscore":     {http.Header{"X-Amz-Meta-My_key": {"v"}}, ""},
		"amz list value":          {http.Header{"X-Amz-Grant-Read": {`id="a", id="b"`}}, ""},
		"auth commas":             {http.Header{"Authorization": {"AWS4-HMAC-SHA256 Credential=a, SignedHeaders=host, Signature=b"}}, ""},
		"content type twice":      {http.Header{"Content-Type": {"application/json", "text/plain"}}, "Content-Type"},
		"content type joined":     {http.Header{"Content-Type": {"text/plain, application/json"}}, "Content-Type"},
		"content type bad param":  {http.Header{"Content-Type": {"application/json; x"}}, "Content-Type"},
		"content type dup param":  {http.Header{"Content-Type": {"application/json; charset=utf-8; charset=latin1"}}, "Content-Type"},
		"content type junk":       {http.Header{"Content-Type": {"application/json x"}}, "Content-Type"},
		"text/json bad param":     {http.Header{"Content-Type": {"text/json; x"}}, "Content-Type"},
		"x-json junk":             {http.Header{"Content-Type": {"application/x-json x"}}, "Content-Type"},
		"form type bad param":     {http.Header{"Content-Type": {"application/x-www-form-urlencoded;;"}}, "Content-Type"},
		"content type params":     {http.Header{"Content-Type": {"application/json; charset=utf-8;"}}, ""},
		"content type upper":      {http.Header{"Content-Type": {"Application/JSON ;charset=UTF-8"}}, ""},
		"other type bad param":    {http.Header{"Content-Type": {"text/plain; x"}}, ""},
		"content type underscore": {http.Header{"Content_type": {"application/json"}}, "Content-Type"},
		"copy source twice":       {http.Header{"X-Amz-Copy-Source": {"/a/b", "/c/d"}}, "X-Amz-Copy-Source"},
		"amz target twice":        {http.Header{"X-Amz-Target": {"A.B", "A.C"}}, "X-Amz-Target"},
		"amz sha twice":           {http.Header{"X-Amz-Content-Sha256": {"UNSIGNED-PAYLOAD", "UNSIGNED-PAYLOAD"}}, "X-Amz-Content-Sha256"},
		"amz underscore":          {http.Header{"X_amz_copy_source": {"/a/b"}}, "X-Amz-Copy-Source"},
		"amz underscore later":    {http.Header{"X-Amz-Copy_source": {"/a/b"}}, "X-Amz-Copy-Source"},
		"amz lower":               {http.Header{"x-amz-copy-source": {"/a/b"}}, "X-Amz-Copy-Source"},
		"session twice":           {http.Header{"Mcp-Session-Id": {"s1", "s2"}}, "Mcp-Session-Id"},
		"override twice":          {http.Header{"X-Http-Method-Override": {"GET", "GET"}}, "X-Http-Method-Override"},
		"override joined":         {http.Header{"X-Http-Method-Override": {"GET, DELETE"}}, "X-Http-Method-Override"},
		"override underscore":     {http.Header{"X_http_method_override": {"DELETE"}}, "X-Http-Method-Override"},
		"x-method twice":          {http.Header{"X-Method-Override": {"GET", "DELETE"}}, "X-Method-Override"},
		"x-http-method twice":     {http.Header{"X-Http-Method": {"GET", "DELETE"}}, "X-Http-Method"},
		"authorization twice":     {http.Header{"Authorization": {"Bearer a", "Bearer b"}}, ""},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			err := CheckHeaders(c.h)
			if c.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var he *HeaderError
			if !errors.As(err, &he) || !errors.Is(err, ErrAmbiguousHeader) || he.Name != c.want {
				t.Fatalf("err = %v, want a HeaderError naming %s", err, c.want)
			}
			for _, vs := range c.h {
				for _, v := range vs {
					if strings.Contains(err.Error(), v) {
						t.Errorf("the error quotes a value: %q", err)
					}
				}
			}
		})
	}
}

func TestHasListComma(t *testing.T) {
	for v, want := range map[string]bool{
		"a":                 false,
		"a, b":              true,
		`a; b="x,y"`:        false,
		`a; b="x\",y"`:      false,
		`a; b="x\"", c, d`:  true,
		`a; b="unfinished,`: false,
	} {
		if got := hasListComma(v); got != want {
			t.Errorf("hasListComma(%q) = %v, want %v", v, got, want)
		}
	}
}

func BenchmarkCheckHeaders(b *testing.B) {
	h := http.Header{
		"Content-Type": {"application/json"}, "Accept": {"*/*"}, "User-Agent": {"x"},
		"Authorization": {"Bearer x"}, "X-Amz-Date": {"20261205T000000Z"}, "Content-Length": {"12"},
	}
	b.ReportAllocs()
	for b.Loop() {
		if CheckHeaders(h) != nil {
			b.Fatal("refused")
		}
	}
}

func TestCheckRequest(t *testing.T) {
	r, _ := http.NewRequest(http.MethodPost, "https://example.com/", strings.NewReader("x"))
	r.Trailer = http.Header{"Grpc-Status": nil, "X-Checksum": nil, "X": nil, "Te": nil}
	if err := CheckRequest(r); err != nil {
		t.Fatalf("ordinary trailers refused: %v", err)
	}
	for _, name := range []string{"X-Http-Method-Override", "X-Amz-Copy-Source", "Content-Type", "X_amz_target"} {
		r.Trailer = http.Header{name: nil}
		var he *HeaderError
		if err := CheckRequest(r); !errors.As(err, &he) || !strings.Contains(err.Error(), "trailer") {
			t.Errorf("trailer %s: err = %v, want a HeaderError about a trailer", name, err)
		}
		if !IsDecisionHeader(name) {
			t.Errorf("IsDecisionHeader(%q) = false", name)
		}
	}
	for _, name := range []string{"Grpc-Status", "Accept", "X-Amzn-Trace-Id", "Authorization", "Te", "", "X-Amz"} {
		if IsDecisionHeader(name) {
			t.Errorf("IsDecisionHeader(%q) = true", name)
		}
	}
	r.Trailer = nil
	r.Header.Add("Content-Type", "a/b")
	r.Header.Add("Content-Type", "c/d")
	if err := CheckRequest(r); !errors.Is(err, ErrAmbiguousHeader) {
		t.Errorf("headers not checked: %v", err)
	}
}

func TestCheckBodyEncoding(t *testing.T) {
	for enc, refused := range map[string]bool{"": false, "identity": false, "IDENTITY, identity": false,
		"gzip": true, "identity, gzip": true, "x-gzip": true, "br": true, "aws-chunked": true} {
		h := http.Header{}
		if enc != "" {
			h.Set("Content-Encoding", enc)
		}
		err := CheckBodyEncoding(h)
		if (err != nil) != refused {
			t.Errorf("Content-Encoding %q: err = %v, want refused %v", enc, err, refused)
		}
		if err != nil && !strings.Contains(err.Error(), "Content-Encoding") {
			t.Errorf("the error does not name the header: %v", err)
		}
	}
}

// FuzzCheckRequest: any names and values, as headers or trailers, are checked without a panic,
// and a refusal never quotes a value.
func FuzzCheckRequest(f *testing.F) {
	f.Add("Content-Type", "application/json; x", "X")
	f.Add("x_amz_copy_source", "/a/b", "X-Amz-")
	f.Add("X-Amz-Meta-A_b", "v", "Mcp-Session-Id")
	f.Fuzz(func(t *testing.T, name, value, trailer string) {
		r := &http.Request{Header: http.Header{name: {value, value}}, Trailer: http.Header{trailer: nil}}
		err := CheckRequest(r)
		if err != nil && len(value) > 8 && strings.Contains(err.Error(), value) && !strings.Contains(name, value) {
			t.Errorf("the error quotes the value: %v", err)
		}
		_ = IsDecisionHeader(name)
		_ = CheckBodyEncoding(http.Header{"Content-Encoding": {value}})
	})
}
