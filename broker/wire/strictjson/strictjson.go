// Package strictjson reads the JSON the broker decides on or meters: MCP and JSON-RPC calls,
// GraphQL's JSON envelope, LLM requests and their usage, the body a policy reads, an approval's
// preview, what learn records. Every such surface reads JSON through this package and no other,
// so that what the broker decides on is what the upstream will act on.
//
// Servers disagree on a JSON object whose members collide: JavaScript's JSON.parse keeps the
// last of two equal names, other parsers the first; Go's encoding/json (v1) matches struct
// fields case-insensitively with Unicode folding ("Name", "NAME" and "name"; "ſ", U+017F, as
// "s"), and the last match wins; other decoders ignore '_' and '-' when matching
// (pydantic's aliases, json v2's nocase). A body the broker read one way and a server reads
// another is a policy bypass, so Check refuses every such body outright:
//
//   - a value that is not one well-formed JSON text (RFC 8259), invalid UTF-8 included;
//   - an object with two members whose names are equal, or equal once Unicode simple case
//     folding is applied and '_' and '-' are ignored.
//
// Unmarshal decodes what Check accepts with case-sensitive names (JSON v2 semantics, through
// github.com/go-json-experiment/json): a struct field tagged "name" is filled from "name" only,
// and a member that a case-insensitive decoder would take for a field ("Name", "NAME",
// "nam\u0065", "ſ" for "s", "include-usage" for "include_usage") is refused as ambiguous even
// alone: the broker would read the field as absent, a Go server (encoding/json) as given.
// Use jsontext.Value, not encoding/json's RawMessage, for members kept raw.
package strictjson

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"unicode"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

var (
	// ErrInvalid is wrapped by the error for a text that is not one well-formed JSON value.
	ErrInvalid = errors.New("not valid JSON")
	// ErrAmbiguous is wrapped by the error for an object whose members a server may read as one.
	ErrAmbiguous = errors.New("ambiguous JSON")
)

// maxNameInError bounds how much of a member name an error quotes.
const maxNameInError = 64

// Error is what Check returns. Its text never quotes the input beyond the two member names
// that collide (cut at 64 bytes): a parser's own error, which may quote the bytes it choked on,
// is replaced by the byte offset.
type Error struct {
	// Offset is where in the input the problem was found.
	Offset int64
	// Names are the two colliding member names (ErrAmbiguous), as they appear decoded.
	Names [2]string
	kind  error
	// field: Names are a field's exact name and a member that is it only under folding.
	field bool
}

func (e *Error) Error() string {
	if e.kind == ErrAmbiguous {
		if e.field {
			return fmt.Sprintf("ambiguous JSON: member %q differs from %q only in case, folding or '_'/'-', and a server may read it as that member",
				cut(e.Names[1]), cut(e.Names[0]))
		}
		if e.Names[0] == e.Names[1] {
			return fmt.Sprintf("ambiguous JSON: member %q appears twice in one object", cut(e.Names[0]))
		}
		return fmt.Sprintf("ambiguous JSON: members %q and %q in one object differ only in case, folding or '_'/'-', and a server may read them as one",
			cut(e.Names[0]), cut(e.Names[1]))
	}
	return fmt.Sprintf("not valid JSON (at byte %d)", e.Offset)
}

func (e *Error) Unwrap() error { return e.kind }

func cut(s string) string {
	if len(s) <= maxNameInError {
		return s
	}
	i := maxNameInError
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

// Check reports whether b is one JSON value that every server reads the same way (see the
// package documentation); the error wraps ErrInvalid or ErrAmbiguous.
func Check(b []byte) error {
	// Duplicate exact names are left to the fold check below, which reports them with the name.
	dec := jsontext.NewDecoder(bytes.NewReader(b), jsontext.AllowDuplicateNames(true))
	var open []members // one per object not yet closed, innermost last
	for {
		tok, err := dec.ReadToken()
		if err != nil {
			return &Error{Offset: dec.InputOffset(), kind: ErrInvalid}
		}
		switch tok.Kind() {
		case '{':
			open = append(open, members{})
		case '}':
			open = open[:len(open)-1]
		case '"':
			if kind, n := dec.StackIndex(dec.StackDepth()); kind == '{' && n%2 == 1 {
				name := tok.String()
				if prev, dup := open[len(open)-1].add(name); dup {
					return &Error{Offset: dec.InputOffset(), Names: [2]string{prev, name}, kind: ErrAmbiguous}
				}
			}
		}
		if dec.StackDepth() == 0 { // the one value has ended: nothing may follow
			if _, err := dec.ReadToken(); err != io.EOF {
				return &Error{Offset: dec.InputOffset(), kind: ErrInvalid}
			}
			return nil
		}
	}
}

// Unmarshal checks b (Check) and decodes it into v with case-sensitive member names. A member
// that names one of v's struct fields only under case folding (or with '_' and '-' left out)
// is an ErrAmbiguous.
func Unmarshal(b []byte, v any) error {
	if err := Check(b); err != nil {
		return err
	}
	if err := decode(b, v); err != nil {
		return err
	}
	return folded(b, reflect.TypeOf(v))
}

func decode(b []byte, v any) error {
	if err := json.Unmarshal(b, v); err != nil {
		// A value of another type than v's: Check passed, so the text itself is sound.
		var se *json.SemanticError
		if errors.As(err, &se) {
			return fmt.Errorf("JSON value of an unexpected type at %q", cut(string(se.JSONPointer)))
		}
		return &Error{kind: ErrInvalid}
	}
	return nil
}

// members holds the folded names of one object's members so far: a short list looked through
// in order (most objects have a few members), a map once it grows.
type members struct {
	names  []string          // original names, in order, while short
	folded []string          // their fold keys
	set    map[string]string // fold key -> original name, once over maxList
}

const maxList = 16

// add records name and reports the earlier name it collides with, if any.
func (m *members) add(name string) (string, bool) {
	key := fold(name)
	if m.set != nil {
		if prev, ok := m.set[key]; ok {
			return prev, true
		}
		m.set[key] = name
		return "", false
	}
	for i, k := range m.folded {
		if k == key {
			return m.names[i], true
		}
	}
	if len(m.folded) < maxList {
		m.names, m.folded = append(m.names, name), append(m.folded, key)
		return "", false
	}
	m.set = make(map[string]string, 2*maxList)
	for i, k := range m.folded {
		m.set[k] = m.names[i]
	}
	m.set[key] = name
	m.names, m.folded = nil, nil
	return "", false
}

// fold returns the key under which two names collide: every rune replaced by the smallest
// rune of its Unicode simple case folding orbit (as encoding/json's foldName does, so "ſ" and
// "s" and "S" are one), '_' and '-' left out.
func fold(name string) string {
	plain := true
	for i := 0; i < len(name); i++ {
		if c := name[i]; c >= utf8.RuneSelf || c == '_' || c == '-' || ('a' <= c && c <= 'z') {
			plain = false
			break
		}
	}
	if plain {
		return name
	}
	out := make([]byte, 0, len(name))
	for _, r := range name {
		switch {
		case r == '_' || r == '-':
			continue
		case r < utf8.RuneSelf:
			if 'a' <= r && r <= 'z' {
				r -= 'a' - 'A'
			}
		default:
			r = foldRune(r)
		}
		out = utf8.AppendRune(out, r)
	}
	return string(out)
}

// foldRune returns the smallest rune of r's simple case folding orbit.
func foldRune(r rune) rune {
	smallest := r
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		smallest = min(smallest, f)
	}
	return smallest
}
