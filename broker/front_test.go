package broker

import (
	"bytes"
	"net"
	"net/http"
	"reflect"
	"testing"
	"time"
)

// TestConnectRequest: the front serves a CONNECT only when net/http's server would hand it to
// a handler as it is; any other goes to that server, which answers it itself.
func TestConnectRequest(t *testing.T) {
	for name, tc := range map[string]struct {
		head  string
		serve bool
	}{
		"plain":                             {"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n", true},
		"no Host field":                     {"CONNECT a.example:443 HTTP/1.1\r\n\r\n", true},
		"HTTP/1.0":                          {"CONNECT a.example:443 HTTP/1.0\r\n\r\n", true},
		"Host field in lower":               {"CONNECT a.example:443 HTTP/1.1\r\nhost:\ta.example:443 \r\n\r\n", true},
		"malformed Host field":              {"CONNECT a.example:443 HTTP/1.1\r\nhost: a b\r\n\r\n", false},
		"Expect":                            {"CONNECT a.example:443 HTTP/1.1\r\nExpect: 100-continue\r\n\r\n", false},
		"HTTP/2.0":                          {"CONNECT a.example:443 HTTP/2.0\r\n\r\n", false},
		"no version":                        {"CONNECT a.example:443\r\n\r\n", false},
		"invalid header value":              {"CONNECT a.example:443 HTTP/1.1\r\nX-A: a\x01b\r\n\r\n", false},
		"a body announced":                  {"CONNECT a.example:443 HTTP/1.1\r\nContent-Length: 5\r\n\r\n", true},
		"lower-case method":                 {"connect a.example:443 HTTP/1.1\r\n\r\n", false},
		"origin-form, as net/http reads it": {"CONNECT /x HTTP/1.1\r\nHost: a.example\r\n\r\n", true},
	} {
		t.Run(name, func(t *testing.T) {
			r := connectRequest([]byte(tc.head))
			if (r != nil) != tc.serve {
				t.Fatalf("served %v, want %v", r != nil, tc.serve)
			}
			if r != nil && (r.Body != http.NoBody || r.ContentLength != 0) {
				t.Fatalf("a CONNECT's body: %v, %d bytes", r.Body, r.ContentLength)
			}
		})
	}
}

// TestReadFirstHead: the front reads up to the end of a CONNECT's head, keeping what follows,
// and stops as soon as what it read is not a CONNECT.
func TestReadFirstHead(t *testing.T) {
	for name, tc := range map[string]struct {
		writes []string
		end    int // -1: not a CONNECT head
		read   string
	}{
		"CONNECT and more":      {[]string{"CONNECT a:443 HTTP/1.1\r\n\r\n\x16\x03"}, 26, "CONNECT a:443 HTTP/1.1\r\n\r\n\x16\x03"},
		"split head":            {[]string{"CONN", "ECT a:443 HTTP/1.1\r", "\n\r", "\n"}, 26, "CONNECT a:443 HTTP/1.1\r\n\r\n"},
		"GET":                   {[]string{"GET / HTTP/1.1\r\n"}, -1, "GET / HTTP/1.1\r\n"},
		"C then something else": {[]string{"C", "ONX"}, -1, "CONX"},
	} {
		t.Run(name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			go func() {
				for _, w := range tc.writes {
					if _, err := b.Write([]byte(w)); err != nil {
						return
					}
				}
			}()
			_ = a.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf, end, err := readFirstHead(a, nil)
			b.Close()
			if err != nil || end != tc.end || string(buf) != tc.read {
				t.Fatalf("read %q, end %d, %v; want %q, end %d", buf, end, err, tc.read, tc.end)
			}
		})
	}
}

// FuzzParseConnect holds the front's own parser to http.ReadRequest: every head parseConnect
// takes, readConnect (http.ReadRequest and net/http's server's checks) takes too, as the same
// request. A head parseConnect leaves is readConnect's alone.
func FuzzParseConnect(f *testing.F) {
	for _, seed := range []string{
		"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\nProxy-Authorization: Basic eDp5\r\n\r\n",
		"CONNECT a.example:443 HTTP/1.1\r\n\r\n",
		"CONNECT 127.0.0.1:8443 HTTP/1.1\r\nhost:\ta.example:443 \r\nUser-Agent: curl/8.14.1\r\nProxy-Connection: Keep-Alive\r\n\r\n",
		"CONNECT a.example:443 HTTP/1.1\r\nX-A: a\x01b\r\n\r\n",
		"CONNECT a.example:443 HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
		"CONNECT a.example:443 HTTP/1.1\r\nX-A:\r\n  folded\r\n\r\n",
		"CONNECT [::1]:443 HTTP/1.1\r\n\r\n",
		"CONNECT a.example:443 HTTP/1.1\r\nX-A : b\r\n\r\n",
		"CONNECT a.example:443 HTTP/1.1\r\nHost: a b\r\n\r\n",
		"CONNECT a.example:443 HTTP/1.1\r\nx-a: 1\r\nX-A: 2\r\n\r\n",
		"CONNECT a..b-:0 HTTP/1.1\r\nA: \xff\r\n\r\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, head []byte) {
		// As readFirstHead gives it: up to the first empty line.
		i := bytes.Index(head, []byte("\r\n\r\n"))
		if i < 0 {
			return
		}
		head = head[:i+4]
		fast := parseConnect(head)
		if fast == nil {
			return
		}
		slow := readConnect(head)
		if slow == nil {
			t.Fatalf("parseConnect took %q, which net/http's server refuses", head)
		}
		if fast.Method != slow.Method || fast.RequestURI != slow.RequestURI || fast.Host != slow.Host ||
			fast.Proto != slow.Proto || fast.ProtoMajor != slow.ProtoMajor || fast.ProtoMinor != slow.ProtoMinor ||
			fast.Close != slow.Close || fast.ContentLength != slow.ContentLength || fast.Body != slow.Body ||
			!reflect.DeepEqual(fast.URL, slow.URL) || !reflect.DeepEqual(fast.Header, slow.Header) ||
			fast.TransferEncoding != nil || slow.TransferEncoding != nil || fast.Trailer != nil || slow.Trailer != nil {
			t.Fatalf("%q: parseConnect read\n%+v\nhttp.ReadRequest\n%+v", head, fast, slow)
		}
	})
}

// TestParseConnect: the shapes agents send are parsed by the front's own parser; anything
// else is left to http.ReadRequest (readConnect), which decides as net/http's server does.
func TestParseConnect(t *testing.T) {
	for name, tc := range map[string]struct {
		head string
		fast bool
	}{
		"Go's":                 {"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\nProxy-Authorization: Basic eDp5\r\n\r\n", true},
		"curl's":               {"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\nUser-Agent: curl/8.14.1\r\nProxy-Connection: Keep-Alive\r\n\r\n", true},
		"an IP address":        {"CONNECT 127.0.0.1:443 HTTP/1.1\r\n\r\n", true},
		"IPv6":                 {"CONNECT [::1]:443 HTTP/1.1\r\n\r\n", false},
		"HTTP/1.0":             {"CONNECT a.example:443 HTTP/1.0\r\n\r\n", false},
		"no port":              {"CONNECT a.example HTTP/1.1\r\n\r\n", false},
		"Connection":           {"CONNECT a.example:443 HTTP/1.1\r\nConnection: close\r\n\r\n", false},
		"Content-Length":       {"CONNECT a.example:443 HTTP/1.1\r\nContent-Length: 5\r\n\r\n", false},
		"a field twice":        {"CONNECT a.example:443 HTTP/1.1\r\nX-A: 1\r\nx-a: 2\r\n\r\n", false},
		"malformed Host field": {"CONNECT a.example:443 HTTP/1.1\r\nHost: a b\r\n\r\n", false},
		"folded":               {"CONNECT a.example:443 HTTP/1.1\r\nX-A: 1\r\n 2\r\n\r\n", false},
	} {
		t.Run(name, func(t *testing.T) {
			r := parseConnect([]byte(tc.head))
			if (r != nil) != tc.fast {
				t.Fatalf("parsed by the front: %v, want %v", r != nil, tc.fast)
			}
			if r != nil && (r.Host != r.URL.Host || r.Header.Get("Host") != "" || r.Body != http.NoBody) {
				t.Fatalf("%+v", r)
			}
		})
	}
}
