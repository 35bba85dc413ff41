// Package wire guards the HTTP/1.1 byte stream an agent sends before net/http parses it.
//
// net/http is lenient where a proxy must not be: it accepts obs-fold continuation lines, bare
// LF line endings, identical duplicate Content-Length headers, and Content-Length together
// with Transfer-Encoding. A proxy that reads a message one way while the upstream reads it
// another is the root of request smuggling, so the guard rejects every message whose framing
// is ambiguous, with 400 and a closed connection, before any of its bytes reach the parser.
//
// Once parsed, whatever the protocol (HTTP/1.1, HTTP/2, inside a tunnel or not), a request's
// headers go through CheckHeaders before anything decides on them: a header the broker reads
// as one value may be there once only (headers.go).
package wire

import (
	"bytes"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// ErrFraming is returned by Read once the stream held a malformed message.
var ErrFraming = errors.New("malformed HTTP/1.1 message framing")

// maxHead bounds the request line plus headers the guard buffers; larger heads are refused.
const maxHead = 64 << 10

// Guard returns conn with its incoming HTTP/1.1 requests checked. On a violation it writes
// rejection (a complete HTTP response) to conn and makes further reads fail. After a CONNECT
// the stream passes through unchecked (the tunnel is the proxy's, and checked inside). A
// request that asks for an Upgrade does not change that: the stream is checked until Switch
// says the protocol was switched (a 101 was received and forwarded). An upgrade the server
// declined leaves an HTTP/1.1 connection like any other.
func Guard(conn net.Conn, rejection []byte) *Conn {
	return &Conn{Conn: conn, rejection: rejection}
}

type state int

const (
	stHead        state = iota // reading a request line and headers
	stBody                     // a fixed-length body: remain bytes
	stChunkSize                // a chunk-size line
	stChunkData                // chunk data: remain bytes, then CRLF
	stChunkCRLF                // the CRLF after chunk data
	stTrailers                 // trailer lines until an empty line
	stPassthrough              // protocol switched: no more checking
)

// Conn is a connection whose incoming requests are checked (see Guard).
type Conn struct {
	net.Conn
	rejection []byte

	mu      sync.Mutex // serialises the rejection with the server's own writes
	st      state
	line    []byte // the partial line (head, chunk size, trailers) carried between reads
	head    []byte // the head being collected
	remain  int64
	crlfGot int
	err     error

	scanned  int64 // bytes read and checked
	requests int64 // requests read to their end, body included
	endedAt  int64 // scanned when the last of them ended
	ended    bool  // set by onLine when a line ended a request
	upgrade  bool  // the last request asked for a protocol upgrade (see Switch)
	switched atomic.Bool
}

// Switch ends checking when the last request read asked for an upgrade: the server switched
// protocols (it forwarded a 101), and what follows is no longer HTTP/1.1. It is ignored
// otherwise, so that a 101 cannot turn checking off for a request that never asked for one.
//
// It may be called while another goroutine reads (net/http reads ahead while a handler runs):
// the reader makes the switch, before it checks its next bytes.
func (g *Conn) Switch() { g.switched.Store(true) }

// Between reports how many requests have been read whole, and whether every byte read so far
// belongs to one of them: the stream is between two requests, with nothing of the next one
// read yet. Never true after a request that switched protocols.
func (g *Conn) Between() (requests int64, between bool) {
	return g.requests, g.err == nil && g.st == stHead && g.scanned == g.endedAt
}

func (g *Conn) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.Conn.Write(p)
}

// Read returns bytes only after checking them; a violation anywhere in what was read means
// none of it is returned.
func (g *Conn) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.Conn.Read(p)
	if g.switched.Swap(false) && g.upgrade && g.st == stHead {
		g.st = stPassthrough
	}
	if n > 0 && g.st != stPassthrough {
		if verr := g.scan(p[:n]); verr != nil {
			g.err = verr
			g.mu.Lock()
			_, _ = g.Conn.Write(g.rejection)
			g.mu.Unlock()
			_ = g.Conn.Close()
			return 0, verr
		}
	}
	return n, err
}

func (g *Conn) scan(b []byte) error {
	end := g.scanned + int64(len(b))
	g.scanned = end
	// A request ended where the len(b) bytes still to scan begin.
	endRequest := func() { g.requests, g.endedAt = g.requests+1, end-int64(len(b)) }
	for len(b) > 0 {
		switch g.st {
		case stPassthrough:
			return nil
		case stBody:
			k := min(int64(len(b)), g.remain)
			g.remain -= k
			b = b[k:]
			if g.remain == 0 {
				g.st = stHead
				endRequest()
			}
		case stChunkData:
			k := min(int64(len(b)), g.remain)
			g.remain -= k
			b = b[k:]
			if g.remain == 0 {
				g.st, g.crlfGot = stChunkCRLF, 0
			}
		case stChunkCRLF:
			want := "\r\n"[g.crlfGot]
			if b[0] != want {
				return ErrFraming
			}
			b = b[1:]
			if g.crlfGot++; g.crlfGot == 2 {
				g.st = stChunkSize
			}
		default: // line-oriented states
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				g.line = append(g.line, b...)
				if len(g.line) > maxHead {
					return ErrFraming
				}
				return nil
			}
			g.line = append(g.line, b[:i+1]...)
			b = b[i+1:]
			line := g.line
			g.line = g.line[:0]
			if err := g.onLine(line); err != nil {
				return err
			}
			if g.ended {
				g.ended = false
				endRequest()
			}
		}
	}
	return nil
}

// onLine handles one complete line (ending in "\n") in a line-oriented state.
func (g *Conn) onLine(line []byte) error {
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return ErrFraming // bare LF
	}
	text := line[:len(line)-2]
	switch g.st {
	case stHead:
		if len(g.head)+len(line) > maxHead {
			return ErrFraming
		}
		g.head = append(g.head, line...)
		if len(text) == 0 {
			if len(g.head) == 2 {
				g.head = g.head[:0] // tolerated: an empty line between requests
				return nil
			}
			err := g.endHead()
			g.head = g.head[:0]
			return err
		}
	case stChunkSize:
		size := text
		if i := bytes.IndexByte(size, ';'); i >= 0 {
			size = size[:i] // chunk extensions are ignored
		}
		if len(size) == 0 || len(size) > 16 {
			return ErrFraming
		}
		n, err := strconv.ParseInt(string(size), 16, 64)
		if err != nil || n < 0 {
			return ErrFraming
		}
		if n == 0 {
			g.st = stTrailers
		} else {
			g.st, g.remain = stChunkData, n
		}
	case stTrailers:
		if len(text) == 0 {
			g.st, g.ended = stHead, true
			return nil
		}
		if _, _, err := headerField(text); err != nil {
			return err
		}
	}
	return nil
}

// endHead checks a complete head and sets up reading its body.
func (g *Conn) endHead() error {
	reqLine, fields, _ := bytes.Cut(g.head[:len(g.head)-4], []byte("\r\n"))
	method, _, ok := bytes.Cut(reqLine, []byte(" "))
	if !ok || !isToken(method) {
		return ErrFraming
	}
	var cl, te [][]byte
	hosts, upgrade := 0, false
	for more := len(fields) > 0; more; {
		var l []byte
		l, fields, more = bytes.Cut(fields, []byte("\r\n"))
		name, value, err := headerField(l)
		if err != nil {
			return err
		}
		switch {
		case bytes.EqualFold(name, []byte("content-length")):
			cl = append(cl, value)
		case bytes.EqualFold(name, []byte("transfer-encoding")):
			te = append(te, value)
		case bytes.EqualFold(name, []byte("host")):
			hosts++
		case bytes.EqualFold(name, []byte("upgrade")):
			upgrade = true
		}
	}
	switch {
	case hosts > 1, len(cl) > 1, len(te) > 1, len(cl) == 1 && len(te) == 1:
		return ErrFraming
	case len(te) == 1:
		if !bytes.EqualFold(bytes.TrimSpace(te[0]), []byte("chunked")) {
			return ErrFraming // only plain "chunked" has one meaning everywhere
		}
		g.st = stChunkSize
	case len(cl) == 1:
		v := bytes.TrimSpace(cl[0])
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil || n < 0 || len(v) == 0 || v[0] < '0' || v[0] > '9' {
			return ErrFraming
		}
		if n > 0 {
			g.st, g.remain = stBody, n
		}
	}
	g.upgrade = upgrade
	if string(method) == "CONNECT" {
		g.st = stPassthrough
	}
	g.ended = g.st == stHead // no body: the head was the whole request
	return nil
}

// headerField splits "Name: value", refusing obs-fold, whitespace before the colon, names that
// are not tokens, and control characters in values.
func headerField(l []byte) (name, value []byte, err error) {
	name, value, ok := bytes.Cut(l, []byte(":"))
	if !ok || len(name) == 0 || !isToken(name) {
		return nil, nil, ErrFraming // also catches obs-fold: the line starts with whitespace
	}
	for _, c := range value {
		if (c < 0x20 && c != '\t') || c == 0x7f {
			return nil, nil, ErrFraming
		}
	}
	return name, value, nil
}

func isToken(b []byte) bool {
	for _, c := range b {
		if !tokenChars[c] {
			return false
		}
	}
	return len(b) > 0
}

// tokenChars marks the bytes a token (RFC 9110 §5.6.2) is made of: visible ASCII but the
// delimiters.
var tokenChars = func() (t [256]bool) {
	for c := '!'; c <= '~'; c++ {
		t[c] = !strings.ContainsRune(`"(),/:;<=>?@[\]{}`, c)
	}
	return t
}()

var _ net.Conn = (*Conn)(nil)
