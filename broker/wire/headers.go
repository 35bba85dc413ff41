package wire

import (
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"
)

// ErrAmbiguousHeader is wrapped by the error for a request whose decision-relevant headers the
// upstream may read otherwise than the broker (CheckHeaders).
var ErrAmbiguousHeader = errors.New("ambiguous header")

// HeaderError names a decision-relevant header the broker will not decide on. Its text names
// the header, never its value, and may be shown to the agent.
type HeaderError struct {
	Name string // the header's usual (canonical) name
	why  string
}

func (e *HeaderError) Error() string {
	if e.Name == "" {
		return e.why
	}
	return "the header " + e.Name + " " + e.why
}
func (e *HeaderError) Unwrap() error        { return ErrAmbiguousHeader }
func (e *HeaderError) Is(target error) bool { return target == ErrAmbiguousHeader }

// AmbiguousHeader is the error for a request part a server could read otherwise than the
// broker decides on it, found by one of the protocol readers (an x-amz-copy-source that
// decodes to two possible objects, for one): name is the header ("" for what is not one), why
// says what is wrong with it, without its value.
func AmbiguousHeader(name, why string) error { return &HeaderError{Name: name, why: why} }

// DecisionHeaders are the request headers the broker, its policy input or one of its protocol
// readers takes as a single value, by their canonical names: the ones a request may carry at
// most once (CheckHeaders). Keep docs/policy-input.md ("One value per decision-relevant header")
// in step with this list.
//
//   - Content-Type: whether the body is JSON for input.request.body, MCP, JSON-RPC and LLM
//     metering; the GraphQL request form; the AWS query protocol's form body; the form a
//     _method field is looked for in.
//   - Mcp-Session-Id: the MCP session whose owner is checked.
//   - X-Http-Method-Override, X-Http-Method, X-Method-Override: the method some servers run
//     instead of the request's (refused unless they name the request's own method, path.go).
//   - X-Amz-*: everything AWS signs and reads (X-Amz-Copy-Source, X-Amz-Target,
//     X-Amz-Content-Sha256, X-Amz-Date, ...): all of them, wherever sent.
//
// Authorization is not among them: a credential the policy grants replaces every one the agent
// sent (inject), and the AWS signer refuses a request with two (credentials/aws).
var DecisionHeaders = [...]decisionHeader{
	{name: "Content-Type", noList: true},
	{name: "Mcp-Session-Id"},
	{name: "X-Http-Method-Override", noList: true},
	{name: "X-Http-Method", noList: true},
	{name: "X-Method-Override", noList: true},
}

// amzPrefix starts the names of the AWS headers, all of them decision-relevant.
const amzPrefix = "X-Amz-"

type decisionHeader struct {
	name string
	// noList: the header's value is one item, never a comma-separated list (a comma outside a
	// quoted string can only be two values joined, which a server may split).
	noList bool
}

// CheckHeaders refuses a request a server could read otherwise than the broker decides on it:
// a decision-relevant header (DecisionHeaders, or any X-Amz-*) that
//   - appears more than once (several field lines, in HTTP/1.1 or HTTP/2): the broker would
//     decide on one value, and some servers read the first, others the last, others all joined;
//   - is spelled otherwise than its canonical name up to letter case, with '_' for '-' (CGI,
//     WSGI, PHP and some proxies read X_Http_Method_Override as X-HTTP-Method-Override);
//   - is list-less and holds a comma outside a quoted string;
//   - is a Content-Type that lenient servers read as JSON or a form and mime does not
//     (oneMediaType).
//
// h has its names as net/http gives them (canonical, for names that are tokens). Every request
// the broker decides on goes through it before the policy input is built.
func CheckHeaders(h http.Header) error {
	for name, vs := range h {
		if len(name) < 6 || !isDecisionCandidate(name[0]) {
			continue
		}
		d, exact, ok := decisionHeaderFor(name)
		if !ok {
			continue
		}
		if !exact {
			return &HeaderError{Name: d.name, why: fmt.Sprintf("is spelled %q; send it as %s, once", clip(name), d.name)}
		}
		if len(vs) > 1 {
			return &HeaderError{Name: d.name, why: "appears more than once; send it once: servers differ on which of several they read"}
		}
		if d.noList && len(vs) == 1 && hasListComma(vs[0]) {
			return &HeaderError{Name: d.name, why: "holds a comma outside a quoted string: one value is expected, and a server may read two"}
		}
		if d.name == "Content-Type" && len(vs) == 1 && !oneMediaType(vs[0]) {
			return &HeaderError{Name: d.name, why: "names a JSON or form body but does not parse as one media type with parameters: servers read it differently"}
		}
	}
	return nil
}

// CheckRequest refuses a request a server could read otherwise than the broker decides on it:
// its headers (CheckHeaders), and a decision-relevant header declared as a trailer (it would
// come after the decision, and some servers merge trailers into the headers). Every request
// the broker decides on goes through it before the policy input is built.
func CheckRequest(r *http.Request) error {
	if err := CheckHeaders(r.Header); err != nil {
		return err
	}
	for name := range r.Trailer {
		if d, _, ok := decisionHeaderFor(name); ok {
			return &HeaderError{Name: d.name, why: "is declared as a trailer: it would arrive after the decision, and some servers read trailers as headers"}
		}
	}
	return nil
}

// CheckBodyEncoding refuses a body the broker is about to read for a decision (JSON for the
// policy, MCP, JSON-RPC, GraphQL or metering) when h gives it a content coding other than
// identity: the broker would decide on the encoded bytes while a server that decodes request
// bodies (Express's body-parser does, by default) acts on what they decode to.
func CheckBodyEncoding(h http.Header) error {
	for _, v := range h["Content-Encoding"] {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
				return &HeaderError{Name: "Content-Encoding", why: "encodes a body the broker reads to decide on; it does not decode request bodies: send the body unencoded"}
			}
		}
	}
	return nil
}

// IsDecisionHeader reports whether name, in any spelling, stands for a decision-relevant header
// (DecisionHeaders, X-Amz-*). Such a field is never forwarded as a trailer.
func IsDecisionHeader(name string) bool {
	if len(name) < 6 || !isDecisionCandidate(name[0]) {
		return false
	}
	_, _, ok := decisionHeaderFor(name)
	return ok
}

// isDecisionCandidate is a quick test on a name's first letter: the decision-relevant names
// start with C, M or X.
func isDecisionCandidate(c byte) bool {
	switch c | 0x20 {
	case 'c', 'm', 'x':
		return true
	}
	return false
}

// decisionHeaderFor finds the decision-relevant header a name stands for, comparing letters
// case-insensitively and '_' as '-'; exact reports whether the name is that header's
// canonical spelling. An X-Amz- header's canonical spelling is the name's own canonical form;
// '_' is allowed after the prefix of user metadata (X-Amz-Meta-), where it is data.
func decisionHeaderFor(name string) (d decisionHeader, exact, ok bool) {
	if len(name) < len(amzPrefix) {
		return decisionHeader{}, false, false // shorter than any of them
	}
	for _, d := range DecisionHeaders {
		if foldEqual(name, d.name) {
			return d, name == d.name, true
		}
	}
	if !foldEqual(name[:len(amzPrefix)], amzPrefix) {
		return decisionHeader{}, false, false
	}
	d = decisionHeader{name: http.CanonicalHeaderKey(strings.ReplaceAll(name, "_", "-"))}
	exact = name[:len(amzPrefix)] == amzPrefix && http.CanonicalHeaderKey(name) == name
	if exact && strings.IndexByte(name, '_') >= 0 {
		meta := len(name) > len("X-Amz-Meta-") && name[:len("X-Amz-Meta-")] == "X-Amz-Meta-"
		exact = meta
	}
	return d, exact, true
}

// foldEqual reports whether a and b are equal with ASCII letters compared case-insensitively
// and '_' taken as '-'.
func foldEqual(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if x == '_' {
			x = '-'
		}
		if y == '_' {
			y = '-'
		}
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// oneMediaType reports whether a Content-Type that lenient servers read as a type the broker
// decides on (JSON or a form: Flask and Rack take the text before ';', others its first word)
// is that same type to
// a strict parser (mime, which the broker reads it with). "application/json; x" is JSON to the
// first and nothing to the second: the broker would decide on no body, and the server read one.
// Other types are not the broker's concern.
func oneMediaType(ct string) bool {
	lenient, _, _ := strings.Cut(ct, ";")
	lenient = strings.ToLower(strings.TrimSpace(lenient))
	if i := strings.IndexAny(lenient, " \t"); i >= 0 {
		lenient = lenient[:i] // and those that look at the first word
	}
	switch {
	case JSONType(lenient),
		lenient == "application/x-www-form-urlencoded", strings.HasPrefix(lenient, "multipart/"):
	default:
		return true
	}
	if ct == lenient && strings.Count(ct, "/") == 1 {
		return true // no parameters, nothing to tell apart (the usual application/json)
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == lenient
}

// JSONType reports whether mt, a media type without parameters in lower case, is one that
// servers parse as JSON: application/json and every +json type, and the older names
// frameworks still register for it (text/json: ASP.NET's input formatter; text/x-json and
// application/jsonrequest: Rails; application/x-json). A body under any of them is read by the
// broker as JSON wherever it reads JSON bodies (the policy's body, an approval's preview), so
// that no label a server reads as JSON hides a body from the decision.
func JSONType(mt string) bool {
	switch mt {
	case "application/json", "text/json", "text/x-json", "application/x-json", "application/jsonrequest":
		return true
	}
	return strings.HasSuffix(mt, "+json")
}

// hasListComma reports whether v holds a comma outside a quoted string (RFC 9110 §5.6.4).
func hasListComma(v string) bool {
	quoted := false
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == ',':
			return true
		}
	}
	return false
}

// clip bounds a name quoted in an error.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
