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
func (x *exchange) respond(resp *http.Response, s *scrub.Replacer, rng *byteRange) (*http.Response, error) {
	// The reason phrase is the upstream's own text, which could carry anything, and which a
	// client must ignore (RFC 9112 §4); HTTP/2 has none. The agent gets the standard one,
	// scrubbed or not. It matters on a 101, whose status line switchProtocols writes from
	// resp.Status; other responses are written from their status code alone.
	resp.Status = statusLine(resp.StatusCode)
	upgraded := resp.StatusCode == http.StatusSwitchingProtocols
	if !s.Empty() {
		if err := scrubResponse(resp, s, upgraded, rng); err != nil {
			return nil, err
		}
	}
	if !upgraded {
		removeHopByHop(resp.Header)
	}
	x.idHeader[0] = x.ev.RequestID
	resp.Header["X-Broker-Request-Id"] = x.idHeader[:] // the exchange's storage: no allocation
	x.ev.Status = resp.StatusCode
	if x.meter != nil && !upgraded {
		x.meter.Wrap(resp, x.metered) // after scrubbing, which decodes: the meter reads plain text
	}
	body := &countingBody{ReadCloser: resp.Body, n: &x.bytesOut, x: x}
	if w, ok := resp.Body.(io.Writer); ok && upgraded {
		resp.Body = &upgradedBody{countingBody: body, w: w, in: &x.bytesIn}
	} else {
		resp.Body = body
	}
	return resp, nil
}

// statusLine is the status of a response with status code code, as net/http writes it.
func statusLine(code int) string {
	if s, ok := statusLines[code]; ok {
		return s
	}
	return strconv.Itoa(code) + " status code " + strconv.Itoa(code)
}

// statusLines are the standard status lines, made once rather than for every response.
var statusLines = func() map[int]string {
	m := map[int]string{}
	for code := 100; code < 600; code++ {
		if text := http.StatusText(code); text != "" {
			m[code] = strconv.Itoa(code) + " " + text
		}
	}
	return m
}()

// scrubResponse makes everything of resp that reaches the agent scrubbed of s's patterns: the
// names and values of its header and trailer fields, and its body, decoded first if it must
// be, or the frames of the connection it upgraded; or, for the 206 to a range the broker
// widened (rng), the agent's range cut from it, masked (ranges.go). A response of a shape
// that cannot be scrubbed whole is refused, its body closed.
func scrubResponse(resp *http.Response, s *scrub.Replacer, upgraded bool, rng *byteRange) error {
	s.Header(resp.Header)
	s.Header(resp.Trailer) // its names, announced with the header; the values come at the body's end
	err := refusePartial(resp)
	if err != nil && rng != nil && resp.StatusCode == http.StatusPartialContent {
		if err = cutRange(resp, *rng, s); err == nil {
			return nil
		}
	}
	if err == nil {
		err = decodeForScrub(resp)
	}
	if err == nil && upgraded {
		err = scrubWebSocket(resp, s)
	}
	if err != nil {
		resp.Body.Close()
		return err
	}
	if resp.Body == http.NoBody || upgraded {
		return nil
	}
	return scrubBody(resp, s)
}

// maxWholeScrub is the largest response body that is scrubbed whole (scrubBody).
const maxWholeScrub = 32 << 10

// scrubBody makes resp's body scrubbed. A small body of known length without announced
// trailers, as most API answers are, over HTTP/1.x or HTTP/2, is read whole and scrubbed at
// once: it reaches the agent with its exact length, in the same write as the headers. Any
// other body is scrubbed as it streams, and reaches the agent chunked (its length can change),
// with its trailers scrubbed at its end.
//
// An HTTP/2 response can carry trailers nobody announced: the transport fills them in at the
// body's end, so a body read whole has them by then. They are scrubbed there, and the body
// goes to the agent chunked, which is how HTTP/1.1 carries trailers.
func scrubBody(resp *http.Response, s *scrub.Replacer) error {
	if resp.ContentLength <= 0 || resp.ContentLength > maxWholeScrub || (resp.ProtoMajor != 1 && resp.ProtoMajor != 2) || len(resp.Trailer) > 0 {
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
	resp.Body = &wholeBody{rest: body}
	if len(resp.Trailer) > 0 { // HTTP/2 trailers that came unannounced with the body's end
		s.Header(resp.Trailer)
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
		return nil
	}
	if int64(len(body)) != resp.ContentLength {
		resp.ContentLength = int64(len(body))
		resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	}
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

// decodeForScrub makes resp's body readable for scrubbing. Its content codings are read as a
// client reads them: from every Content-Encoding field line, every item of each line's list
// (RFC 9110 §8.4), identity meaning none. One gzip layer is removed; any other coding, or more
// than one, cannot be scrubbed, and such a response is refused rather than passed through.
// So are gRPC messages compressed one by one (Grpc-Encoding). A response without a body has
// nothing to decode.
func decodeForScrub(resp *http.Response) error {
	if resp.Body == http.NoBody {
		return nil
	}
	if ge := codings(resp.Header, "Grpc-Encoding"); len(ge) > 0 {
		return fmt.Errorf("%w: upstream sent gRPC messages compressed with %s to a host with a credential", errUnscrubbable, describeCodings(ge))
	}
	switch ce := codings(resp.Header, "Content-Encoding"); {
	case len(ce) == 0:
		return nil
	case len(ce) == 1 && (ce[0] == "gzip" || ce[0] == "x-gzip"):
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
		return fmt.Errorf("%w: upstream sent a response encoded with %s to a host with a credential; only one gzip layer can be removed to scrub it", errUnscrubbable, describeCodings(ce))
	}
}

// codings returns the codings a field lists over all its lines, lower case, without identity.
func codings(h http.Header, name string) []string {
	var out []string
	for _, line := range h.Values(name) {
		for item := range strings.SplitSeq(line, ",") {
			if c := strings.ToLower(strings.TrimSpace(item)); c != "" && c != "identity" {
				out = append(out, c)
			}
		}
	}
	return out
}

// describeCodings names codings for an error, which is audited: the registered names as they
// are, anything else as "an unknown coding", for the upstream's text could hold a secret.
func describeCodings(cs []string) string {
	names := make([]string, len(cs))
	for i, c := range cs {
		switch c {
		case "gzip", "x-gzip", "deflate", "br", "zstd", "compress", "x-compress", "dcz", "dcb", "snappy":
			names[i] = strconv.Quote(c)
		default:
			names[i] = "an unknown coding"
		}
	}
	return strings.Join(names, ", then ")
}
