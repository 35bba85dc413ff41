package llm

import "bytes"

// A response body, or one server-sent event, can be any size: an answer with logprobs, a
// batch of embeddings, a Responses stream's response.completed that restates the whole
// output. skeleton finds the usage in it as its bytes pass, in pieces of any size, without
// holding it: it follows the JSON text's structure (strings, nesting) and copies out only the
// members the meter reads, into a small JSON object (the skeleton), which strictjson then
// reads like any event. Memory is bounded (maxSkeleton, maxDepth), whatever the body's size.
//
// The members kept are the root object's usage, model, type, usageMetadata and modelVersion,
// and the usage and model of its response and message objects, wherever they are in the
// object. A root is the top-level object, or each object of a top-level array (Gemini's
// stream without alt=sse). A member whose name could be read as one of those (another letter
// case, '_' or '-', an escape, a non-ASCII name) is kept too, so that strictjson refuses the
// skeleton when an upstream sends a member twice in two spellings. The skeleton's structure is
// not checked here: strictjson checks what is copied out, and a text that does not end where
// it should is no usage.
type skeleton struct {
	root func(skel []byte) // called with each root's skeleton as the root ends

	depth  int
	kinds  []byte // '{' or '[' of each open container, up to maxDepth
	inStr  bool
	esc    bool
	isName bool // the string being read is a member name that is kept or looked into
	expect bool // the next string in the current object is a member name

	name     []byte // the member name just read (quoted, as written), when at a root level
	nameOver bool
	named    bool // name holds a name whose colon is next
	pending  byte // after the name's colon: 'k' keep its value, 'd' look into it, 0 none

	rootDepth int  // the depth of a root object's members: 1, or 2 in a top-level array
	inner     bool // inside a response or message object of a root
	capDepth  int  // the depth of the member whose value is copied out, or 0
	out       []byte
	over      bool // too much to copy, a name too long or too deep: no usage
	started   bool
	bad       bool // not a JSON object or array of objects
}

const (
	maxSkeleton = 64 << 10
	maxName     = 256
	maxDepth    = 1 << 12
)

var (
	keptNames   = []string{"usage", "model", "type", "usagemetadata", "modelversion"}
	innerNames  = []string{"response", "message"}
	innerKept   = []string{"usage", "model"}
	bracket     = [256]bool{'"': true, '{': true, '}': true, '[': true, ']': true}
	scalarBytes = func() (t [256]bool) { // the bytes of numbers, true, false and null
		for _, c := range []byte("0123456789+-.eEtruefalsn") {
			t[c] = true
		}
		return t
	}()
)

// feed reads the next piece of the text.
func (s *skeleton) feed(b []byte) {
	for i := 0; i < len(b); {
		if s.bad || s.over {
			return
		}
		if s.inStr {
			i = s.str(b, i)
			continue
		}
		if s.capDepth == 0 && s.depth > s.rootDepth && !(s.inner && s.depth == s.rootDepth+1) {
			// Deep in a member not kept: only strings and brackets matter until it ends.
			for i < len(b) && !bracket[b[i]] {
				i++
			}
			if i == len(b) {
				return
			}
		}
		c := b[i]
		i++
		switch c {
		case ' ', '\t', '\r', '\n':
		case '"':
			if s.depth == 0 {
				s.bad = true // a text that is no object or array, or a second value
				return
			}
			s.inStr = true
			s.isName = false
			if s.expect {
				s.expect = false
				if s.atRootLevel() {
					s.isName, s.name, s.nameOver = true, append(s.name[:0], '"'), false
				}
			} else {
				s.value()
			}
			s.copy(c)
		case ':':
			if s.named {
				s.named = false
				s.pending = s.choose()
			} else {
				s.copy(c)
			}
		case '{', '[':
			if !s.started {
				s.started = true
				if c == '[' {
					s.rootDepth = 2
				} else {
					s.rootDepth = 1
				}
			} else if s.depth == 0 {
				s.bad = true // a second value
				return
			}
			if s.pending == 'd' && c == '{' {
				s.pending = 0
				s.inner = true
				s.out = append(s.out, '{')
			} else {
				s.value()
				s.copy(c)
			}
			if s.depth == s.rootDepth-1 && c == '{' {
				s.out = append(s.out[:0], '{')
			} else if s.depth == s.rootDepth-1 {
				s.bad = true // an array of something else than objects
				return
			}
			if len(s.kinds) >= maxDepth {
				s.over = true
				return
			}
			s.kinds = append(s.kinds, c)
			s.depth++
			s.expect = c == '{'
		case '}', ']':
			if s.depth == 0 {
				s.bad = true
				return
			}
			s.endScalar()
			s.depth--
			s.kinds = s.kinds[:len(s.kinds)-1]
			switch {
			case s.capDepth != 0:
				s.copy(c)
				if s.depth == s.capDepth {
					s.capDepth = 0
				}
			case s.inner && s.depth == s.rootDepth:
				s.inner = false
				s.out = append(s.out, '}')
			case s.depth == s.rootDepth-1 && c == '}':
				s.out = append(s.out, '}')
				if s.root != nil && !s.over {
					s.root(s.out)
				}
				s.out = s.out[:0]
			}
			s.expect = false
		case ',':
			s.endScalar()
			s.copy(c)
			s.expect = s.depth > 0 && s.kinds[len(s.kinds)-1] == '{'
		default:
			if !scalarBytes[c] || s.depth == 0 {
				s.bad = true
				return
			}
			s.value()
			s.copy(c)
		}
	}
}

// str reads string bytes from b[i:], up to and including its closing quote.
func (s *skeleton) str(b []byte, i int) int {
	if s.esc {
		s.esc = false
		s.strBytes(b[i : i+1])
		return i + 1
	}
	end := len(b)
	q := bytes.IndexByte(b[i:], '"')
	if q >= 0 {
		end = i + q
	}
	if bs := bytes.IndexByte(b[i:end], '\\'); bs >= 0 {
		s.strBytes(b[i : i+bs+1])
		s.esc = true
		return i + bs + 1
	}
	s.strBytes(b[i:end])
	if q < 0 {
		return len(b)
	}
	s.strBytes(b[end : end+1])
	s.inStr = false
	s.named = s.isName
	s.isName = false
	return end + 1
}

func (s *skeleton) strBytes(b []byte) {
	if s.isName {
		if len(s.name)+len(b) > maxName {
			s.nameOver = true
			return
		}
		s.name = append(s.name, b...)
		return
	}
	if s.capDepth != 0 {
		s.add(b)
	}
}

// atRootLevel: a member name read now is one of a root's, or of its response or message.
func (s *skeleton) atRootLevel() bool {
	return s.capDepth == 0 && (s.depth == s.rootDepth || (s.inner && s.depth == s.rootDepth+1))
}

// choose decides, on the member name just read, whether its value is copied out ('k'), looked
// into ('d', a response or message object) or skipped.
func (s *skeleton) choose() byte {
	if s.nameOver {
		s.over = true // a name that long is none an API sends
		return 0
	}
	n := s.name
	switch {
	case s.depth != s.rootDepth:
		if looksLike(n, innerKept) {
			return s.member(n, 'k')
		}
	case looksLike(n, keptNames):
		return s.member(n, 'k')
	case looksLike(n, innerNames):
		return s.member(n, 'd')
	}
	return 0
}

// member writes the name n (quoted) of a member copied out ('k') or looked into ('d').
func (s *skeleton) member(n []byte, how byte) byte {
	s.sep()
	s.add(n)
	s.add([]byte(":"))
	return how
}

func (s *skeleton) sep() {
	if len(s.out) > 0 && s.out[len(s.out)-1] != '{' {
		s.out = append(s.out, ',')
	}
}

// value is called at the first byte of a value: a kept member's value starts being copied.
func (s *skeleton) value() {
	if s.pending != 0 { // a response or message that is not an object is copied as it is
		s.capDepth = s.depth
	}
	s.pending = 0
}

// endScalar ends the copy of a kept scalar value at the ',' or closing bracket after it.
func (s *skeleton) endScalar() {
	if s.capDepth != 0 && s.depth == s.capDepth {
		s.capDepth = 0
	}
}

func (s *skeleton) copy(c byte) {
	if s.capDepth != 0 {
		if len(s.out) >= maxSkeleton {
			s.over = true
			return
		}
		s.out = append(s.out, c)
	}
}

func (s *skeleton) add(b []byte) {
	if len(s.out)+len(b) > maxSkeleton {
		s.over = true
		return
	}
	s.out = append(s.out, b...)
}

// end reports whether the text was whole and could be read for usage: one JSON object or
// array of objects, ended.
func (s *skeleton) end() bool {
	return s.started && !s.bad && !s.over && s.depth == 0 && !s.inStr
}

// looksLike reports whether the quoted name q could be read as one of names (lower case, no
// '_' or '-'): equal once ASCII letters are lowered and '_' and '-' left out, or written with
// an escape or a non-ASCII byte, which strictjson then decides on.
func looksLike(q []byte, names []string) bool {
	if len(q) < 2 {
		return false
	}
	q = q[1 : len(q)-1]
	for _, n := range names {
		j := 0
		match := true
		for _, c := range q {
			switch {
			case c == '\\' || c >= 0x80:
				return true
			case c == '_' || c == '-':
				continue
			case 'A' <= c && c <= 'Z':
				c += 'a' - 'A'
			}
			if j >= len(n) || n[j] != c {
				match = false
				break
			}
			j++
		}
		if match && j == len(n) {
			return true
		}
	}
	return false
}
