package broker

import (
	"net"
	"net/http"
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
