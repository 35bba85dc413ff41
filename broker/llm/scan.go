package llm

import "bytes"

// topMembers finds the values of the named members of a JSON object's top level in one pass
// without allocating, the rest skipped unread: a request body can be megabytes of prompt, of
// which metering needs the model and two flags. A name given twice keeps its last value, as
// encoding/json and the providers' parsers do. ok is false when the text is not an object the
// scan can follow; the caller then parses it with encoding/json.
func topMembers(b []byte, names []string, vals [][]byte) (ok bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return skipSpace(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return false
		}
		end, escaped := stringEnd(b, i)
		if end < 0 {
			return false
		}
		key := b[i+1 : end-1]
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i = skipSpace(b, i+1)
		vEnd := valueEnd(b, i)
		if vEnd < 0 {
			return false
		}
		if escaped {
			// A name written with escapes could be one of names: not worth decoding here.
			for _, n := range names {
				if len(key) >= len(n) {
					return false
				}
			}
		}
		for k, n := range names {
			if string(key) == n {
				vals[k] = b[i:vEnd]
			}
		}
		i = skipSpace(b, vEnd)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return skipSpace(b, i+1) == len(b)
		default:
			return false
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd: b[i] is a quote; the index just past the closing one, or -1; and whether the
// string has escapes. Strings are skipped with vectorised searches (prompts are long strings).
func stringEnd(b []byte, i int) (int, bool) {
	escaped := false
	j := i + 1
	for {
		q := bytes.IndexByte(b[j:], '"')
		if q < 0 {
			return -1, false
		}
		q += j
		if bytes.IndexByte(b[j:q], '\\') >= 0 {
			escaped = true
		}
		n := 0 // backslashes right before the quote: an odd number escapes it
		for k := q - 1; k > i && b[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return q + 1, escaped
		}
		j = q + 1
	}
}

// valueEnd: the index just past the value starting at b[i], or -1. Nested values are
// followed by their brackets and strings, not checked member by member.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		end, _ := stringEnd(b, i)
		return end
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end, _ := stringEnd(b, j)
				if end < 0 {
					return -1
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	default: // a number, true, false, null
		j := i
		for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
			j++
		}
		if j == i {
			return -1
		}
		return j
	}
}
