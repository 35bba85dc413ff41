package upstream

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// writeSimple writes req as Request.Write would, byte for byte, when req is one of the
// requests it knows how to write, and reports whether it was: a request without a body, or
// with one in memory (io.NopCloser over a bytes.Reader, strings.Reader or bytes.Buffer,
// which Request.Write sends with the headers too) holding exactly ContentLength bytes; without
// trailers, nor Connection: close, to a host Request.Write would send as it is. Request.Write
// writes the same bytes with about five allocations (its formatted lines and transferWriter);
// writeSimple makes none. Any other request is left to Request.Write. Like Request.Write, it
// closes the body.
//
// What Request.Write does for such a request, which TestWriteSimpleAsRequestWrite holds
// writeSimple to: the request line with the method (GET when empty) and the URL's RequestURI;
// Host: the request's Host, else the URL's; User-Agent: the header's first value (none when
// it is empty), Go's own when the header has none; Content-Length: the body's length, or 0
// for POST, PUT and PATCH without one; then the other header fields (sorted, without Host,
// User-Agent, Content-Length, Transfer-Encoding and Trailer, nor names that are not valid),
// each value with its line breaks made spaces and trimmed; then the body.
func writeSimple(bw *bufio.Writer, req *http.Request) bool {
	if req.URL == nil || len(req.TransferEncoding) != 0 || len(req.Trailer) != 0 || req.Close ||
		req.Method == http.MethodConnect {
		return false
	}
	var body io.WriterTo // the body's bytes, all of them
	switch {
	case req.ContentLength == 0 && (req.Body == nil || req.Body == http.NoBody):
	case req.ContentLength > 0 && req.Body != nil:
		if body = inMemory(req.Body, req.ContentLength); body == nil {
			return false
		}
	default:
		return false
	}
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	// Request.Write turns a host that is not ASCII into punycode, sends an invalid one as an
	// empty Host, and takes an IPv6 zone out.
	if !isASCII(host) || !httpguts.ValidHostHeader(host) || strings.Contains(host, "%") {
		return false
	}
	ruri := req.URL.RequestURI()
	if hasCTL(ruri) { // Request.Write refuses it
		return false
	}
	if httptrace.ContextClientTrace(req.Context()) != nil {
		return false
	}

	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	bw.WriteString(method)
	bw.WriteByte(' ')
	bw.WriteString(ruri)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(host)
	bw.WriteString("\r\n")
	userAgent := defaultUserAgent
	if _, ok := req.Header["User-Agent"]; ok {
		userAgent = req.Header.Get("User-Agent")
	}
	if userAgent != "" {
		bw.WriteString("User-Agent: ")
		bw.WriteString(headerValue(userAgent))
		bw.WriteString("\r\n")
	}
	if body != nil {
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(bw.AvailableBuffer(), req.ContentLength, 10)) // in place
		bw.WriteString("\r\n")
	} else {
		switch method {
		case http.MethodPost, http.MethodPut, http.MethodPatch: // "many servers expect" one
			bw.WriteString("Content-Length: 0\r\n")
		}
	}
	keys := make([]string, 0, 16)
	for k := range req.Header {
		switch k {
		case "Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer":
			continue
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !httpguts.ValidHeaderFieldName(k) {
			continue
		}
		for _, v := range req.Header[k] {
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(headerValue(v))
			bw.WriteString("\r\n")
		}
	}
	bw.WriteString("\r\n")
	if body != nil {
		_, _ = body.WriteTo(bw) // an error is bw's, and sticks: the Flush after reports it
		_ = req.Body.Close()
	}
	return true
}

// Request.Write's io.NopCloser types, whose reader it looks into (as inMemory does).
var (
	nopCloserType         = reflect.TypeOf(io.NopCloser(nil))
	nopCloserWriterToType = reflect.TypeOf(io.NopCloser(strings.NewReader("")))
)

// inMemory is the reader of body when body is an io.NopCloser over a reader that holds n more
// bytes in memory, which Request.Write would read whole and send with the headers; else nil.
func inMemory(body io.ReadCloser, n int64) io.WriterTo {
	switch reflect.TypeOf(body) {
	case nopCloserType, nopCloserWriterToType:
	default:
		return nil
	}
	var left int
	r, _ := reflect.ValueOf(body).Field(0).Interface().(io.Reader)
	switch r := r.(type) {
	case *bytes.Reader:
		left = r.Len()
	case *strings.Reader:
		left = r.Len()
	case *bytes.Buffer:
		left = r.Len()
	default:
		return nil
	}
	if int64(left) != n {
		return nil // Request.Write sends n bytes, or fails
	}
	return r.(io.WriterTo)
}

// defaultUserAgent is the User-Agent Request.Write sends for a request whose header has none.
const defaultUserAgent = "Go-http-client/1.1"

var newlineToSpace = strings.NewReplacer("\n", " ", "\r", " ")

// headerValue is v as Request.Write writes a header value: line breaks made spaces, trimmed.
func headerValue(v string) string {
	if strings.ContainsAny(v, "\r\n") {
		v = newlineToSpace.Replace(v)
	}
	return textproto.TrimString(v)
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// hasCTL reports whether s holds an ASCII control character, which Request.Write refuses in
// a request target.
func hasCTL(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; b < ' ' || b == 0x7f {
			return true
		}
	}
	return false
}
