package postgres

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Statement is one SQL statement as the policy sees it (input.postgres.statement).
type Statement struct {
	// Kind is "read", "write", "ddl" or "other".
	Kind string
	// Command names the statement: "SELECT", "INSERT", "CREATE TABLE"... and, so that a
	// policy sees them as such, "SET ROLE", "SET SESSION AUTHORIZATION", "DO", "COPY PROGRAM",
	// "COPY FILE".
	Command string
	// Setting is the parameter a SET, RESET or SHOW names ("search_path"), else "".
	Setting string
	// Tables are the relations it names, as written (lower case unless quoted), schema
	// included when written; Functions the functions it calls, without schema.
	Tables, Functions []string
	// Text is the statement's text.
	Text string
}

// The classifier is deliberately conservative: it reads the SQL into tokens as Postgres's own
// scanner does (comments, strings of every form, dollar quotes, quoted identifiers), splits
// statements at top-level semicolons, and classifies each by its leading keywords. Whatever it
// cannot read for certain (an unknown command, a FROM list it cannot follow, a Unicode-escaped
// identifier, an EXECUTE of a statement it did not see prepared, a BEGIN ATOMIC body) is an
// error, and with statement rules on the statement is refused, never guessed.

type tokKind int

const (
	tIdent tokKind = iota // unquoted (lower-cased) or quoted identifier, keyword
	tString
	tNumber
	tParam
	tOp
	tPunct
)

type token struct {
	kind   tokKind
	text   string // identifier (folded), punctuation, operator
	quoted bool
	start  int
	end    int
}

func (t token) is(words ...string) bool {
	return t.kind == tIdent && !t.quoted && slices.Contains(words, t.text)
}

func (t token) punct(p string) bool { return t.kind == tPunct && t.text == p }

var errUnterminated = errors.New("unterminated string, identifier or comment")

func isIdentStart(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

func isIdentChar(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' || c == '$' }

const opChars = "+-*/<>=~!@#%^&|`?"

// lex reads sql into tokens. backslashes makes '...' strings take backslash escapes, as they
// do with standard_conforming_strings off.
func lex(sql string, backslashes bool) ([]token, error) {
	var toks []token
	i, n := 0, len(sql)
	for i < n {
		c := sql[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			i++
		case c == '-' && i+1 < n && sql[i+1] == '-':
			for i < n && sql[i] != '\n' {
				i++
			}
		case c == '/' && i+1 < n && sql[i+1] == '*':
			depth := 0
			for {
				if i+1 >= n {
					return nil, errUnterminated
				}
				if sql[i] == '/' && sql[i+1] == '*' {
					depth++
					i += 2
					continue
				}
				if sql[i] == '*' && sql[i+1] == '/' {
					depth--
					i += 2
					if depth == 0 {
						break
					}
					continue
				}
				i++
			}
		case c == '\'':
			end, err := quoted(sql, i, backslashes)
			if err != nil {
				return nil, err
			}
			toks = append(toks, token{kind: tString, start: i, end: end})
			i = end
		case (c == 'e' || c == 'E') && i+1 < n && sql[i+1] == '\'':
			end, err := quoted(sql, i+1, true)
			if err != nil {
				return nil, err
			}
			toks = append(toks, token{kind: tString, start: i, end: end})
			i = end
		case (c == 'b' || c == 'B' || c == 'x' || c == 'X' || c == 'n' || c == 'N') && i+1 < n && sql[i+1] == '\'':
			end, err := quoted(sql, i+1, false)
			if err != nil {
				return nil, err
			}
			toks = append(toks, token{kind: tString, start: i, end: end})
			i = end
		case (c == 'u' || c == 'U') && i+2 < n && sql[i+1] == '&' && (sql[i+2] == '\'' || sql[i+2] == '"'):
			return nil, errors.New("Unicode-escaped strings and identifiers (U&) are not read")
		case c == '"':
			j := i + 1
			var b strings.Builder
			for {
				if j >= n {
					return nil, errUnterminated
				}
				if sql[j] == '"' {
					if j+1 < n && sql[j+1] == '"' {
						b.WriteByte('"')
						j += 2
						continue
					}
					break
				}
				b.WriteByte(sql[j])
				j++
			}
			if b.Len() == 0 {
				return nil, errors.New("zero-length quoted identifier")
			}
			toks = append(toks, token{kind: tIdent, text: b.String(), quoted: true, start: i, end: j + 1})
			i = j + 1
		case c == '$':
			j := i + 1
			if j < n && sql[j] >= '0' && sql[j] <= '9' {
				for j < n && sql[j] >= '0' && sql[j] <= '9' {
					j++
				}
				toks = append(toks, token{kind: tParam, start: i, end: j})
				i = j
				continue
			}
			for j < n && sql[j] != '$' && isIdentChar(sql[j]) && sql[j] != '$' {
				j++
			}
			if j >= n || sql[j] != '$' || (j > i+1 && !isIdentStart(sql[i+1])) {
				return nil, errors.New("a stray $")
			}
			tag := sql[i : j+1]
			k := strings.Index(sql[j+1:], tag)
			if k < 0 {
				return nil, errUnterminated
			}
			end := j + 1 + k + len(tag)
			toks = append(toks, token{kind: tString, start: i, end: end})
			i = end
		case isIdentStart(c):
			j := i
			for j < n && isIdentChar(sql[j]) {
				j++
			}
			toks = append(toks, token{kind: tIdent, text: strings.ToLower(sql[i:j]), start: i, end: j})
			i = j
		case c >= '0' && c <= '9' || c == '.' && i+1 < n && sql[i+1] >= '0' && sql[i+1] <= '9':
			j := i
			for j < n && (isIdentChar(sql[j]) || sql[j] == '.' ||
				(sql[j] == '+' || sql[j] == '-') && (sql[j-1] == 'e' || sql[j-1] == 'E')) {
				j++
			}
			toks = append(toks, token{kind: tNumber, start: i, end: j})
			i = j
		case strings.IndexByte("(),;[]:.", c) >= 0:
			toks = append(toks, token{kind: tPunct, text: string(c), start: i, end: i + 1})
			i++
		case strings.IndexByte(opChars, c) >= 0:
			j := i
			for j < n && strings.IndexByte(opChars, sql[j]) >= 0 {
				if j+1 < n && (sql[j] == '-' && sql[j+1] == '-' || sql[j] == '/' && sql[j+1] == '*') {
					break
				}
				j++
			}
			if j == i {
				j = i + 1 // a comment start handled on the next round cannot be here
			}
			toks = append(toks, token{kind: tOp, text: sql[i:j], start: i, end: j})
			i = j
		default:
			return nil, fmt.Errorf("unexpected character %q", c)
		}
	}
	return toks, nil
}

// quoted returns the end of the string literal opening at sql[i] ('), with backslash escapes
// when esc (E'...').
func quoted(sql string, i int, esc bool) (int, error) {
	j := i + 1
	for j < len(sql) {
		switch {
		case esc && sql[j] == '\\':
			j += 2
			continue
		case sql[j] == '\'':
			if j+1 < len(sql) && sql[j+1] == '\'' {
				j += 2
				continue
			}
			return j + 1, nil
		}
		j++
	}
	return 0, errUnterminated
}

// Split reads a query string into its statements, classified, as Postgres reads it with
// standard_conforming_strings on. An empty query has none.
func Split(sql string) ([]Statement, error) { return split(sql, false) }

// lexSettings are the settings that change how Postgres reads the text of later statements:
// a statement that sets them is not read (the broker would read what follows otherwise than
// the server).
var lexSettings = []string{"client_encoding", "names", "standard_conforming_strings", "backslash_quote", "escape_string_warning"}

// split is Split; backslashes reads '...' strings with backslash escapes
// (standard_conforming_strings off).
func split(sql string, backslashes bool) ([]Statement, error) {
	toks, err := lex(sql, backslashes)
	if err != nil {
		return nil, err
	}
	var out []Statement
	from, depth := 0, 0
	for i := 0; i <= len(toks); i++ {
		if i < len(toks) {
			switch {
			case toks[i].punct("(") || toks[i].punct("["):
				depth++
				continue
			case toks[i].punct(")") || toks[i].punct("]"):
				if depth--; depth < 0 {
					return nil, errors.New("unbalanced parentheses")
				}
				continue
			case !toks[i].punct(";") || depth > 0:
				continue
			}
		}
		if i == len(toks) && depth != 0 {
			return nil, errors.New("unbalanced parentheses")
		}
		if i > from {
			part := toks[from:i]
			st, err := classify(part)
			if err != nil {
				return nil, err
			}
			st.Text = sql[part[0].start:part[len(part)-1].end]
			if slices.Contains(lexSettings, st.Setting) && st.Command != "SHOW" {
				return nil, fmt.Errorf("%s %s changes how the server reads SQL text", st.Command, st.Setting)
			}
			if len(out) > 0 && slices.Contains(out[len(out)-1].Functions, "set_config") {
				return nil, errors.New("set_config may change how the server reads the statements after it in the same query")
			}
			out = append(out, st)
		}
		from = i + 1
	}
	return out, nil
}

// classify reads one statement's tokens.
func classify(t []token) (Statement, error) {
	for i := 0; i+1 < len(t); i++ {
		if t[i].is("begin") && t[i+1].is("atomic") {
			return Statement{}, errors.New("BEGIN ATOMIC bodies are not read")
		}
	}
	a := &analysis{t: t, tables: map[string]bool{}, funcs: map[string]bool{}, skip: map[int]bool{}}
	st, err := a.command()
	if err != nil {
		return Statement{}, err
	}
	if err := a.scan(); err != nil {
		return Statement{}, err
	}
	st.Tables, st.Functions = sorted(a.tables), sorted(a.funcs)
	if st.Kind == "read" && a.modifies {
		st.Kind = "write" // a data-modifying WITH, or a row lock
	}
	return st, nil
}

func sorted(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

type analysis struct {
	t        []token
	tables   map[string]bool
	funcs    map[string]bool
	skip     map[int]bool // identifier tokens already read as a table or alias
	modifies bool
}

func (a *analysis) word(i int) string {
	if i < len(a.t) && a.t[i].kind == tIdent && !a.t[i].quoted {
		return a.t[i].text
	}
	return ""
}

var ddlCommands = []string{"create", "alter", "drop", "comment", "grant", "revoke", "security", "reindex",
	"cluster", "refresh", "import", "reassign"}

var otherCommands = []string{"begin", "start", "commit", "end", "rollback", "abort", "savepoint", "release",
	"deallocate", "discard", "listen", "notify", "unlisten", "vacuum", "analyze", "checkpoint", "load",
	"close", "move", "prepare_transaction"}

// command classifies by the leading keywords.
func (a *analysis) command() (Statement, error) {
	i := 0
	for i < len(a.t) && a.t[i].punct("(") {
		i++
	}
	w := a.word(i)
	up := strings.ToUpper(w)
	switch {
	case w == "select":
		st := Statement{Kind: "read", Command: "SELECT"}
		for j := i; j < len(a.t); j++ {
			if a.t[j].is("into") && !a.precededBy(j, "insert", "merge") {
				st = Statement{Kind: "ddl", Command: "SELECT INTO"}
			}
			if a.t[j].is("for") && (a.word(j+1) == "update" || a.word(j+1) == "share" || a.word(j+1) == "no" || a.word(j+1) == "key") {
				a.modifies = true
			}
		}
		return st, nil
	case w == "values" || w == "table" || w == "fetch":
		return Statement{Kind: "read", Command: up}, nil
	case w == "show":
		return Statement{Kind: "read", Command: "SHOW", Setting: a.setting(i + 1)}, nil
	case w == "with":
		for j := i; j < len(a.t); j++ {
			if a.t[j].is("insert", "update", "delete", "merge") {
				a.modifies = true
			}
		}
		return Statement{Kind: "read", Command: "WITH"}, nil
	case w == "insert" || w == "update" || w == "delete" || w == "merge" || w == "truncate" || w == "lock":
		return Statement{Kind: "write", Command: up}, nil
	case w == "copy":
		return a.copyCommand(i)
	case w == "explain":
		for j := i + 1; j < len(a.t) && j < i+8; j++ {
			if a.t[j].is("analyze", "analyse") {
				inner, err := (&analysis{t: a.t[a.innerStart(i+1):], tables: a.tables, funcs: a.funcs, skip: map[int]bool{}}).command()
				if err != nil {
					return Statement{}, err
				}
				return Statement{Kind: inner.Kind, Command: "EXPLAIN ANALYZE"}, nil
			}
		}
		return Statement{Kind: "read", Command: "EXPLAIN"}, nil
	case w == "set" || w == "reset":
		return a.setCommand(i, up), nil
	case w == "do":
		return Statement{Kind: "other", Command: "DO"}, nil
	case w == "call":
		return Statement{Kind: "other", Command: "CALL"}, nil
	case w == "prepare":
		if a.word(i+1) == "transaction" {
			return Statement{Kind: "other", Command: "PREPARE TRANSACTION"}, nil
		}
		j := i + 1
		for j < len(a.t) && !a.t[j].is("as") {
			j++
		}
		if j >= len(a.t) {
			return Statement{}, errors.New("PREPARE without AS")
		}
		inner, err := (&analysis{t: a.t[j+1:], tables: a.tables, funcs: a.funcs, skip: map[int]bool{}}).command()
		if err != nil {
			return Statement{}, err
		}
		return Statement{Kind: inner.Kind, Command: "PREPARE " + inner.Command}, nil
	case w == "execute":
		return Statement{}, errors.New("EXECUTE of a prepared statement: what it runs is not in the statement")
	case w == "declare":
		j := i + 1
		for j < len(a.t) && !a.t[j].is("for") {
			j++
		}
		if j >= len(a.t) {
			return Statement{}, errors.New("DECLARE without FOR")
		}
		inner, err := (&analysis{t: a.t[j+1:], tables: a.tables, funcs: a.funcs, skip: map[int]bool{}}).command()
		if err != nil {
			return Statement{}, err
		}
		return Statement{Kind: inner.Kind, Command: "DECLARE CURSOR"}, nil
	case slices.Contains(ddlCommands, w):
		cmd := up
		if x := a.word(i + 1); x != "" {
			cmd += " " + strings.ToUpper(x)
		}
		return Statement{Kind: "ddl", Command: cmd}, nil
	case slices.Contains(otherCommands, w):
		return Statement{Kind: "other", Command: up}, nil
	case w == "":
		return Statement{}, errors.New("a statement that does not start with a command")
	}
	return Statement{}, fmt.Errorf("unknown command %s", up)
}

// innerStart skips EXPLAIN's options to the statement it explains.
func (a *analysis) innerStart(i int) int {
	if i < len(a.t) && a.t[i].punct("(") {
		for i < len(a.t) && !a.t[i].punct(")") {
			i++
		}
		return i + 1
	}
	for i < len(a.t) && a.t[i].is("analyze", "analyse", "verbose") {
		i++
	}
	return i
}

func (a *analysis) precededBy(j int, words ...string) bool {
	for k := j - 1; k >= 0; k-- {
		if a.t[k].is(words...) {
			return true
		}
	}
	return false
}

func (a *analysis) setting(i int) string {
	var parts []string
	for ; i < len(a.t) && a.t[i].kind == tIdent; i++ {
		parts = append(parts, a.t[i].text)
		if i+1 < len(a.t) && a.t[i+1].punct(".") {
			i++
			continue
		}
		break
	}
	return strings.Join(parts, ".")
}

// setCommand names SET and RESET, the role and session authorization forms as such.
func (a *analysis) setCommand(i int, up string) Statement {
	j := i + 1
	if a.word(j) == "session" || a.word(j) == "local" {
		j++
	}
	switch {
	case a.word(j) == "role":
		return Statement{Kind: "other", Command: up + " ROLE", Setting: "role"}
	case a.word(j) == "session" && a.word(j+1) == "authorization", a.word(j) == "authorization":
		return Statement{Kind: "other", Command: up + " SESSION AUTHORIZATION", Setting: "session_authorization"}
	}
	return Statement{Kind: "other", Command: up, Setting: a.setting(j)}
}

// copyCommand: COPY t FROM STDIN is a write, COPY ... TO STDOUT a read; COPY from or to a
// program or a server file is named as such, kind "other".
func (a *analysis) copyCommand(i int) (Statement, error) {
	st := Statement{Kind: "read", Command: "COPY"}
	for j := i + 1; j < len(a.t); j++ {
		if a.t[j].punct("(") { // COPY (query) TO: the query is scanned with the rest
			j = a.matching(j)
			continue
		}
		if a.t[j].is("from", "to") {
			a.skip[j] = true // COPY's own FROM is no FROM list
			if a.t[j].is("from") {
				st.Kind = "write"
			}
			switch {
			case a.word(j+1) == "program":
				return Statement{Kind: "other", Command: "COPY PROGRAM"}, nil
			case j+1 < len(a.t) && a.t[j+1].kind == tString:
				return Statement{Kind: "other", Command: "COPY FILE"}, nil
			case a.word(j+1) == "stdin" || a.word(j+1) == "stdout":
				a.skip[j+1] = true
				return st, nil
			}
			return Statement{}, errors.New("COPY to or from something other than STDIN, STDOUT, a program or a file")
		}
	}
	return Statement{}, errors.New("COPY without FROM or TO")
}

// matching returns the index of the parenthesis closing the one at i.
func (a *analysis) matching(i int) int {
	depth := 0
	for j := i; j < len(a.t); j++ {
		switch {
		case a.t[j].punct("("):
			depth++
		case a.t[j].punct(")"):
			if depth--; depth == 0 {
				return j
			}
		}
	}
	return len(a.t)
}

// name reads a possibly qualified name at i: the name and the index after it.
func (a *analysis) name(i int) (string, int, bool) {
	if i >= len(a.t) || a.t[i].kind != tIdent {
		return "", i, false
	}
	parts := []string{a.t[i].text}
	j := i + 1
	for j+1 < len(a.t) && a.t[j].punct(".") && a.t[j+1].kind == tIdent {
		parts = append(parts, a.t[j+1].text)
		j += 2
	}
	return strings.Join(parts, "."), j, true
}

// followers are the words that may come after a FROM or JOIN item.
var followers = []string{"where", "group", "having", "window", "order", "limit", "offset", "fetch", "for",
	"union", "intersect", "except", "on", "using", "join", "inner", "left", "right", "full", "cross",
	"natural", "returning", "when", "set", "do", "into", "values", "select", "with", "as", "tablesample",
	"then", "else", "end", "and", "or"}

// notFunctions are keywords written before a parenthesis that call nothing.
var notFunctions = []string{"in", "exists", "values", "as", "any", "all", "some", "array", "row", "on", "using",
	"over", "filter", "within", "lateral", "from", "where", "and", "or", "not", "select", "join", "when",
	"then", "else", "case", "is", "between", "like", "ilike", "similar", "by", "set", "into", "table",
	"returning", "with", "window", "partition", "insert", "update", "delete", "default", "key", "unique",
	"check", "references", "constraint", "numeric", "decimal", "varchar", "char", "character", "varying",
	"timestamp", "time", "interval", "bit", "float", "precision", "distinct", "group", "order", "having",
	"limit", "offset", "union", "intersect", "except", "only", "conflict", "do", "to", "for", "of", "if",
	"explain", "analyze", "cast", "include", "tablesample", "repeatable", "ordinality", "primary", "foreign",
	"index", "cube", "rollup", "sets", "grouping", "overlaps", "returns", "language", "view", "cursor",
	"copy", "option", "options", "materialized", "concurrently", "nulls", "first", "last", "asc", "desc",
	"unnest_not", "execute", "procedure", "function", "trigger", "each", "statement", "sequence", "storage",
	"characteristics", "like_not"}

// scan finds the tables and functions the statement names, at every depth.
func (a *analysis) scan() error {
	t := a.t
	for i := 0; i < len(t); i++ {
		switch {
		// Every token is visited: a subquery inside a FROM item has its own FROM.
		case t[i].is("from") && !a.skip[i]:
			if i > 0 && t[i-1].is("distinct") { // IS DISTINCT FROM
				continue
			}
			if err := a.fromList(i + 1); err != nil {
				return err
			}
		case t[i].is("join"):
			if _, err := a.fromItem(i + 1); err != nil {
				return err
			}
		case t[i].is("into") && !(i > 0 && t[i-1].punct(")")):
			if n, j, ok := a.name(i + 1); ok {
				a.table(n, i+1, j)
			}
		case t[i].is("update") && a.statementStart(i):
			j := i + 1
			if a.word(j) == "only" {
				j++
			}
			if n, k, ok := a.name(j); ok {
				a.table(n, j, k)
			}
		case t[i].is("table") && (a.statementStart(i) || i > 0 && t[i-1].is("truncate", "lock", "create", "alter", "drop", "exists", "unlogged", "temporary", "temp", "foreign", "on", "into") || a.afterIfExists(i)):
			j := i + 1
			for a.word(j) == "if" || a.word(j) == "not" || a.word(j) == "exists" || a.word(j) == "only" {
				j++
			}
			for {
				n, k, ok := a.name(j)
				if !ok {
					break
				}
				a.table(n, j, k)
				if k < len(t) && t[k].punct(",") {
					j = k + 1
					continue
				}
				break
			}
		case t[i].is("truncate", "lock") && i == 0 || t[i].is("references") || t[i].is("copy") && i == 0:
			j := i + 1
			if a.word(j) == "only" {
				j++
			}
			if a.word(j) != "table" {
				if n, k, ok := a.name(j); ok {
					a.table(n, j, k)
				}
			}
		case t[i].is("using") && !(i+1 < len(t) && t[i+1].punct("(")):
			if _, err := a.fromItem(i + 1); err != nil {
				return err
			}
		case t[i].is("view", "index", "sequence") && i > 0:
			if n, k, ok := a.name(i + 1); ok && !a.t[i+1].is("if") {
				a.table(n, i+1, k)
			}
		case t[i].is("on") && i > 1 && a.word(0) != "grant" && a.word(0) != "revoke" && a.precededBy(i, "index"):
			j := i + 1
			if a.word(j) == "only" {
				j++
			}
			if n, k, ok := a.name(j); ok {
				a.table(n, j, k)
			}
		}
	}
	// Functions: a name before "(" that is not a keyword, a table or an alias.
	for i := 0; i+1 < len(t); i++ {
		if t[i].kind != tIdent || a.skip[i] || !t[i+1].punct("(") {
			continue
		}
		if !t[i].quoted && slices.Contains(notFunctions, t[i].text) {
			continue
		}
		if i >= 2 && t[i-1].punct(".") && t[i-2].kind == tIdent {
			a.skip[i-2] = true
		}
		a.funcs[t[i].text] = true
	}
	// DO and set_config reach further than their kind: name them as functions too.
	if a.word(0) == "do" {
		a.funcs["do"] = true
	}
	return nil
}

func (a *analysis) afterIfExists(i int) bool {
	return i >= 2 && a.t[i-1].is("exists") && a.t[i-2].is("if")
}

// statementStart reports whether the word at i starts a statement: first, or after "(" (a
// WITH query's body) — not FOR UPDATE, ON UPDATE or DO UPDATE.
func (a *analysis) statementStart(i int) bool {
	if i == 0 {
		return true
	}
	return a.t[i-1].punct("(")
}

func (a *analysis) table(name string, from, to int) {
	a.tables[name] = true
	for k := from; k < to; k++ {
		a.skip[k] = true
	}
}

// listEnd are the words that end a FROM list (at its own depth).
var listEnd = []string{"where", "group", "having", "window", "order", "limit", "offset", "fetch", "for",
	"union", "intersect", "except", "returning", "set", "into", "values", "select", "when", "do"}

// fromList reads a FROM list: items separated by commas, each possibly followed by joins
// (whose items the JOIN case reads) and their conditions: a comma at the list's depth before
// a word that ends the list starts another item.
func (a *analysis) fromList(i int) error {
	t := a.t
	for {
		j, err := a.fromItem(i)
		if err != nil {
			return err
		}
		depth := 0
		for ; j < len(t); j++ {
			switch {
			case t[j].punct("(") || t[j].punct("["):
				depth++
			case t[j].punct(")") || t[j].punct("]"):
				depth--
			}
			if depth < 0 || depth == 0 && (t[j].punct(",") || t[j].punct(";") || t[j].is(listEnd...)) {
				break
			}
		}
		if j < len(t) && depth == 0 && t[j].punct(",") {
			i = j + 1
			continue
		}
		return nil
	}
}

// fromItem reads one FROM or JOIN item (a table, a function call, a subquery) with its
// alias, and checks that what follows may follow it.
func (a *analysis) fromItem(i int) (int, error) {
	t := a.t
	for a.word(i) == "only" || a.word(i) == "lateral" {
		i++
	}
	switch {
	case i < len(t) && t[i].punct("("):
		i = a.matching(i) + 1
	case a.word(i) == "rows" && a.word(i+1) == "from":
		a.skip[i+1] = true
		i = a.matching(i+2) + 1
	default:
		n, j, ok := a.name(i)
		if !ok {
			return 0, errors.New("a FROM item that is not a table, a function or a subquery")
		}
		if j < len(t) && t[j].punct("(") {
			i = a.matching(j) + 1 // a function: the function scan names it
		} else {
			a.table(n, i, j)
			i = j
			if i < len(t) && t[i].op("*") { // FROM t * (inheritance, as ONLY's opposite)
				i++
			}
		}
	}
	if a.word(i) == "with" && a.word(i+1) == "ordinality" {
		i += 2
	}
	if a.word(i) == "as" {
		i++
	}
	if i < len(t) && t[i].kind == tIdent && (t[i].quoted || !slices.Contains(followers, t[i].text)) {
		a.skip[i] = true
		i++
		if i < len(t) && t[i].punct("(") {
			i = a.matching(i) + 1
		}
	}
	if a.word(i) == "tablesample" {
		for i < len(t) && !t[i].punct("(") {
			i++
		}
		if i >= len(t) {
			return 0, errors.New("TABLESAMPLE without its arguments")
		}
		i = a.matching(i) + 1
		if a.word(i) == "repeatable" {
			i = a.matching(i+1) + 1
		}
	}
	if i >= len(t) || t[i].punct(",") || t[i].punct(")") || t[i].punct(";") ||
		t[i].kind == tIdent && !t[i].quoted && slices.Contains(followers, t[i].text) {
		return i, nil
	}
	return 0, errors.New("a FROM list the broker cannot follow")
}

func (t token) op(o string) bool { return t.kind == tOp && t.text == o }

// Redact returns sql with every literal (strings, numbers) replaced by "?", for the audit.
// Text it cannot read is replaced whole.
func Redact(sql string) string {
	toks, err := lex(sql, false)
	if err != nil {
		return "[unreadable statement]"
	}
	var b strings.Builder
	last := 0
	for _, t := range toks {
		if t.kind == tString || t.kind == tNumber {
			b.WriteString(sql[last:t.start])
			b.WriteString("?")
			last = t.end
		}
	}
	b.WriteString(sql[last:])
	return b.String()
}
