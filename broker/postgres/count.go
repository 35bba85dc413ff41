package postgres

import "bytes"

// Without statement rules the broker only counts statements by kind for the connection's
// audit event, and the full reading (split) cost more CPU than the rest of the relay. A
// message holding one plain statement whose kind its leading keyword settles is counted by
// that keyword, without a parse; anything else (several statements, a leading comment or
// parenthesis, WITH, SELECT … INTO or FOR, SET, COPY, EXPLAIN, PREPARE, BEGIN ATOMIC…) goes
// through split as with statement rules. It is never used for a decision, and it differs
// from split only on a statement split cannot read (counted "other" under statement rules,
// by its leading keyword here), which the server reads or refuses on its own.

// leadingKinds are the keywords that settle a single statement's kind as classify would.
var leadingKinds = map[string]string{
	"select": "read", "values": "read", "table": "read", "fetch": "read", "show": "read",
	"insert": "write", "update": "write", "delete": "write", "merge": "write", "truncate": "write", "lock": "write",
	"create": "ddl", "alter": "ddl", "drop": "ddl", "comment": "ddl", "grant": "ddl", "revoke": "ddl",
	"security": "ddl", "reindex": "ddl", "cluster": "ddl", "refresh": "ddl", "import": "ddl", "reassign": "ddl",
	"begin": "other", "start": "other", "commit": "other", "end": "other", "rollback": "other", "abort": "other",
	"savepoint": "other", "release": "other", "deallocate": "other", "discard": "other", "listen": "other",
	"notify": "other", "unlisten": "other", "vacuum": "other", "analyze": "other", "checkpoint": "other",
	"load": "other", "close": "other", "move": "other", "do": "other", "call": "other",
}

// leadingKind is the kind of the one statement in a Query or Parse message, or "" when only
// split can tell.
func leadingKind(typ byte, body []byte) string {
	var q []byte
	switch typ {
	case 'Q':
		i := bytes.IndexByte(body, 0)
		if i < 0 {
			return ""
		}
		q = body[:i]
	case 'P':
		i := bytes.IndexByte(body, 0)
		if i < 0 {
			return ""
		}
		q = body[i+1:]
		j := bytes.IndexByte(q, 0)
		if j < 0 {
			return ""
		}
		q = q[:j]
	default:
		return ""
	}
	q = bytes.TrimRight(bytes.TrimLeft(q, " \t\r\n\f"), " \t\r\n\f")
	q = bytes.TrimRight(bytes.TrimSuffix(q, []byte{';'}), " \t\r\n\f")
	if bytes.IndexByte(q, ';') >= 0 || containsFold(q, "atomic") {
		return ""
	}
	var w [16]byte
	n := 0
	for ; n < len(q) && isIdentChar(q[n]); n++ {
		if n == len(w) {
			return ""
		}
		c := q[n]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		w[n] = c
	}
	kind := leadingKinds[string(w[:n])]
	if string(w[:n]) == "select" && (containsFold(q[n:], "into") || containsFold(q[n:], "for")) {
		return "" // SELECT … INTO creates a table; SELECT … FOR UPDATE counts as a write
	}
	return kind
}

// containsFold reports whether s holds the lower-case ASCII word w in any case.
func containsFold(s []byte, w string) bool {
	for i := 0; i+len(w) <= len(s); i++ {
		j := 0
		for ; j < len(w); j++ {
			c := s[i+j]
			if c >= 'A' && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != w[j] {
				break
			}
		}
		if j == len(w) {
			return true
		}
	}
	return false
}
