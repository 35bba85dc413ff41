package wire

import (
	"bytes"
	"io"
	"net"
	"strings"
	"testing"
)

// verdict feeds data to a guard in the given read sizes and reports what the server side
// received and whether the guard refused the stream.
func verdict(t testing.TB, data []byte, split int) (got []byte, refused bool) {
	client, server := net.Pipe()
	g := Guard(server, []byte("REJECTED"))
	go func() {
		for len(data) > 0 {
			n := min(split, len(data))
			if _, err := client.Write(data[:n]); err != nil {
				break
			}
			data = data[n:]
		}
		client.Close()
	}()
	go io.Copy(io.Discard, client) // the rejection, if any
	buf := make([]byte, 1<<16)
	for {
		n, err := g.Read(buf)
		got = append(got, buf[:n]...)
		if err == ErrFraming {
			return got, true
		}
		if err != nil {
			return got, false
		}
	}
}

func TestGuard(t *testing.T) {
	cases := map[string]struct {
		in      string
		refused bool
	}{
		"simple GET":            {"GET / HTTP/1.1\r\nHost: a\r\n\r\n", false},
		"pipelined":             {"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n", false},
		"body by length":        {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello", false},
		"chunked with ext":      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n0\r\nT: v\r\n\r\n", false},
		"connect then bytes":    {"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n\x16\x03\x01garbage\n\n", false},
		"CL and TE":             {"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", true},
		"duplicate CL":          {"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc", true},
		"TE list":               {"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", true},
		"obs-fold":              {"GET / HTTP/1.1\r\nX: 1\r\n 2\r\n\r\n", true},
		"bare LF":               {"GET / HTTP/1.1\nHost: a\n\n", true},
		"bad chunk size":        {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nxyz\r\n", true},
		"chunk missing CRLF":    {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n", true},
		"smuggled after length": {"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\nabGET / HTTP/1.1\nX: y\n\n", true},
		"space in header name":  {"GET / HTTP/1.1\r\nX A: 1\r\n\r\n", true},
		"control char in value": {"GET / HTTP/1.1\r\nX: a\x01b\r\n\r\n", true},
		"plus sign length":      {"POST / HTTP/1.1\r\nContent-Length: +3\r\n\r\nabc", true},
		"huge head":             {"GET / HTTP/1.1\r\nX: " + strings.Repeat("a", maxHead) + "\r\n\r\n", true},
		"duplicate CL, cases":   {"POST / HTTP/1.1\r\ncontent-length: 3\r\nCONTENT-LENGTH: 3\r\n\r\nabc", true},
		"TE in capitals":        {"POST / HTTP/1.1\r\nTRANSFER-ENCODING: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", false},
		"two Hosts":             {"GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n", true},
		"upgrade not switched":  {"GET / HTTP/1.1\r\nHost: a\r\nupgrade: websocket\r\n\r\n\x81\x05frame\n\n", true},
		"CL+TE after upgrade":   {"GET / HTTP/1.1\r\nUpgrade: foo\r\n\r\nPOST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", true},
		"bare LF after upgrade": {"GET / HTTP/1.1\r\nUpgrade: foo\r\n\r\nGET / HTTP/1.1\nHost: a\n\n", true},
		"CONNECT passes bytes":  {"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n\x16\x03\x01\n\n", false},
		"head without fields":   {"GET / HTTP/1.1\r\n\r\n", false},
		"delimiter in a name":   {"GET / HTTP/1.1\r\nX(y): 1\r\n\r\n", true},
		"non-ASCII in a name":   {"GET / HTTP/1.1\r\nX\xc3\xa9: 1\r\n\r\n", true},
		"bad method":            {"G@T / HTTP/1.1\r\nHost: a\r\n\r\n", true},
	}
	for name, c := range cases {
		for _, split := range []int{1, 7, 1 << 16} {
			got, refused := verdict(t, []byte(c.in), split)
			if refused != c.refused {
				t.Errorf("%s (reads of %d): refused=%v, want %v", name, split, refused, c.refused)
			}
			if !refused && !bytes.Equal(got, []byte(c.in)) {
				t.Errorf("%s: passed bytes differ", name)
			}
		}
	}
}

// TestBetween: the guard knows when every byte read so far belongs to a whole request, which
// is what lets a tunnel put its connection aside between requests without losing any byte.
func TestBetween(t *testing.T) {
	get := "GET / HTTP/1.1\r\nHost: a\r\n\r\n"
	cases := map[string]struct {
		in       string
		requests int64
		between  bool
	}{
		"nothing yet":                 {"", 0, true},
		"one GET":                     {get, 1, true},
		"part of a head":              {"GET / HTTP/1.1\r\nHost: a\r\n", 0, false},
		"one byte of the next":        {get + "G", 1, false},
		"two pipelined":               {get + get, 2, true},
		"body by length, whole":       {"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 1, true},
		"body by length, short":       {"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhel", 0, false},
		"chunked with trailers":       {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nT: v\r\n\r\n", 1, true},
		"chunked before the trailers": {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n", 0, false},
		"an empty line after":         {get + "\r\n", 1, false},
		"upgrade":                     {"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n", 1, true},
	}
	for name, c := range cases {
		for _, split := range []int{1, 7, 1 << 16} {
			client, server := net.Pipe()
			g := Guard(server, []byte("REJECTED"))
			go func() {
				for data := []byte(c.in); len(data) > 0; data = data[min(split, len(data)):] {
					if _, err := client.Write(data[:min(split, len(data))]); err != nil {
						break
					}
				}
				client.Close()
			}()
			if _, err := io.Copy(io.Discard, g); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if n, ok := g.Between(); n != c.requests || ok != c.between {
				t.Errorf("%s (reads of %d): Between() = %d, %v; want %d, %v", name, split, n, ok, c.requests, c.between)
			}
		}
	}
}

// TestGuardSwitch: checking ends only after Switch, and only after a request that asked for an
// upgrade.
func TestGuardSwitch(t *testing.T) {
	frame := "\x81\x05frame\n\n" // not HTTP/1.1: a bare LF
	cases := map[string]struct {
		head    string
		refused bool
	}{
		"upgrade, switched":        {"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n", false},
		"no upgrade asked, Switch": {"GET / HTTP/1.1\r\nHost: a\r\n\r\n", true},
	}
	for name, c := range cases {
		client, server := net.Pipe()
		g := Guard(server, []byte("REJECTED"))
		go func() {
			_, _ = client.Write([]byte(c.head))
			_, _ = client.Write([]byte(frame))
			client.Close()
		}()
		buf := make([]byte, len(c.head))
		if _, err := io.ReadFull(g, buf); err != nil {
			t.Fatalf("%s: reading the head: %v", name, err)
		}
		g.Switch() // as the broker does once it has forwarded a 101
		rest, err := io.ReadAll(g)
		if refused := err != nil; refused != c.refused {
			t.Errorf("%s: refused=%v (%v), want %v", name, refused, err, c.refused)
		}
		if !c.refused && string(rest) != frame {
			t.Errorf("%s: passed %q, want %q", name, rest, frame)
		}
	}
}

// FuzzGuard: the verdict does not depend on how the stream is split into reads, the guard
// never panics, and it never passes on bytes that differ from its input.
func FuzzGuard(f *testing.F) {
	f.Add([]byte("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"), 3)
	f.Add([]byte("GET / HTTP/1.1\r\nX: 1\r\n 2\r\n\r\n"), 1)
	f.Fuzz(func(t *testing.T, data []byte, split int) {
		if split <= 0 || split > len(data)+1 {
			split = len(data) + 1
		}
		whole, refusedWhole := verdict(t, data, len(data)+1)
		parts, refusedParts := verdict(t, data, split)
		if refusedWhole != refusedParts {
			t.Fatalf("verdict depends on read split: whole=%v split(%d)=%v", refusedWhole, split, refusedParts)
		}
		if !bytes.HasPrefix(data, whole) || !bytes.HasPrefix(data, parts) {
			t.Fatal("guard passed bytes that are not a prefix of its input")
		}
	})
}
