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
//     folding (and the simple case mappings, which add "ı" and "İ" to "i") is applied and
//     '_' and '-' are ignored.
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
	"sync"
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
	c := checkers.Get().(*checker)
	defer c.release()
	return c.check(b)
}

// checker is the state of one Check, kept in a pool: its decoder reads the input where it is
// (a bytes.Buffer is not copied), and the fold keys of the members of the objects still open
// are kept back to back in one arena, so that a body's member names cost no allocation.
type checker struct {
	bb      bytes.Buffer
	dec     jsontext.Decoder
	arena   []byte   // fold keys of the members of the open objects, back to back
	members []member // the members of the open objects, in order
	open    []object // the objects not yet closed, innermost last
	scratch []byte   // a name with escapes, unquoted
}

// member is one member name of an open object: its fold key in the arena and its text in the
// input (for the error).
type member struct{ key, raw span }

type span struct{ start, end int }

// object is an open object: where its members begin in checker.members, and, once it has more
// than maxList of them, a set of their fold keys (index in members).
type object struct {
	first int
	set   map[string]int
}

const maxList = 16

var checkers = sync.Pool{New: func() any { return new(checker) }}

// release returns c to the pool, without what a large input made it hold.
func (c *checker) release() {
	c.bb = bytes.Buffer{}
	c.dec.Reset(&c.bb) // drops the input
	if cap(c.arena) > 64<<10 || cap(c.members) > 4096 || cap(c.open) > 1024 {
		return
	}
	c.arena, c.members, c.open, c.scratch = c.arena[:0], c.members[:0], c.open[:0], c.scratch[:0]
	checkers.Put(c)
}

func (c *checker) check(b []byte) error {
	c.bb = *bytes.NewBuffer(b)
	// Duplicate exact names are left to the fold check, which reports them with the name.
	c.dec.Reset(&c.bb, jsontext.AllowDuplicateNames(true))
	for {
		var kind jsontext.Kind
		if k, n := c.dec.StackIndex(c.dec.StackDepth()); k == '{' && n%2 == 0 && c.dec.PeekKind() == '"' {
			// A member's name: read as it is in b, without making a string of it.
			raw, err := c.dec.ReadValue()
			if err != nil {
				return &Error{Offset: c.dec.InputOffset(), kind: ErrInvalid}
			}
			end := int(c.dec.InputOffset())
			if err := c.add(b, span{end - len(raw), end}); err != nil {
				return err
			}
			continue
		}
		tok, err := c.dec.ReadToken()
		if err != nil {
			return &Error{Offset: c.dec.InputOffset(), kind: ErrInvalid}
		}
		switch kind = tok.Kind(); kind {
		case '{':
			c.open = append(c.open, object{first: len(c.members)})
		case '}':
			o := c.open[len(c.open)-1]
			c.open = c.open[:len(c.open)-1]
			if o.first < len(c.members) {
				c.arena = c.arena[:c.members[o.first].key.start]
			}
			c.members = c.members[:o.first]
		}
		if c.dec.StackDepth() == 0 { // the one value has ended: nothing may follow
			if _, err := c.dec.ReadToken(); err != io.EOF {
				return &Error{Offset: c.dec.InputOffset(), kind: ErrInvalid}
			}
			return nil
		}
	}
}

// add records the member name whose text is b[raw] in the innermost open object, or reports
// the earlier one it collides with.
func (c *checker) add(b []byte, raw span) error {
	name := b[raw.start+1 : raw.end-1]
	if bytes.IndexByte(name, '\\') >= 0 {
		var err error
		if c.scratch, err = jsontext.AppendUnquote(c.scratch[:0], b[raw.start:raw.end]); err != nil {
			return &Error{Offset: int64(raw.start), kind: ErrInvalid}
		}
		name = c.scratch
	}
	start := len(c.arena)
	c.arena = appendFold(c.arena, name)
	key := c.arena[start:]
	o := &c.open[len(c.open)-1]
	prev := -1
	if o.set != nil {
		if i, ok := o.set[string(key)]; ok {
			prev = i
		}
	} else {
		for i := o.first; i < len(c.members); i++ {
			if k := c.members[i].key; bytes.Equal(c.arena[k.start:k.end], key) {
				prev = i
				break
			}
		}
	}
	if prev >= 0 {
		return &Error{Offset: int64(raw.end), Names: [2]string{decodeName(b, c.members[prev].raw), decodeName(b, raw)}, kind: ErrAmbiguous}
	}
	c.members = append(c.members, member{span{start, len(c.arena)}, raw})
	switch n := len(c.members) - o.first; {
	case n == maxList+1:
		o.set = make(map[string]int, 2*maxList)
		for i := o.first; i < len(c.members); i++ {
			k := c.members[i].key
			o.set[string(c.arena[k.start:k.end])] = i
		}
	case n > maxList+1:
		o.set[string(key)] = len(c.members) - 1
	}
	return nil
}

// decodeName returns the member name whose text is b[raw].
func decodeName(b []byte, raw span) string {
	s, err := jsontext.AppendUnquote(nil, b[raw.start:raw.end])
	if err != nil {
		return ""
	}
	return string(s)
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
	// Check has refused duplicate names: the decoder need not track them again.
	if err := json.Unmarshal(b, v, jsontext.AllowDuplicateNames(true)); err != nil {
		// A value of another type than v's: Check passed, so the text itself is sound.
		var se *json.SemanticError
		if errors.As(err, &se) {
			return fmt.Errorf("JSON value of an unexpected type at %q", cut(string(se.JSONPointer)))
		}
		return &Error{kind: ErrInvalid}
	}
	return nil
}

// fold returns the key under which two names collide: every rune replaced by the smallest
// rune of its Unicode simple case folding orbit (as encoding/json's foldName does, so "ſ" and
// "s" and "S" are one) after its case mappings (foldRune: "ı" and "İ" are "I" too), '_' and
// '-' left out.
func fold(name string) string { return string(appendFold(nil, []byte(name))) }

// appendFold appends name's fold key (fold) to dst.
func appendFold(dst, name []byte) []byte {
	for i := 0; i < len(name); {
		c := name[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '_' || c == '-':
			case 'a' <= c && c <= 'z':
				dst = append(dst, c-('a'-'A'))
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRune(name[i:])
		dst = utf8.AppendRune(dst, foldRune(r))
		i += n
	}
	return dst
}

// foldRune returns the smallest rune of the simple case folding orbit of r's simple
// upper-case mapping of its lower-case one. Beyond the orbit (what Go's encoding/json and
// strings.EqualFold match), this joins the runes that other servers' case-insensitive names
// take for a letter by mapping case alone: upper-casing rune by rune (.NET's
// OrdinalIgnoreCase, which System.Text.Json uses for case-insensitive names) makes the
// dotless "ı" (U+0131) an "I", and lower-casing in a Turkish locale (Java's toLowerCase,
// Jackson's case-insensitive properties) makes the dotted "İ" (U+0130) an "i"; both are
// folded with "I". Only these two runes fold further than their orbit (a test checks every
// rune).
func foldRune(r rune) rune {
	r = unicode.ToUpper(unicode.ToLower(r))
	smallest := r
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		smallest = min(smallest, f)
	}
	return smallest
}
