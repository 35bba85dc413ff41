package aws

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// MaxChunk is the largest aws-chunked chunk re-signed: a chunk is held whole while its
// signature, which precedes it, is computed. SDKs send 64 KiB chunks.
const MaxChunk = 8 << 20

// errChunked is the error a malformed aws-chunked body ends with (the upload fails; nothing
// unsigned is sent).
var errChunked = errors.New("aws: malformed aws-chunked body")

// rechunker re-signs an aws-chunked body (STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER]) as it
// streams: each chunk's signature chains from the previous one, starting at the request's
// seed signature. Chunk sizes, and so the body's length, are kept: only the 64 hex digits of
// each signature change.
type rechunker struct {
	src     io.ReadCloser
	r       *bufio.Reader
	key     []byte
	prefix  string // "\n" + amzDate + "\n" + scope + "\n" after the algorithm line
	prev    string // previous signature
	trailer bool

	out  []byte // re-signed bytes not yet read
	obuf []byte // the array out is built in, reused
	buf  []byte // the current chunk
	done bool
	err  error
}

func newRechunker(src io.ReadCloser, key []byte, amzDate, scope, seed string, trailer bool) *rechunker {
	return &rechunker{
		src: src, r: bufio.NewReaderSize(src, 64<<10), key: key,
		prefix: "\n" + amzDate + "\n" + scope + "\n", prev: seed, trailer: trailer,
	}
}

func (c *rechunker) Read(p []byte) (int, error) {
	for len(c.out) == 0 {
		if c.err != nil {
			return 0, c.err
		}
		if c.done {
			c.err = io.EOF
			if _, err := c.r.Peek(1); err != io.EOF {
				c.err = fmt.Errorf("%w: data after the final chunk", errChunked)
			}
			continue
		}
		if err := c.next(); err != nil {
			c.err = err
		}
	}
	n := copy(p, c.out)
	c.out = c.out[n:]
	return n, nil
}

func (c *rechunker) Close() error { return c.src.Close() }

const sigLen = 64 // hex digits of a signature

// readLine reads one CRLF-terminated line (without it), bounded.
func (c *rechunker) readLine() (string, error) {
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		if err == io.EOF {
			return "", fmt.Errorf("%w: truncated", errChunked)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			return "", fmt.Errorf("%w: line too long", errChunked)
		}
		return "", err
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return "", fmt.Errorf("%w: line not ended by CRLF", errChunked)
	}
	return string(line[:len(line)-2]), nil
}

// sign signs one string to sign and remembers the signature as the previous one.
func (c *rechunker) sign(alg, hash string) string {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte(alg))
	m.Write([]byte(c.prefix))
	m.Write([]byte(c.prev))
	m.Write([]byte{'\n'})
	m.Write([]byte(hash))
	c.prev = hex.EncodeToString(m.Sum(nil))
	return c.prev
}

// next reads one chunk and queues it re-signed.
func (c *rechunker) next() error {
	line, err := c.readLine()
	if err != nil {
		return err
	}
	size, ext, ok := strings.Cut(line, ";")
	old, hasSig := strings.CutPrefix(ext, "chunk-signature=")
	if !ok || !hasSig || len(old) != sigLen {
		return fmt.Errorf("%w: chunk header is not SIZE;chunk-signature=SIGNATURE", errChunked)
	}
	n, err := strconv.ParseUint(size, 16, 32)
	if err != nil || len(size) > 8 {
		return fmt.Errorf("%w: chunk size is not hex", errChunked)
	}
	if n > MaxChunk {
		return fmt.Errorf("%w: chunk of %d bytes is over the %d the broker re-signs", errChunked, n, MaxChunk)
	}
	if cap(c.buf) < int(n) {
		c.buf = make([]byte, n)
	}
	data := c.buf[:n]
	if _, err := io.ReadFull(c.r, data); err != nil {
		return fmt.Errorf("%w: truncated chunk", errChunked)
	}
	if n > 0 {
		if end, err := c.readLine(); err != nil || end != "" {
			return fmt.Errorf("%w: chunk not followed by CRLF", errChunked)
		}
	}
	h := sha256.Sum256(data)
	sig := c.sign("AWS4-HMAC-SHA256-PAYLOAD", emptySHA256+"\n"+hex.EncodeToString(h[:]))
	out := c.obuf[:0]
	if need := len(size) + len(";chunk-signature=") + sigLen + 4 + int(n); cap(out) < need {
		out = make([]byte, 0, need)
		c.obuf = out
	}
	out = append(out, size...)
	out = append(out, ";chunk-signature="...)
	out = append(out, sig...)
	out = append(out, "\r\n"...)
	if n > 0 {
		out = append(out, data...)
		out = append(out, "\r\n"...)
		c.out = out
		return nil
	}
	// The final, empty chunk: then either an empty line, or the trailing headers and
	// their signature and an empty line.
	c.done = true
	if !c.trailer {
		if end, err := c.readLine(); err != nil || end != "" {
			return fmt.Errorf("%w: final chunk not followed by CRLF", errChunked)
		}
		c.out = append(out, "\r\n"...)
		return nil
	}
	var canon bytes.Buffer
	for {
		l, err := c.readLine()
		if err != nil {
			return err
		}
		name, val, ok := strings.Cut(l, ":")
		if !ok {
			return fmt.Errorf("%w: trailer is not NAME:VALUE", errChunked)
		}
		if strings.EqualFold(name, "x-amz-trailer-signature") {
			if len(strings.TrimSpace(val)) != sigLen {
				return fmt.Errorf("%w: trailer signature is not 64 hex digits", errChunked)
			}
			break
		}
		if canon.Len() > 16<<10 {
			return fmt.Errorf("%w: trailers too long", errChunked)
		}
		canon.WriteString(strings.ToLower(name))
		canon.WriteByte(':')
		canon.WriteString(strings.TrimSpace(val))
		canon.WriteByte('\n')
		out = append(out, l...)
		out = append(out, "\r\n"...)
	}
	if end, err := c.readLine(); err != nil || end != "" {
		return fmt.Errorf("%w: trailer signature not followed by an empty line", errChunked)
	}
	th := sha256.Sum256(canon.Bytes())
	sig = c.sign("AWS4-HMAC-SHA256-TRAILER", hex.EncodeToString(th[:]))
	out = append(out, "x-amz-trailer-signature:"...)
	out = append(out, sig...)
	out = append(out, "\r\n\r\n"...)
	c.out = out
	return nil
}
