package inject

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/capbroker/capbroker/credentials"
)

// The forms of a secret are the strings whose presence in a response shows the agent the
// secret, or most of it: the value itself and what the encoders an upstream commonly uses turn
// it into. An upstream reflects a secret in the framing of whatever it is echoing (a header dump
// in JSON, a URL in an error, a debug page in hex), and each of those encodings, applied to a
// longer text holding the secret, still holds the encoding of the secret itself, so the forms
// are computed from the secret alone (base64, which works on groups of three bytes, is the
// exception: see base64Inner).
//
// What the forms cover, per secret value v, in every injection mode:
//   - v itself;
//   - percent-encoding: each distinct character of v outside RFC 3986's unreserved set left as
//     it is or written %XX, in upper- or lower-case hex; every such choice when v has at most
//     maxEscapeChoices distinct such characters, otherwise the forms of Go's QueryEscape and
//     PathEscape, JavaScript's encodeURIComponent and Python's quote;
//   - JSON string escaping as Go (<, >, & as \u003c...), JavaScript and Python (", \ and
//     control characters only; Python also non-ASCII as \uXXXX), PHP (also / as \/ and
//     non-ASCII) and Gson (also = and ' as \u003d, \u0027) write it;
//   - base64, standard and URL-safe alphabets, padded or not: the part that depends on v alone,
//     for each of the three alignments v can have in the encoded text (base64Inner);
//   - hex, lower and upper case;
//   - when v holds characters outside the unreserved set, each run of at least minRun
//     unreserved characters of v: any escaping of v that leaves those characters alone (HTML
//     entities, backslash escapes, a JSON encoder that \u-escapes an unusual set) still holds
//     them, so its bulk is scrubbed even where the escaping is not one of those above.
//
// And per binding, the value it puts on the wire (the header value, "Bearer v"; "user:v" for
// basic auth; v itself otherwise) in full base64, so that a reflected Authorization header is
// scrubbed whole rather than all but its ragged ends.
//
// What they do not cover, because it cannot be enumerated in bounded patterns: an escaping
// that also escapes unreserved characters (\u0061 for "a" is valid JSON; %61 a valid URL),
// compositions of two encodings (JSON-escaped base64, base64 of a percent-encoded value),
// base64 broken into lines inside the secret, hex with separators, other case changes, and a
// secret an upstream truncates or masks on purpose ("sk-...abcd"). The up to 4 bits of the
// secret's first and last bytes that a base64 reflection of it inside longer text keeps in its
// ragged characters are not scrubbed either; they are not enough to matter.
const (
	// maxEscapeChoices bounds the distinct special characters whose percent-escapings are
	// all enumerated: 2^3 choices in two hex cases are at most 15 forms besides v.
	maxEscapeChoices = 3
	// minRun is the shortest run of unreserved characters scrubbed on its own, as a part of a
	// secret with special characters: 72 bits of a random key, too long to occur by chance.
	minRun = 12
	// minForm is the shortest derived form scrubbed. A shorter one (of a secret of a few bytes,
	// which is no secret) would redact ordinary text.
	minForm = 8
)

// Reveals returns the strings that reveal secret as this binding sends it: its forms (see
// above). A response from a host the binding is bound to is scrubbed of all of them, whether
// or not its request was granted the secret. The result is shared: callers must not modify it.
//
// The forms of a value are computed once: the binding keeps them for the last values it was
// asked about (the current one, and those a rotation replaced).
func (b *Binding) Reveals(secret credentials.Secret) []string {
	v := secret.Reveal()
	cache := b.revealed.Load()
	if cache != nil {
		if f, ok := (*cache)[v]; ok {
			return f
		}
	}
	f := b.forms(v)
	next := make(map[string][]string, 1)
	if cache != nil && len(*cache) < maxRevealed {
		for k, old := range *cache {
			next[k] = old
		}
	}
	next[v] = f
	b.revealed.Store(&next)
	return f
}

// maxRevealed bounds the values a binding keeps the forms of (the registry of known secrets
// keeps its own, computed once per value it records). Past it, the cache starts over.
const maxRevealed = 16

// forms returns the forms of v as this binding reveals it.
func (b *Binding) forms(v string) []string {
	if v == "" {
		return nil
	}
	out := []string{v}
	add := func(forms ...string) {
		for _, f := range forms {
			if len(f) >= minForm && !slices.Contains(out, f) {
				out = append(out, f)
			}
		}
	}
	add(percentForms(v)...)
	add(jsonForms(v)...)
	for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
		add(enc.EncodeToString([]byte(b.wire(v))))
		add(base64Inner(enc, v)...)
	}
	h := hex.EncodeToString([]byte(v))
	add(h, strings.ToUpper(h))
	add(runs(v)...)
	return out
}

// wire is the value the binding puts on the wire for secret value v, where it is a text of its
// own: a header's whole value, or basic auth's "user:password" before it is encoded.
func (b *Binding) wire(v string) string {
	switch r := b.rule; {
	case r.Header != "":
		return strings.ReplaceAll(r.Value, "{{secret}}", v)
	case r.BasicAuth != nil:
		return r.BasicAuth.Username + ":" + v
	default:
		return v
	}
}

// unreserved reports whether c is unreserved in URIs (RFC 3986 §2.3): no encoder escapes it.
func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

// percentForms returns v percent-encoded in the ways encoders do.
func percentForms(v string) []string {
	var special []byte // the distinct bytes of v that some encoder escapes
	for i := 0; i < len(v); i++ {
		if !unreserved(v[i]) && !slices.Contains(special, v[i]) {
			special = append(special, v[i])
		}
	}
	if len(special) == 0 {
		return nil
	}
	var out []string
	if len(special) <= maxEscapeChoices {
		for set := 1; set < 1<<len(special); set++ {
			escaped := func(c byte) bool {
				i := bytes.IndexByte(special, c)
				return i >= 0 && set&(1<<i) != 0
			}
			out = append(out, percentEncode(v, escaped, upperHex), percentEncode(v, escaped, lowerHex))
		}
	} else {
		for _, escaped := range []func(byte) bool{
			func(c byte) bool { return !unreserved(c) },                                             // QueryEscape, encodeURIComponent, quote(safe="")
			func(c byte) bool { return !unreserved(c) && !strings.ContainsRune("!'()*", rune(c)) },  // encodeURIComponent exactly
			func(c byte) bool { return !unreserved(c) && c != '/' },                                 // Python's quote
			func(c byte) bool { return !unreserved(c) && !strings.ContainsRune("$&+:=@", rune(c)) }, // PathEscape
		} {
			out = append(out, percentEncode(v, escaped, upperHex), percentEncode(v, escaped, lowerHex))
		}
	}
	if strings.Contains(v, " ") {
		out = append(out, url.QueryEscape(v)) // a space as "+"
	}
	return out
}

const upperHex, lowerHex = "0123456789ABCDEF", "0123456789abcdef"

// percentEncode writes each byte of v for which escaped is true as %XX, in the hex digits given.
func percentEncode(v string, escaped func(byte) bool, digits string) string {
	var b strings.Builder
	b.Grow(3 * len(v))
	for i := 0; i < len(v); i++ {
		if c := v[i]; escaped(c) {
			b.WriteByte('%')
			b.WriteByte(digits[c>>4])
			b.WriteByte(digits[c&15])
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// jsonForms returns v escaped inside a JSON string, without the quotes, as common encoders
// write it.
func jsonForms(v string) []string {
	goHTML, _ := json.Marshal(v) // <, > and & as \u003c, \u003e, \u0026
	var plain bytes.Buffer
	enc := json.NewEncoder(&plain)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // only ", \ and control characters, as JavaScript and Python
	minimal := strings.TrimSuffix(plain.String(), "\n")
	minimal = minimal[1 : len(minimal)-1]
	ascii := asciiJSON(minimal)
	gson := strings.NewReplacer("<", `\u003c`, ">", `\u003e`, "&", `\u0026`, "=", `\u003d`, "'", `\u0027`).Replace(minimal)
	return []string{
		string(goHTML[1 : len(goHTML)-1]),
		minimal,
		ascii,                                // Python's ensure_ascii
		strings.ReplaceAll(ascii, "/", `\/`), // PHP's json_encode
		gson,
	}
}

// asciiJSON writes the non-ASCII characters of a JSON string's text as \uXXXX escapes
// (UTF-16 surrogate pairs above the BMP), as Python and PHP do.
func asciiJSON(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r < utf8.RuneSelf:
			b.WriteRune(r)
		case r > 0xffff:
			r -= 0x10000
			writeU(&b, 0xd800+(r>>10))
			writeU(&b, 0xdc00+(r&0x3ff))
		default:
			writeU(&b, r)
		}
	}
	return b.String()
}

func writeU(b *strings.Builder, r rune) {
	b.WriteString(`\u`)
	for shift := 12; shift >= 0; shift -= 4 {
		b.WriteByte(lowerHex[(r>>shift)&15])
	}
}

// base64Inner returns, for each of the three offsets modulo 3 at which v can start in a longer
// text, the characters of that text's base64 encoding that depend on v alone. Any base64
// encoding of a text holding v holds one of them. The characters at either end that also
// depend on the neighbouring bytes (ragged: at most 4 bits of v each) are left out.
func base64Inner(enc *base64.Encoding, v string) []string {
	out := make([]string, 0, 3)
	buf := make([]byte, 2+len(v)+2)
	for a := range 3 {
		// Text before v is a zero bytes here and text after it two: the characters kept do not
		// depend on them. Character i holds bits [6i, 6i+6); v holds [8a, 8a+8n).
		clear(buf)
		copy(buf[a:], v)
		s := enc.EncodeToString(buf[:a+len(v)+2])
		from, to := (8*a+5)/6, (8*a+8*len(v))/6
		out = append(out, s[from:to])
	}
	return out
}

// runs returns the runs of at least minRun unreserved characters of v, when v has others.
func runs(v string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(v); i++ {
		if i < len(v) && unreserved(v[i]) {
			continue
		}
		if i-start >= minRun && i-start < len(v) {
			out = append(out, v[start:i])
		}
		start = i + 1
	}
	return out
}
