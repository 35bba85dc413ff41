package policy

import "bytes"

// maxNestingDepth is encoding/json's limit on nested arrays and objects: text nested deeper
// is not JSON to it, so it is not to validJSON either.
const maxNestingDepth = 10000

// validJSON is json.Valid, in one pass without a state machine behind function values: it
// reports whether b is one JSON value with optional whitespace around it, and accepts and
// refuses exactly the texts encoding/json does (invalid UTF-8 inside strings included, nesting
// beyond maxNestingDepth refused), which FuzzValidJSON checks. An LLM request's body is
// validated before every cached decision, and a prompt of 100 KB took json.Valid some 600 µs.
func validJSON(b []byte) bool {
	var open []byte // the '{' and '[' not yet closed, innermost last
	i := 0
	for {
		// A value starts at i, after optional whitespace.
		if i = skipSpace(b, i); i == len(b) {
			return false
		}
		ok := true
		switch c := b[i]; c {
		case '{', '[':
			if len(open) == maxNestingDepth {
				return false
			}
			j := skipSpace(b, i+1)
			if j < len(b) && b[j] == closer(c) {
				i = j + 1 // empty: a value that has ended
				break
			}
			open = append(open, c)
			if c == '[' {
				i = j
			} else if i, ok = memberName(b, j); !ok {
				return false
			}
			continue
		case '"':
			i, ok = scanString(b, i)
		case 't':
			i, ok = literal(b, i, "true")
		case 'f':
			i, ok = literal(b, i, "false")
		case 'n':
			i, ok = literal(b, i, "null")
		default:
			i, ok = scanNumber(b, i)
		}
		if !ok {
			return false
		}
		// A value ended at i: close the containers it ends, up to a comma and the next value.
		for {
			i = skipSpace(b, i)
			if len(open) == 0 {
				return i == len(b)
			}
			if i == len(b) {
				return false
			}
			top := open[len(open)-1]
			if b[i] == ',' {
				if top == '[' {
					i++
				} else if i, ok = memberName(b, skipSpace(b, i+1)); !ok {
					return false
				}
				break
			}
			if b[i] != closer(top) {
				return false
			}
			open = open[:len(open)-1]
			i++
		}
	}
}

func closer(open byte) byte {
	if open == '{' {
		return '}'
	}
	return ']'
}

// skipSpace returns the index of the first byte of b at or after i that is not JSON
// whitespace, or len(b).
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// memberName scans an object member's name and its colon at b[i], and returns the index past
// the colon.
func memberName(b []byte, i int) (int, bool) {
	if i == len(b) || b[i] != '"' {
		return i, false
	}
	i, ok := scanString(b, i)
	if i = skipSpace(b, i); !ok || i == len(b) || b[i] != ':' {
		return i, false
	}
	return i + 1, true
}

// plainInString marks the bytes that stand for themselves inside a JSON string: all but the
// quote, the backslash and the control characters. Bytes of invalid UTF-8 are plain too, as
// encoding/json has it.
var plainInString = func() (t [256]bool) {
	for c := range t {
		t[c] = c >= 0x20 && c != '"' && c != '\\'
	}
	return t
}()

// scanString scans the JSON string starting at b[i] (a quote) and returns the index past it.
func scanString(b []byte, i int) (int, bool) {
	for i++; i < len(b); {
		if plainInString[b[i]] {
			i++
			continue
		}
		switch b[i] {
		case '"':
			return i + 1, true
		case '\\':
			if i+1 == len(b) {
				return i, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
					return i, false
				}
				i += 6
			default:
				return i, false
			}
		default: // a control character
			return i, false
		}
	}
	return i, false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// scanNumber scans the JSON number starting at b[i]: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func scanNumber(b []byte, i int) (int, bool) {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = digits(b, i)
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		if j := digits(b, i+1); j > i+1 {
			i = j
		} else {
			return i, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return i, false
		}
		i = j
	}
	return i, true
}

func digits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}

func literal(b []byte, i int, word string) (int, bool) {
	if !bytes.HasPrefix(b[i:], []byte(word)) {
		return i, false
	}
	return i + len(word), true
}
