package broker

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/capbroker/capbroker/broker/scrub"
)

// Byte ranges from a host whose responses are scrubbed.
//
// A response is scrubbed as one whole: a secret split between two responses is in neither.
// With byte ranges an agent could ask for a reflected secret in pieces (bytes=0-19, then
// bytes=20-), each too short to match, and join them. Dropping the range instead (a server may
// always answer with the whole representation, RFC 9110 §14.2) is safe but breaks clients that
// download in parts: the AWS CLI, given the whole object for each part it asked for, writes
// every part whole and reports success.
//
// So a single range is widened: the upstream is asked for the agent's range plus, on each
// side, the longest form of any secret to scrub (less one byte). Every occurrence of a secret
// that overlaps the agent's range then lies whole within what the upstream sends, where it is
// masked with a replacement of its own length ("[REDACTED]***", scrub.Masking), so that the
// offsets hold; the agent's range is cut from that and answered as a 206. The same bytes of a
// representation are masked the same way in every range, so parts join up.
//
// Anything else keeps the old rule: several ranges are not sent (the upstream answers whole,
// scrubbed whole), and an answer that holds part of a representation the broker did not ask
// for, or does not cover what it asked, or is encoded, is refused.

// byteRange is an agent's single byte range (RFC 9110 §14.1.2): first-last, first- (last -1)
// or -suffix (first -1).
type byteRange struct{ first, last, suffix int64 }

// parseRange reads a Range field of one byte range; ok is false for anything else.
func parseRange(v string) (r byteRange, ok bool) {
	spec, found := strings.CutPrefix(v, "bytes=")
	if !found || strings.Contains(spec, ",") {
		return r, false
	}
	a, b, found := strings.Cut(strings.TrimSpace(spec), "-")
	if !found {
		return r, false
	}
	num := func(s string) (int64, bool) {
		if s == "" || len(s) > 18 || strings.TrimLeft(s, "0123456789") != "" {
			return 0, false
		}
		n, err := strconv.ParseInt(s, 10, 64)
		return n, err == nil
	}
	switch {
	case a == "":
		n, ok := num(b)
		return byteRange{first: -1, last: -1, suffix: n}, ok && n > 0
	case b == "":
		n, ok := num(a)
		return byteRange{first: n, last: -1}, ok
	default:
		f, ok1 := num(a)
		l, ok2 := num(b)
		return byteRange{first: f, last: l}, ok1 && ok2 && f <= l
	}
}

// widened is the Range field asking for r and by bytes on each side.
func (r byteRange) widened(by int64) string {
	switch {
	case r.first < 0:
		return "bytes=-" + strconv.FormatInt(r.suffix+by, 10)
	case r.last < 0:
		return "bytes=" + strconv.FormatInt(max(0, r.first-by), 10) + "-"
	}
	return "bytes=" + strconv.FormatInt(max(0, r.first-by), 10) + "-" + strconv.FormatInt(r.last+by, 10)
}

// within returns r as absolute offsets in a representation of size bytes; ok is false when
// it is not satisfiable.
func (r byteRange) within(size int64) (first, last int64, ok bool) {
	switch {
	case r.first < 0:
		first, last = max(0, size-r.suffix), size-1
	case r.last < 0:
		first, last = r.first, size-1
	default:
		first, last = r.first, min(r.last, size-1)
	}
	return first, last, first < size
}

// narrowRange prepares out, a request to a host whose responses s scrubs, for a range
// request: one byte range is widened by s's longest pattern and returned, to be cut from the
// answer (cutRange); anything else is removed.
func narrowRange(out *http.Request, s *scrub.Replacer) *byteRange {
	vals := out.Header.Values("Range")
	if len(vals) == 0 {
		out.Header.Del("If-Range")
		return nil
	}
	r, ok := parseRange(vals[0])
	if !ok || len(vals) > 1 {
		out.Header.Del("Range")
		out.Header.Del("If-Range")
		return nil
	}
	out.Header.Set("Range", r.widened(int64(s.MaxLen())))
	return &r
}

// cutRange makes resp, the upstream's 206 to a widened range, the agent's 206 to r: the body
// masked (s.Masking) and cut to r. It refuses an answer that is encoded, has trailers, or does
// not cover the widened range. An unsatisfiable r is answered 416, as the upstream would have.
func cutRange(resp *http.Response, r byteRange, s *scrub.Replacer) error {
	if len(resp.Header.Values("Content-Range")) != 1 || len(codings(resp.Header, "Content-Encoding")) > 0 || len(resp.Trailer) > 0 {
		return errPartial
	}
	start, end, size, ok := parseContentRange(resp.Header.Get("Content-Range"))
	if !ok {
		return errPartial
	}
	first, last, ok := r.within(size)
	if !ok {
		resp.Body.Close()
		resp.StatusCode, resp.Status = http.StatusRequestedRangeNotSatisfiable, statusLine(http.StatusRequestedRangeNotSatisfiable)
		resp.Header.Set("Content-Range", "bytes */"+strconv.FormatInt(size, 10))
		resp.Header.Del("Content-Length")
		resp.ContentLength, resp.Body = 0, http.NoBody
		return nil
	}
	by := int64(s.MaxLen())
	if start > max(0, first-by) || end < min(size-1, last+by) {
		return errPartial // a secret at the edge of the agent's range could be cut in two
	}
	n := last - first + 1
	resp.Body = &cutBody{r: s.Masking().Reader(resp.Body), skip: first - start, left: n}
	resp.ContentLength = n
	resp.Header.Set("Content-Length", strconv.FormatInt(n, 10))
	resp.Header.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", first, last, size))
	return nil
}

// parseContentRange reads "bytes start-end/size" with a known size.
func parseContentRange(v string) (start, end, size int64, ok bool) {
	spec, found := strings.CutPrefix(strings.TrimSpace(v), "bytes ")
	if !found {
		return 0, 0, 0, false
	}
	rng, total, found := strings.Cut(spec, "/")
	a, b, found2 := strings.Cut(rng, "-")
	if !found || !found2 {
		return 0, 0, 0, false
	}
	var err1, err2, err3 error
	start, err1 = strconv.ParseInt(a, 10, 64)
	end, err2 = strconv.ParseInt(b, 10, 64)
	size, err3 = strconv.ParseInt(total, 10, 64)
	ok = err1 == nil && err2 == nil && err3 == nil && 0 <= start && start <= end && end < size
	return start, end, size, ok
}

// cutBody is the part of a masked body from skip bytes on, left bytes long.
type cutBody struct {
	r          io.ReadCloser
	skip, left int64
}

func (c *cutBody) Read(p []byte) (int, error) {
	if c.skip > 0 {
		n, err := io.CopyN(io.Discard, c.r, c.skip)
		c.skip -= n
		if err != nil {
			return 0, fmt.Errorf("upstream range body: %w", unexpected(err))
		}
	}
	if c.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if err == io.EOF && c.left > 0 {
		err = fmt.Errorf("upstream range body: %w", io.ErrUnexpectedEOF)
	}
	if c.left == 0 && err == nil {
		err = io.EOF
	}
	return n, err
}

// Close reads what is left of the widened range (at most the longest pattern, and what the
// masking holds back), so that the upstream connection can serve another request.
func (c *cutBody) Close() error {
	_, _ = io.CopyN(io.Discard, c.r, 64<<10)
	return c.r.Close()
}

// refusePartial returns an error for a response that holds part of a representation.
func refusePartial(resp *http.Response) error {
	partial := resp.StatusCode == http.StatusPartialContent ||
		resp.StatusCode/100 == 2 && len(resp.Header.Values("Content-Range")) > 0
	for _, ct := range resp.Header.Values("Content-Type") {
		if strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), "multipart/byteranges") {
			partial = true
		}
	}
	if partial {
		return errPartial
	}
	return nil
}

var errPartial = fmt.Errorf("%w: upstream answered with part of a representation (a byte range) from a host with a credential that the broker did not ask for or cannot scrub; a secret split across parts could not be scrubbed", errUnscrubbable)
