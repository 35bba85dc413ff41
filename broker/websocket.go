package broker

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/capbroker/capbroker/broker/scrub"
)

// A WebSocket whose upgrade request carried a credential is scrubbed like any other response:
// the server could echo the credential in a message. The request goes without
// Sec-WebSocket-Extensions (forward), so that frames are not compressed, and the server's
// frames (RFC 6455 §5) are read one at a time and passed on with the secrets replaced. A
// secret split across the fragments of a message is found too: what may begin one is held
// back into the next fragment. The agent's frames go upstream untouched.

// maxWebSocketFrame bounds a server frame on a scrubbed WebSocket: each is held whole, to be
// scrubbed and framed again. A larger one ends the connection.
const maxWebSocketFrame = 1 << 20

// WebSocket opcodes.
const (
	wsContinuation = 0x0
	wsText         = 0x1
	wsBinary       = 0x2
	wsClose        = 0x8
	wsPong         = 0xA
	maxControlLen  = 125
)

// scrubWebSocket makes the server's frames of an upgraded connection reach the agent scrubbed.
func scrubWebSocket(resp *http.Response, s *scrub.Replacer) error {
	if resp.Header.Get("Sec-WebSocket-Extensions") != "" {
		return fmt.Errorf("%w: upstream accepted the WebSocket upgrade with an extension the request did not offer", errUnscrubbable)
	}
	up, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		return errors.New("upstream upgrade: no connection to scrub")
	}
	resp.Body = &wsScrubber{ReadWriteCloser: up, r: bufio.NewReader(up), s: s}
	return nil
}

// wsScrubber is the upstream side of a scrubbed WebSocket connection: reads return the
// server's frames scrubbed; writes and Close go to the connection.
type wsScrubber struct {
	io.ReadWriteCloser
	r      *bufio.Reader
	s      *scrub.Replacer
	inMsg  bool   // a fragmented data message has begun and not ended
	held   []byte // its bytes that may begin a secret the next fragment completes
	frame  []byte // scratch: a frame's payload
	out    []byte // scrubbed frames; out[off:] not yet returned
	off    int
	err    error
	header [8]byte
}

func (w *wsScrubber) Read(p []byte) (int, error) {
	for w.off == len(w.out) {
		if w.err != nil {
			return 0, w.err
		}
		w.out, w.off = w.out[:0], 0
		w.err = w.next()
	}
	n := copy(p, w.out[w.off:])
	w.off += n
	return n, nil
}

// next reads one frame and appends its scrubbed form to w.out. It returns io.EOF when the
// server closed the connection between frames.
func (w *wsScrubber) next() error {
	h := w.header[:2]
	if _, err := io.ReadFull(w.r, h); err != nil {
		return err
	}
	fin, rsv, op, masked := h[0]&0x80 != 0, h[0]&0x70, h[0]&0x0f, h[1]&0x80 != 0
	size := uint64(h[1] & 0x7f)
	switch size {
	case 126:
		if _, err := io.ReadFull(w.r, w.header[:2]); err != nil {
			return unexpected(err)
		}
		size = uint64(binary.BigEndian.Uint16(w.header[:2]))
	case 127:
		if _, err := io.ReadFull(w.r, w.header[:8]); err != nil {
			return unexpected(err)
		}
		size = binary.BigEndian.Uint64(w.header[:8])
	}
	control := op >= wsClose
	switch {
	case masked:
		return errors.New("websocket: the server sent a masked frame")
	case rsv != 0:
		return errors.New("websocket: a server frame uses an extension; it cannot be scrubbed")
	case size > maxWebSocketFrame:
		return fmt.Errorf("websocket: a server frame of %d bytes is over the %d a scrubbed connection holds", size, maxWebSocketFrame)
	case control && (op > wsPong || !fin || size > maxControlLen),
		!control && (op > wsBinary || (op == wsContinuation) != w.inMsg):
		return fmt.Errorf("websocket: the server sent a malformed frame (opcode %#x)", op)
	}
	if uint64(cap(w.frame)) < size {
		w.frame = make([]byte, size)
	}
	payload := w.frame[:size]
	if _, err := io.ReadFull(w.r, payload); err != nil {
		return unexpected(err)
	}
	if control { // never fragmented: scrubbed whole, and kept within a control frame's size
		scrubbed := w.s.Bytes(payload)
		w.out = appendFrame(w.out, true, op, scrubbed[:min(len(scrubbed), maxControlLen)])
		return nil
	}
	in := append(w.held, payload...)
	scrubbed, taken := w.s.Stream(nil, in, fin)
	w.held = append(in[:0], in[taken:]...)
	w.inMsg = !fin
	w.out = appendFrame(w.out, fin, op, scrubbed)
	return nil
}

// unexpected is err for a stream that ended early (inside a frame, inside a range).
func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// appendFrame appends a server frame (unmasked) holding payload.
func appendFrame(b []byte, fin bool, op byte, payload []byte) []byte {
	if fin {
		op |= 0x80
	}
	switch n := len(payload); {
	case n < 126:
		b = append(b, op, byte(n))
	case n <= 0xffff:
		b = append(b, op, 126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, op, 127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	return append(b, payload...)
}
