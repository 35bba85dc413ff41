package broker

import (
	"bytes"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"
)

// A policy decides on input.request.path; the upstream acts on the request-target it receives.
// They must be one path, read one way, or a policy that allows /v1/models lets
// /v1/models/../files through to an upstream that serves /v1/files with the key.
//
// So the broker reads the path the agent sent (the raw request-target, not net/url's decoding
// of it) and normalises it as RFC 3986 §6.2.2 does: percent-escapes of unreserved characters
// (ALPHA DIGIT - . _ ~) are decoded, the hex of every other escape is upper-cased, characters a
// path may not hold raw are escaped, and dot-segments are removed (§5.2.4). Empty segments
// (//) are kept: the upstream will see them as the policy did. The policy gets that path as
// input.request.path and the agent's as input.request.raw_path, and the upstream gets exactly
// input.request.path (outbound).
//
// What an upstream could still read differently from the policy is refused with a 400 that
// says why (badRequest):
//   - a request-target that is not an absolute path (x:foo, *), or a path without one;
//   - ".." above the root;
//   - a backslash, which some servers (IIS, some Node and Python stacks) read as '/';
//   - ';' in the path, where Tomcat, Jetty and Spring start path parameters (/a/..;/b is
//     /a/../b to them); %3B is data to them and is kept, unless it hides a dot-segment;
//   - '#', a control character raw or escaped, a malformed escape;
//   - a segment that becomes a dot-segment when read by a server more lenient than RFC 3986:
//     one that decodes %2F or %5C into a separator, decodes twice (%252e), or drops ';'
//     parameters (..%2F, %2e%2e%5C, %252e%252e, ..%3B); or that is not UTF-8 once decoded
//     (%C0%AE, an overlong '.'); escapes of escapes more than three deep, whose decoding
//     would cost a pass over the path each;
//   - a character whose Unicode compatibility form (NFKC) holds '.', '/', '\\', ';', '%', '?'
//     or '#': servers that normalise paths with NFKC (some Python, .NET and Java stacks) read
//     %EF%BC%8E%EF%BC%8E (U+FF0E twice) as "..", and U+FF0F as '/'. See compatForm.
//
// An escaped slash that hides no dot-segment (%2F, as npm sends @scope%2Fname and GitLab
// group%2Fproject) is kept, escaped: the policy sees it inside its segment. The shipped
// policies match paths segment by segment, and those that grant a credential refuse %2F
// where it could move a segment boundary (see policies/paths.rego).
//
// The query goes upstream as the agent sent it; the policy sees it parsed. Go's parser drops a
// pair it cannot parse (one with ';', which some servers also split pairs on, or a malformed
// escape), so such a query is refused rather than sent with a pair the policy never saw.
//
// A request that asks the upstream to execute another method than its own (method override)
// is refused too: the policy decided on the request's method. See methodOverride.

// badRequest is a bad request whose reason the agent may read.
type badRequest struct{ reason string }

func (e badRequest) Error() string        { return "bad request: " + e.reason }
func (e badRequest) Is(target error) bool { return target == errBadRequest }

var (
	errNotAPath     = badRequest{"the request-target is not an absolute path (such as /v1/models): opaque (x:foo) and asterisk (*) forms are not forwarded"}
	errAboveRoot    = badRequest{"the URL path climbs above the root with '..'"}
	errBackslash    = badRequest{`the URL path has a backslash, which some servers read as '/'; percent-encode it as %5C`}
	errPathParam    = badRequest{"the URL path has ';', which some servers read as the start of path parameters; percent-encode it as %3B if it is data"}
	errFragment     = badRequest{"the request-target has '#': a fragment is not sent to a server"}
	errControl      = badRequest{"the URL path has a control character"}
	errBadEscape    = badRequest{"the URL path has a malformed percent-escape"}
	errHiddenDots   = badRequest{"the URL path has a dot-segment hidden by encoding (%2F, %5C, %25 or %3B around '.'), which some servers resolve after the policy has decided"}
	errNotUTF8      = badRequest{"the URL path is not UTF-8 once decoded"}
	errCompatForm   = badRequest{"the URL path has a character that servers normalising Unicode (NFKC) read as '.', '/', '\\', ';', '%', '?' or '#' (such as U+FF0E FULLWIDTH FULL STOP or U+2024 ONE DOT LEADER): send the ASCII character itself"}
	errDeepEscapes  = badRequest{"the URL path has escapes of escapes more than three deep (%252525…)"}
	errQuerySemi    = badRequest{"the query has ';', which some servers read as a separator between pairs; percent-encode it as %3B"}
	errQueryParse   = badRequest{"the query has a malformed percent-escape or '#'"}
	errPathOverride = badRequest{"X-Original-URL and X-Rewrite-URL are not forwarded: they let a server serve another path than the one requested"}
)

// RequestPath is requestPath for tools (broker policy eval): the path of u as sent, and as
// the policy sees it, or an error whose text says why the broker would refuse it.
func RequestPath(u *url.URL) (raw, clean string, err error) { return requestPath(u) }

// requestPath returns the path of u, a request's parsed target, as the agent sent it (raw) and
// as the policy sees it and the upstream gets it (clean).
func requestPath(u *url.URL) (raw, clean string, err error) {
	if u.Opaque != "" {
		return "", "", errNotAPath
	}
	// net/url keeps the path as sent in RawPath whenever its own escaping of the decoded Path
	// would differ; otherwise that escaping is the path as sent.
	raw = u.RawPath
	if raw == "" {
		raw = u.EscapedPath()
	}
	if raw == "" {
		if u.Host == "" {
			return "", "", errNotAPath
		}
		return "", "/", nil // absolute form without a path: "/" (RFC 9112 §3.2.1)
	}
	clean, err = normalisePath(raw)
	return raw, clean, err
}

// normalisePath returns raw, an absolute path as sent, normalised (see the top of this file),
// or a badRequest saying why it is refused.
func normalisePath(raw string) (string, error) {
	if raw[0] != '/' {
		return "", errNotAPath
	}
	if plainPath(raw) {
		return raw, nil // nearly every path: nothing to decode, escape or remove
	}
	var b strings.Builder
	b.Grow(len(raw) + 8)
	escaped := false // some escape is left in the result
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case c == '%':
			if i+2 >= len(raw) || !isHex(raw[i+1]) || !isHex(raw[i+2]) {
				return "", errBadEscape
			}
			v := unhex(raw[i+1])<<4 | unhex(raw[i+2])
			i += 2
			switch {
			case isUnreserved(v):
				b.WriteByte(v)
			case v < 0x20 || v == 0x7f:
				return "", errControl
			default:
				writeEscape(&b, v)
				escaped = true
			}
		case c == '\\':
			return "", errBackslash
		case c == ';':
			return "", errPathParam
		case c == '#':
			return "", errFragment
		case c < 0x20 || c == 0x7f:
			return "", errControl
		case isPathChar(c):
			b.WriteByte(c)
		default: // a space, '"', '<', '[', '{', a byte of UTF-8...: escaped, as a client should have
			writeEscape(&b, c)
			escaped = true
		}
	}
	clean, err := removeDotSegments(b.String())
	if err != nil {
		return "", err
	}
	if escaped {
		if err := lenientRead(clean); err != nil {
			return "", err
		}
	}
	return clean, nil
}

// plainPath reports whether p, which starts with '/', has only characters a path holds raw
// (no escape, no ';') and no "." or ".." segment: it is its own normal form.
func plainPath(p string) bool {
	seg := 0 // start of the current segment
	for i := 1; i <= len(p); i++ {
		if i == len(p) || p[i] == '/' {
			if s := p[seg+1 : i]; s == "." || s == ".." {
				return false
			}
			seg = i
			continue
		}
		if !isPathChar(p[i]) {
			return false
		}
	}
	return true
}

// removeDotSegments is RFC 3986 §5.2.4 for an absolute path, except that ".." above the root
// is refused rather than dropped: the agent meant something no server will agree on.
func removeDotSegments(p string) (string, error) {
	if !strings.Contains(p, "/.") {
		return p, nil
	}
	segs := strings.Split(p[1:], "/")
	out := segs[:0] // written at or behind the segment being read
	for i, s := range segs {
		last := i == len(segs)-1
		switch s {
		case ".":
		case "..":
			if len(out) == 0 {
				return "", errAboveRoot
			}
			out = out[:len(out)-1]
		default:
			out = append(out, s)
			continue
		}
		if last { // "/a/." and "/a/b/.." end in a slash
			out = append(out, "")
		}
	}
	return "/" + strings.Join(out, "/"), nil
}

// lenientRead refuses p, a normalised path with escapes left in it, when a server more
// lenient than RFC 3986 would read a dot-segment, a control character or invalid UTF-8 in it:
// one that decodes escapes again and again (%252e), takes a decoded %2F or %5C (or a raw
// backslash) for a separator, or drops what follows ';' in a segment.
func lenientRead(p string) error {
	s := p
	for round := 0; ; round++ {
		d, changed := decodeLenient(s)
		if !changed {
			return nil
		}
		if round == maxDecodes {
			return errDeepEscapes // and not one more round: each costs a pass over the path
		}
		s = d
		if !utf8.ValidString(s) {
			return errNotUTF8
		}
		if compatForm(s) {
			return errCompatForm
		}
		for i := 0; i < len(s); i++ {
			if s[i] < 0x20 || s[i] == 0x7f {
				return errControl
			}
		}
		for _, seg := range strings.FieldsFunc(s, func(r rune) bool { return r == '/' || r == '\\' }) {
			if i := strings.IndexByte(seg, ';'); i >= 0 {
				seg = seg[:i]
			}
			if seg == "." || seg == ".." {
				return errHiddenDots
			}
		}
	}
}

// compatForm reports whether s holds a character whose NFKC form holds '.', '/', '\\', ';',
// '%', '?' or '#' (Unicode 14: the full-width and small forms, the dot leaders and ellipses,
// the "digit full stop" and "a/c" symbols, U+037E GREEK QUESTION MARK). A server that
// normalises the path this way after the policy decided could find a dot-segment, a
// separator, an escape or the end of the path the policy never saw.
func compatForm(s string) bool {
	for _, r := range s {
		if r < utf8.RuneSelf {
			continue
		}
		switch {
		case r == 0x037E, // ; GREEK QUESTION MARK
			0x2024 <= r && r <= 0x2026,                         // . .. ... (dot leaders, ellipsis)
			0x2047 <= r && r <= 0x2049,                         // ?? ?! !?
			r == 0x2100, r == 0x2101, r == 0x2105, r == 0x2106, // a/c a/s c/o c/u
			0x2488 <= r && r <= 0x249B,            // 1. to 20.
			r == 0x33C2, r == 0x33C7, r == 0x33D8, // a.m. Co. p.m.
			r == 0xFE14, r == 0xFE16, r == 0xFE19, r == 0xFE30, // vertical ; ? ... ..
			r == 0xFE52, r == 0xFE54, r == 0xFE56, r == 0xFE5F, r == 0xFE68, r == 0xFE6A, // small . ; ? # \ %
			r == 0xFF03, r == 0xFF05, r == 0xFF0E, r == 0xFF0F, r == 0xFF1B, r == 0xFF1F, r == 0xFF3C, // full-width # % . / ; ? \
			r == 0x1F100: // 0.
			return true
		}
	}
	return false
}

// maxDecodes is how many times lenientRead decodes a path's escapes: servers that decode twice
// exist; a path still holding escapes after three decodings (%25252541) is refused.
const maxDecodes = 3

// decodeLenient decodes every well-formed escape in s, leaving any other '%' as it is.
func decodeLenient(s string) (string, bool) {
	if !strings.Contains(s, "%") {
		return s, false
	}
	var b strings.Builder
	b.Grow(len(s))
	changed := false
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			b.WriteByte(unhex(s[i+1])<<4 | unhex(s[i+2]))
			i += 2
			changed = true
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String(), changed
}

// requestQuery parses a request's raw query for the policy, refusing one whose every pair the
// policy would not see (see the top of this file). The query itself goes upstream unchanged.
func requestQuery(raw string) (url.Values, error) {
	if raw == "" {
		return nil, nil
	}
	if strings.IndexByte(raw, ';') >= 0 {
		return nil, errQuerySemi
	}
	q, err := url.ParseQuery(raw)
	if err != nil || strings.IndexByte(raw, '#') >= 0 {
		return nil, errQueryParse
	}
	return q, nil
}

// methodOverrideHeaders name, by canonical name, the headers with which frameworks (Express's
// method-override, Rails, Symfony, Laravel, ASP.NET, Google's APIs) let a request ask for
// another method than its own.
var methodOverrideHeaders = [...]string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// methodOverride refuses a request that asks the upstream to execute another method than the
// one the policy decides on: with a method-override header, a _method query parameter, or a
// _method form field in a POST body (Rails, Symfony and Laravel read it there); and a request
// with X-Original-URL or X-Rewrite-URL, with which some servers serve another path than the
// request's. An override naming the request's own method is harmless and goes through.
// Refusing, rather than showing the override to the policy, keeps every policy right without
// its author having to know about overrides.
//
// A POST form body (URL-encoded or multipart, the types Rack parses) is read, up to 64 KiB with
// a Content-Length, to be checked; a larger one, or one of unknown length, could carry _method
// unseen and is refused. A POST body without a Content-Type, which Rack also reads as a form,
// is labelled application/octet-stream, as RFC 9110 §8.3 lets a recipient assume: the policy
// and the upstream see that label, and no server reads a form in it. small is the body if
// readSmallBody has read it.
func methodOverride(r *http.Request, q url.Values, small []byte) error {
	for _, h := range methodOverrideHeaders {
		if !sameMethod(r.Method, r.Header[h]) {
			return badRequest{h + " asks for another method than the request's " + r.Method + "; send the request with the method you mean"}
		}
	}
	if r.Header["X-Original-Url"] != nil || r.Header["X-Rewrite-Url"] != nil {
		return errPathOverride
	}
	if !sameMethod(r.Method, q["_method"]) {
		return badRequest{"the query parameter _method asks for another method than the request's " + r.Method + "; send the request with the method you mean"}
	}
	if r.Method != http.MethodPost || r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	// The media type as Rack reads it (up to ';' or ','), which accepts more than mime does.
	ct := r.Header.Get("Content-Type")
	mt, _, _ := strings.Cut(ct, ";")
	mt, _, _ = strings.Cut(mt, ",")
	mt = strings.ToLower(strings.TrimSpace(mt))
	if mt == "" {
		r.Header.Set("Content-Type", "application/octet-stream")
		return nil
	}
	if !formTypes[mt] {
		return nil // frameworks read _method only from a form body
	}
	body := small
	if body == nil {
		if r.ContentLength <= 0 || r.ContentLength > maxSmallBody {
			return badRequest{"a POST form body may carry a _method field that some servers obey, and this one cannot be checked (over 64 KiB or no Content-Length); send at most 64 KiB with a Content-Length"}
		}
		body = make([]byte, r.ContentLength)
		if _, err := io.ReadFull(r.Body, body); err != nil {
			return fmt.Errorf("%w: reading the request body: %v", errBadRequest, err)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	fields, err := formMethods(mt, ct, body)
	if err != nil {
		return badRequest{"the POST form body does not parse, so it cannot be checked for a _method field"}
	}
	if !sameMethod(r.Method, fields) {
		return badRequest{"the form field _method asks for another method than the request's " + r.Method + "; send the request with the method you mean"}
	}
	return nil
}

// formTypes are the media types of POST bodies in which Rack, Symfony or Laravel look for
// _method.
var formTypes = map[string]bool{"application/x-www-form-urlencoded": true, "multipart/form-data": true,
	"multipart/mixed": true, "multipart/related": true}

// sameMethod reports whether every override in vs names method (frameworks upper-case them).
func sameMethod(method string, vs []string) bool {
	for _, v := range vs {
		if !strings.EqualFold(strings.TrimSpace(v), method) {
			return false
		}
	}
	return true
}

// formMethods returns the values of the _method fields of a form body of media type mt, one
// of formTypes, and Content-Type ct. A URL-encoded body is split on ';' as well as '&', as
// older servers do, so a pair cannot hide behind one.
func formMethods(mt, ct string, body []byte) ([]string, error) {
	var vs []string
	if !strings.HasPrefix(mt, "multipart/") {
		for _, pair := range strings.FieldsFunc(string(body), func(r rune) bool { return r == '&' || r == ';' }) {
			k, v, _ := strings.Cut(pair, "=")
			if k, err := url.QueryUnescape(k); err != nil || k != "_method" {
				continue
			}
			if dv, err := url.QueryUnescape(v); err == nil {
				v = dv
			}
			vs = append(vs, v)
		}
		return vs, nil
	}
	_, params, err := mime.ParseMediaType(ct)
	if err != nil || params["boundary"] == "" {
		return nil, errBadRequest
	}
	mr := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			return vs, nil
		}
		if err != nil {
			return nil, err
		}
		if partName(p) == "_method" {
			v, err := io.ReadAll(io.LimitReader(p, 64))
			if err != nil {
				return nil, err
			}
			vs = append(vs, string(v))
		}
	}
}

// partName is a form part's field name as a lenient server reads it: from any
// Content-Disposition, not only form-data, and "_method" for one mime cannot parse that
// mentions it.
func partName(p *multipart.Part) string {
	cd := p.Header.Get("Content-Disposition")
	_, params, err := mime.ParseMediaType(cd)
	if err != nil && strings.Contains(cd, "_method") {
		return "_method"
	}
	return params["name"]
}

// sendPath sets u to go upstream with exactly clean as its path. net/url writes RawPath as it
// is when it is a valid encoding of Path; left empty, it would escape Path its own way, which
// differs ("/!" would go as "/%21").
func sendPath(u *url.URL, clean string) {
	u.Path, u.RawPath = clean, clean
	if strings.IndexByte(clean, '%') >= 0 {
		u.Path, _ = url.PathUnescape(clean) // clean's escapes are all well formed
	}
}

// isPathChar reports whether c may stand raw in a path (RFC 3986 pchar or '/'), ';' aside:
// unreserved, the sub-delims other than ';', ':' and '@'.
func isPathChar(c byte) bool { return pathChars[c] }

var pathChars = func() (t [256]bool) {
	for c := range 256 {
		t[c] = isUnreserved(byte(c)) || strings.IndexByte("!$&'()*+,=:@/", byte(c)) >= 0
	}
	return t
}()

func isUnreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	default:
		return c - 'a' + 10
	}
}

func writeEscape(b *strings.Builder, c byte) {
	const hex = "0123456789ABCDEF"
	b.WriteByte('%')
	b.WriteByte(hex[c>>4])
	b.WriteByte(hex[c&15])
}
