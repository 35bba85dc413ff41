package transparent

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"testing/iotest"
)

// clientHello returns the first flight of a real TLS client for serverName.
func clientHello(t testing.TB, serverName string) []byte {
	t.Helper()
	c, s := net.Pipe()
	go func() {
		tc := tls.Client(c, &tls.Config{ServerName: serverName, InsecureSkipVerify: serverName == "", NextProtos: []string{"h2", "http/1.1"}})
		_ = tc.Handshake()
	}()
	var buf [MaxPeek]byte
	var out []byte
	for {
		n, err := s.Read(buf[:])
		out = append(out, buf[:n]...)
		if _, perr := Parse(out); perr != ErrShort || err != nil {
			break
		}
	}
	s.Close()
	return out
}

func TestParseClientHello(t *testing.T) {
	hello := clientHello(t, "API.Example.com.")
	h, err := Parse(hello)
	if err != nil || h.Proto != ProtoTLS || h.Host != "api.example.com" {
		t.Fatalf("Parse = %+v, %v; want tls api.example.com", h, err)
	}
	// Every strict prefix needs more bytes; no prefix is taken for an answer.
	for i := 0; i < len(hello); i++ {
		if _, err := Parse(hello[:i]); err != ErrShort {
			t.Fatalf("prefix %d/%d: %v, want ErrShort", i, len(hello), err)
		}
	}
	// The same ClientHello split over two records (allowed by TLS, used by some clients).
	body := hello[5:]
	split := append([]byte{0x16, 3, 1, 0, 40}, body[:40]...)
	rest := body[40:]
	split = append(split, 0x16, 3, 1, byte(len(rest)>>8), byte(len(rest)))
	split = append(split, rest...)
	if h, err := Parse(split); err != nil || h.Host != "api.example.com" {
		t.Fatalf("split ClientHello: %+v, %v", h, err)
	}
	// No SNI (a client dialling an address literal).
	h, err = Parse(clientHello(t, ""))
	if err != nil || h.Proto != ProtoTLS || h.Host != "" {
		t.Fatalf("no SNI: %+v, %v", h, err)
	}
}

func TestParseHTTP(t *testing.T) {
	for _, tc := range []struct {
		in   string
		host string
		port int
		err  error
	}{
		{"GET /x HTTP/1.1\r\nHost: API.example.com\r\nAccept: */*\r\n\r\n", "api.example.com", 0, nil},
		{"POST / HTTP/1.1\r\nhost: example.com:8080\r\n\r\nbody", "example.com", 8080, nil},
		{"GET / HTTP/1.1\r\nHost: a.test\r\n", "", 0, ErrShort},
		{"GE", "", 0, ErrShort},
		{"GET / HTTP/1.1\r\nAccept: */*\r\n\r\n", "", 0, ErrNotTLSOrHTTP},
		{"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n", "", 0, ErrNotTLSOrHTTP},
		{"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", "", 0, ErrNotTLSOrHTTP},
		{"GET / HTTP/1.1\r\nHost: a.test:99999\r\n\r\n", "", 0, ErrNotTLSOrHTTP},
		{"SSH-2.0-OpenSSH_9.6\r\n", "", 0, ErrNotTLSOrHTTP},
		{"\x00\x01binary", "", 0, ErrNotTLSOrHTTP},
		{"GET / HTTP/2.0\r\n\r\n", "", 0, ErrNotTLSOrHTTP},
		{"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00", "", 0, ErrNotTLSOrHTTP}, // a ServerHello
		{"\x16\x02\x00", "", 0, ErrNotTLSOrHTTP},
	} {
		h, err := Parse([]byte(tc.in))
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("Parse(%q) = %+v, %v; want %v", tc.in, h, err, tc.err)
			}
			continue
		}
		if err != nil || h.Proto != ProtoHTTP || h.Host != tc.host || h.Port != tc.port {
			t.Errorf("Parse(%q) = %+v, %v; want http %s:%d", tc.in, h, err, tc.host, tc.port)
		}
	}
}

func TestPeek(t *testing.T) {
	hello := clientHello(t, "a.test")
	// One byte at a time: Peek reads on until the ClientHello is whole, and returns all of it.
	h, got, err := Peek(iotest.OneByteReader(io.MultiReader(bytes.NewReader(hello), bytes.NewReader([]byte("more")))), MaxPeek)
	if err != nil || h.Host != "a.test" || !bytes.Equal(got, hello) {
		t.Fatalf("Peek = %+v, %d bytes, %v", h, len(got), err)
	}
	// A head that never ends is cut at the bound.
	endless := io.MultiReader(bytes.NewReader([]byte("GET / HTTP/1.1\r\n")), bytes.NewReader(bytes.Repeat([]byte("X-A: b\r\n"), MaxPeek)))
	if _, got, err := Peek(endless, MaxPeek); err == nil || len(got) > MaxPeek {
		t.Fatalf("endless head: %d bytes, %v", len(got), err)
	}
	// A connection that ends early.
	if _, _, err := Peek(bytes.NewReader([]byte("GET / HT")), MaxPeek); err != io.EOF {
		t.Fatalf("short: %v", err)
	}
}

// FuzzParse: Parse never panics, never answers from bytes it has not seen (an answer stays
// the same when more bytes follow), and a host it returns is a plain host name.
func FuzzParse(f *testing.F) {
	f.Add(clientHello(f, "api.example.com"))
	f.Add(clientHello(f, ""))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: example.com\r\n\r\n"))
	f.Add([]byte("CONNECT a:1 HTTP/1.1\r\nHost: a:1\r\n\r\n"))
	f.Add([]byte("\x16\x03\x01\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := Parse(b)
		if err == ErrShort {
			return
		}
		h2, err2 := Parse(append(append([]byte(nil), b...), "\r\n\r\nextra"...))
		if (err == nil) != (err2 == nil) || h != h2 {
			t.Fatalf("answer changed with more bytes: %+v %v -> %+v %v", h, err, h2, err2)
		}
		if err == nil && h.Host != "" {
			if _, ok := hostName(h.Host); !ok {
				t.Fatalf("host %q is not a host name", h.Host)
			}
		}
	})
}
