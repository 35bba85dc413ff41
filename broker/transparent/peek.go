package transparent

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
)

// MaxPeek bounds the bytes read from a redirected connection to find its host: a TLS
// ClientHello (even with large post-quantum key shares) or an HTTP request head fits.
const MaxPeek = 16 << 10

// Protocols a redirected connection is recognised as.
const (
	ProtoTLS  = "tls"
	ProtoHTTP = "http"
)

var (
	// ErrShort: more bytes are needed to tell.
	ErrShort = errors.New("more bytes needed")
	// ErrNotTLSOrHTTP: the bytes are neither a TLS ClientHello nor an HTTP/1.x request head.
	ErrNotTLSOrHTTP = errors.New("not TLS or HTTP")
)

// Hello is what the first bytes of a redirected connection say about where it is going.
type Hello struct {
	Proto string // ProtoTLS or ProtoHTTP
	// Host is the TLS server name (SNI; "" when the ClientHello has none) or the HTTP Host
	// header's host, lower case, without a port or a trailing dot.
	Host string
	// Port is the Host header's port, 0 when it has none (HTTP only).
	Port int
}

// Parse reads the host from the first bytes b of a connection: a TLS ClientHello, possibly
// spread over several records, or an HTTP/1.x request line and headers. It returns ErrShort
// when b ends before the answer, and an error wrapping ErrNotTLSOrHTTP when b can be neither.
func Parse(b []byte) (Hello, error) {
	if len(b) == 0 {
		return Hello{}, ErrShort
	}
	if b[0] == 0x16 {
		host, err := parseClientHello(b)
		return Hello{Proto: ProtoTLS, Host: host}, err
	}
	return parseHTTP(b)
}

// Peek reads from r until Parse can answer, at most max bytes, and returns the answer with
// every byte read (to be replayed). A reader that ends or fails first gives its error.
func Peek(r io.Reader, max int) (Hello, []byte, error) {
	buf := make([]byte, 0, 2048)
	for {
		if len(buf) == cap(buf) {
			n := min(2*cap(buf), max)
			if n == len(buf) {
				return Hello{}, buf, errors.New("no TLS ClientHello or HTTP request head in the first " + strconv.Itoa(max) + " bytes")
			}
			buf = append(make([]byte, 0, n), buf...)
		}
		k, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+k]
		if k > 0 {
			h, perr := Parse(buf)
			if perr != ErrShort {
				return h, buf, perr
			}
		}
		if err != nil {
			return Hello{}, buf, err
		}
	}
}

func notTLSOrHTTP(what string) error {
	return errors.Join(ErrNotTLSOrHTTP, errors.New(what))
}

// parseClientHello returns the SNI host name of the ClientHello that b begins with.
func parseClientHello(b []byte) (string, error) {
	// Collect the handshake bytes of the leading handshake records.
	var hs []byte
	for len(b) > 0 {
		if len(b) >= 2 && b[1] != 3 {
			return "", notTLSOrHTTP("not a TLS record version")
		}
		if len(b) < 5 {
			return "", ErrShort
		}
		if b[0] != 0x16 {
			return "", notTLSOrHTTP("a TLS record other than a handshake before the ClientHello ended")
		}
		if b[1] != 3 {
			return "", notTLSOrHTTP("not a TLS record version")
		}
		n := int(b[3])<<8 | int(b[4])
		if n == 0 || n > 1<<14 {
			return "", notTLSOrHTTP("bad TLS record length")
		}
		if len(b) < 5+n {
			hs = append(hs, b[5:]...)
			break
		}
		hs = append(hs, b[5:5+n]...)
		b = b[5+n:]
		if len(hs) >= 4 && len(hs) >= 4+hsLen(hs) {
			break
		}
	}
	if len(hs) < 4 {
		return "", ErrShort
	}
	if hs[0] != 1 {
		return "", notTLSOrHTTP("TLS handshake is not a ClientHello")
	}
	n := hsLen(hs)
	if n > MaxPeek {
		return "", notTLSOrHTTP("ClientHello too large")
	}
	if len(hs) < 4+n {
		return "", ErrShort
	}
	return sniOf(hs[4 : 4+n])
}

func hsLen(hs []byte) int { return int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3]) }

// reader reads big-endian fields from a complete message; a field past the end sets bad.
type reader struct {
	b   []byte
	bad bool
}

func (r *reader) take(n int) []byte {
	if r.bad || n > len(r.b) {
		r.bad = true
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8() int {
	v := r.take(1)
	if v == nil {
		return 0
	}
	return int(v[0])
}

func (r *reader) u16() int {
	v := r.take(2)
	if v == nil {
		return 0
	}
	return int(v[0])<<8 | int(v[1])
}

// sniOf finds the server_name extension in a ClientHello body.
func sniOf(body []byte) (string, error) {
	r := &reader{b: body}
	r.take(2 + 32)  // legacy_version, random
	r.take(r.u8())  // legacy_session_id
	r.take(r.u16()) // cipher_suites
	r.take(r.u8())  // legacy_compression_methods
	if r.bad {
		return "", notTLSOrHTTP("malformed ClientHello")
	}
	if len(r.b) == 0 {
		return "", nil // no extensions
	}
	exts := &reader{b: r.take(r.u16())}
	if r.bad {
		return "", notTLSOrHTTP("malformed ClientHello extensions")
	}
	host := ""
	seen := false
	for len(exts.b) > 0 {
		typ := exts.u16()
		data := exts.take(exts.u16())
		if exts.bad {
			return "", notTLSOrHTTP("malformed ClientHello extension")
		}
		if typ != 0 {
			continue
		}
		if seen {
			return "", notTLSOrHTTP("two server_name extensions")
		}
		seen = true
		list := &reader{b: data}
		names := &reader{b: list.take(list.u16())}
		for len(names.b) > 0 && !names.bad {
			kind := names.u8()
			name := names.take(names.u16())
			if kind == 0 && host == "" && !names.bad {
				h, ok := hostName(string(name))
				if !ok {
					return "", notTLSOrHTTP("server name is not a host name")
				}
				host = h
			}
		}
		if list.bad || names.bad || len(list.b) != 0 {
			return "", notTLSOrHTTP("malformed server_name extension")
		}
	}
	return host, nil
}

// hostName returns s as a DNS host name (lower case, no trailing dot), or false when it is
// not one: an address literal, empty labels, characters outside letters, digits, '-' and '_'.
func hostName(s string) (string, bool) {
	s = strings.TrimSuffix(strings.ToLower(s), ".")
	if s == "" || len(s) > 253 {
		return "", false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 {
			return "", false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", false
			}
		}
	}
	return s, true
}

// parseHTTP reads the Host of the HTTP/1.x request head b begins with.
func parseHTTP(b []byte) (Hello, error) {
	// The method: a token of upper-case letters (every method a client sends), then a space.
	i := 0
	for i < len(b) && i < 24 && b[i] >= 'A' && b[i] <= 'Z' {
		i++
	}
	switch {
	case i == len(b):
		return Hello{}, ErrShort
	case i == 0 || b[i] != ' ':
		return Hello{}, notTLSOrHTTP("not an HTTP request line")
	}
	eol := bytes.Index(b, []byte("\r\n"))
	if eol < 0 {
		if len(b) > 8<<10 || bytes.IndexByte(b, '\n') >= 0 {
			return Hello{}, notTLSOrHTTP("not an HTTP request line")
		}
		return Hello{}, ErrShort
	}
	line := string(b[:eol])
	parts := strings.Split(line, " ")
	if len(parts) != 3 || parts[1] == "" || (parts[2] != "HTTP/1.1" && parts[2] != "HTTP/1.0") {
		return Hello{}, notTLSOrHTTP("not an HTTP/1.x request line")
	}
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		return Hello{}, ErrShort
	}
	var host string
	found := false
	var lines []string
	if end > eol { // else the request line is the whole head
		lines = strings.Split(string(b[eol+2:end]), "\r\n")
	}
	for _, h := range lines {
		name, value, ok := strings.Cut(h, ":")
		if !ok {
			return Hello{}, notTLSOrHTTP("malformed HTTP header line")
		}
		if !strings.EqualFold(name, "Host") {
			continue
		}
		if found {
			return Hello{}, notTLSOrHTTP("two Host headers")
		}
		found, host = true, strings.TrimSpace(value)
	}
	if !found || host == "" {
		return Hello{}, notTLSOrHTTP("HTTP request without a Host header")
	}
	name, port := host, 0
	if h, p, err := net.SplitHostPort(host); err == nil {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return Hello{}, notTLSOrHTTP("bad port in the Host header")
		}
		name, port = h, n
	}
	name, ok := hostName(name)
	if !ok {
		return Hello{}, notTLSOrHTTP("the Host header is not a host name")
	}
	return Hello{Proto: ProtoHTTP, Host: name, Port: port}, nil
}
