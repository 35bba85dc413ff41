package broker

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/capbroker/capbroker/broker/scrub"
)

// respond scrubs and wraps the upstream response. The audit event is written when goproxy
// closes the body: after the last byte reached the agent, or when the agent went away.
func (x *exchange) respond(resp *http.Response, s *scrub.Replacer) (*http.Response, error) {
	upgraded := resp.StatusCode == http.StatusSwitchingProtocols
	if !s.Empty() {
		s.Header(resp.Header)
		err := decodeForScrub(resp)
		if err == nil && upgraded {
			err = scrubWebSocket(resp, s)
		}
		if err != nil {
			resp.Body.Close()
			return nil, err
		}
		if resp.Body != http.NoBody && !upgraded {
			if err := scrubBody(resp, s); err != nil {
				return nil, err
			}
		}
	}
	if !upgraded {
		removeHopByHop(resp.Header)
	}
	resp.Header.Set("X-Broker-Request-Id", x.ev.RequestID)
	x.ev.Status = resp.StatusCode
	body := &countingBody{ReadCloser: resp.Body, n: &x.bytesOut, done: x.finish}
	if w, ok := resp.Body.(io.Writer); ok && upgraded {
		resp.Body = &upgradedBody{countingBody: body, w: w, in: &x.bytesIn}
	} else {
		resp.Body = body
	}
	return resp, nil
}

// maxWholeScrub is the largest response body that is scrubbed whole (scrubBody).
const maxWholeScrub = 32 << 10

// scrubBody makes resp's body scrubbed. A small HTTP/1.x body of known length and without
// trailers, as most API answers are, is read whole and scrubbed at once: it reaches the agent
// with its exact length, in the same write as the headers. Any other body is scrubbed as it
// streams, and reaches the agent chunked (its length can change), with its trailers scrubbed
// at its end.
func scrubBody(resp *http.Response, s *scrub.Replacer) error {
	if resp.ContentLength <= 0 || resp.ContentLength > maxWholeScrub || resp.ProtoMajor != 1 || len(resp.Trailer) > 0 {
		resp.Body = &trailerScrubber{ReadCloser: s.Reader(resp.Body), resp: resp, s: s}
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
		return nil
	}
	// One byte more than the length: a body that ends where it should ends this read short,
	// at io.EOF, which is also what gives the upstream connection back to the pool.
	body := make([]byte, resp.ContentLength+1)
	n, err := io.ReadFull(resp.Body, body)
	resp.Body.Close()
	switch {
	case err == nil:
		err = errors.New("more bytes than its Content-Length")
	case err == io.ErrUnexpectedEOF && int64(n) == resp.ContentLength:
		err = nil
	case err == io.ErrUnexpectedEOF:
		err = fmt.Errorf("%d bytes where its Content-Length said %d", n, resp.ContentLength)
	}
	if err != nil {
		return fmt.Errorf("upstream response body: %w", err)
	}
	body = body[:n]
	// A replacement can be as long as what it replaces: the length tells whether the header
	// must change, never whether the body did.
	body = s.Bytes(body)
	if int64(len(body)) != resp.ContentLength {
		resp.ContentLength = int64(len(body))
		resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	}
	resp.Body = &wholeBody{rest: body}
	return nil
}

// wholeBody is a response body held in memory. Its last bytes come with io.EOF, so that
// copyFlushing leaves them to the end of the response: headers and body in one write.
type wholeBody struct{ rest []byte }

func (b *wholeBody) Read(p []byte) (int, error) {
	n := copy(p, b.rest)
	b.rest = b.rest[n:]
	if len(b.rest) == 0 {
		return n, io.EOF
	}
	return n, nil
}

func (*wholeBody) Close() error { return nil }

// decodeForScrub removes a gzip content encoding so the body can be scrubbed. Other
// encodings cannot be scrubbed, so such a response is refused rather than passed through.
func decodeForScrub(resp *http.Response) error {
	if ge := strings.ToLower(strings.TrimSpace(resp.Header.Get("Grpc-Encoding"))); ge != "" && ge != "identity" {
		return fmt.Errorf("upstream sent %q-compressed gRPC messages to a request carrying a credential; they cannot be scrubbed", ge)
	}
	switch ce := strings.ToLower(strings.TrimSpace(resp.Header.Get("Content-Encoding"))); ce {
	case "", "identity":
		return nil
	case "gzip", "x-gzip":
		if resp.Body == http.NoBody {
			return nil
		}
		zr, err := gzip.NewReader(resp.Body)
		if err != nil {
			return fmt.Errorf("upstream gzip body: %w", err)
		}
		resp.Body = readCloser{zr, resp.Body}
		resp.Header.Del("Content-Encoding")
		resp.Header.Del("Content-Length")
		resp.ContentLength = -1
		return nil
	default:
		return fmt.Errorf("upstream sent a %q-encoded response to a request carrying a credential; it cannot be scrubbed", ce)
	}
}
