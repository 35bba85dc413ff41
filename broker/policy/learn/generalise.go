package learn

import (
	"strings"
)

// Wildcard is the path segment that stands for any one segment in a learned path pattern.
const Wildcard = "*"

// Generalise turns an observed path into a pattern: every segment that looks like an
// identifier (see IsIdentifier) becomes Wildcard, the rest is kept as it is.
// "/repos/o/r/issues/123" is "/repos/o/r/issues/*".
func Generalise(path string) string {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		if IsIdentifier(s) {
			segs[i] = Wildcard
		}
	}
	return strings.Join(segs, "/")
}

// IsIdentifier reports whether a path segment looks like an identifier that changes from one
// request to the next, rather than a name an API fixes:
//   - a number: only digits ("123");
//   - a UUID: 8-4-4-4-12 hexadecimal digits, either case;
//   - a hexadecimal hash: at least 7 hexadecimal digits (a short git commit), with at least
//     one decimal digit among them ("deadbeef" alone stays a word);
//   - a long random token: at least 16 characters of letters, digits, '-' and '_', with at
//     least two digits and one letter, and either both letter cases or digits making up at
//     least a quarter of it ("AbC9xY2_kLmN0pQr", "0a1b2c3d-...").
//
// Anything else, including short mixed names such as "v1", "v1beta1" or "issues", is kept.
func IsIdentifier(s string) bool {
	if s == "" {
		return false
	}
	return isNumber(s) || isUUID(s) || isHexHash(s) || isToken(s)
}

func isNumber(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch i {
		case 8, 13, 18, 23:
			if s[i] != '-' {
				return false
			}
		default:
			if !isHex(s[i]) {
				return false
			}
		}
	}
	return true
}

func isHexHash(s string) bool {
	if len(s) < 7 {
		return false
	}
	digit := false
	for i := 0; i < len(s); i++ {
		if !isHex(s[i]) {
			return false
		}
		digit = digit || s[i] >= '0' && s[i] <= '9'
	}
	return digit
}

func isToken(s string) bool {
	if len(s) < 16 {
		return false
	}
	var digits, lower, upper int
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
			digits++
		case c >= 'a' && c <= 'z':
			lower++
		case c >= 'A' && c <= 'Z':
			upper++
		case c == '-' || c == '_':
		default:
			return false
		}
	}
	if digits < 2 || lower+upper == 0 {
		return false
	}
	return lower > 0 && upper > 0 || digits*4 >= len(s)
}

// Matches reports whether path matches pattern, segment by segment, Wildcard matching any
// one segment; the learned Rego module decides the same way.
func Matches(pattern, path string) bool {
	ps, xs := strings.Split(pattern, "/"), strings.Split(path, "/")
	if len(ps) != len(xs) {
		return false
	}
	for i := range ps {
		if ps[i] != Wildcard && ps[i] != xs[i] {
			return false
		}
	}
	return true
}
