package postgres

import (
	"slices"
	"strings"
	"testing"
)

func TestSplitClassifies(t *testing.T) {
	type want struct {
		kind, command     string
		tables, functions []string
	}
	cases := map[string]struct {
		sql  string
		want []want
	}{
		"select":              {"SELECT a FROM items WHERE id = 1", []want{{"read", "SELECT", []string{"items"}, nil}}},
		"qualified and joins": {`select * from public.a x join "B" on x.id = "B".id, c as cc left join d using (id)`, []want{{"read", "SELECT", []string{"B", "c", "d", "public.a"}, nil}}},
		"functions":           {"SELECT count(*), pg_catalog.set_config('role', 'x', false) FROM t", []want{{"read", "SELECT", []string{"t"}, []string{"count", "set_config"}}}},
		"function in from":    {"SELECT * FROM generate_series(1, 3) AS g(i)", []want{{"read", "SELECT", nil, []string{"generate_series"}}}},
		"subquery":            {"SELECT * FROM (SELECT id FROM inner_t) s WHERE id IN (SELECT id FROM other)", []want{{"read", "SELECT", []string{"inner_t", "other"}, nil}}},
		"for update":          {"SELECT * FROM t FOR UPDATE", []want{{"write", "SELECT", []string{"t"}, nil}}},
		"select into":         {"SELECT * INTO newt FROM t", []want{{"ddl", "SELECT INTO", []string{"newt", "t"}, nil}}},
		"insert":              {"INSERT INTO items (id, name) VALUES (1, 'x') ON CONFLICT (id) DO UPDATE SET name = 'y'", []want{{"write", "INSERT", []string{"items"}, nil}}},
		"update":              {"UPDATE only items SET name = lower(name) FROM other WHERE other.id = items.id", []want{{"write", "UPDATE", []string{"items", "other"}, []string{"lower"}}}},
		"delete using":        {"DELETE FROM items USING other WHERE items.id = other.id RETURNING *", []want{{"write", "DELETE", []string{"items", "other"}, nil}}},
		"writing cte":         {"WITH d AS (DELETE FROM items RETURNING *) SELECT * FROM d", []want{{"write", "WITH", []string{"d", "items"}, nil}}},
		"ddl":                 {"CREATE TABLE t2 (a int REFERENCES items (id))", []want{{"ddl", "CREATE TABLE", []string{"items", "t2"}, nil}}},
		"drop":                {"DROP TABLE IF EXISTS a, b", []want{{"ddl", "DROP TABLE", []string{"a", "b"}, nil}}},
		"index":               {"CREATE INDEX i ON items (name)", []want{{"ddl", "CREATE INDEX", []string{"i", "items"}, nil}}},
		"truncate":            {"TRUNCATE items", []want{{"write", "TRUNCATE", []string{"items"}, nil}}},
		"set role":            {"SET ROLE postgres", []want{{"other", "SET ROLE", nil, nil}}},
		"set local role":      {"set local role postgres", []want{{"other", "SET ROLE", nil, nil}}},
		"session auth":        {"SET SESSION AUTHORIZATION postgres", []want{{"other", "SET SESSION AUTHORIZATION", nil, nil}}},
		"reset role":          {"RESET ROLE", []want{{"other", "RESET ROLE", nil, nil}}},
		"set search_path":     {"SET search_path = secret", []want{{"other", "SET", nil, nil}}},
		"do":                  {"DO $$BEGIN PERFORM 1; END$$", []want{{"other", "DO", nil, []string{"do"}}}},
		"copy program":        {"COPY items TO PROGRAM 'curl x'", []want{{"other", "COPY PROGRAM", []string{"items"}, nil}}},
		"copy file":           {"COPY items FROM '/etc/passwd'", []want{{"other", "COPY FILE", []string{"items"}, nil}}},
		"copy stdin":          {"COPY items (id) FROM STDIN", []want{{"write", "COPY", []string{"items"}, nil}}},
		"copy query stdout":   {"COPY (SELECT * FROM items) TO STDOUT", []want{{"read", "COPY", []string{"items"}, nil}}},
		"explain analyze":     {"EXPLAIN ANALYZE DELETE FROM items", []want{{"write", "EXPLAIN ANALYZE", []string{"items"}, nil}}},
		"explain":             {"EXPLAIN SELECT 1", []want{{"read", "EXPLAIN", nil, nil}}},
		"multi": {"BEGIN; INSERT INTO a VALUES (1); COMMIT", []want{{"other", "BEGIN", nil, nil},
			{"write", "INSERT", []string{"a"}, nil}, {"other", "COMMIT", nil, nil}}},
		"semicolons in strings and comments": {"SELECT ';' -- ;\n, $x$ ; $x$ /* ; /* ; */ */ FROM t", []want{{"read", "SELECT", []string{"t"}, nil}}},
		"prepare":                            {"PREPARE p AS DELETE FROM items", []want{{"write", "PREPARE DELETE", []string{"items"}, nil}}},
		"empty":                              {" ; ; ", nil},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := Split(c.sql)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(c.want) {
				t.Fatalf("got %d statements, want %d: %+v", len(got), len(c.want), got)
			}
			for i, w := range c.want {
				g := got[i]
				if g.Kind != w.kind || g.Command != w.command || !slices.Equal(g.Tables, nonNil(w.tables)) || !slices.Equal(g.Functions, nonNil(w.functions)) {
					t.Errorf("statement %d: got %s %q tables %q functions %q, want %s %q %q %q", i, g.Kind, g.Command, g.Tables, g.Functions, w.kind, w.command, w.tables, w.functions)
				}
			}
		})
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// What the classifier cannot read for certain is an error: refused when statement rules apply.
func TestSplitRefusesWhatItCannotRead(t *testing.T) {
	for _, sql := range []string{
		"SELECT 1 /* unterminated",
		"SELECT 'unterminated",
		`SELECT "unterminated`,
		"SELECT $$ unterminated",
		`SELECT * FROM U&"d\0061ta"`,
		"EXECUTE p",
		"FROBNICATE x",
		"SELECT (1",
		"SELECT 1)",
		"CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END",
		"SELECT * FROM a TABLESAMPLE",
		"SELECT * FROM a b c",
		"COPY t FROM somewhere",
		"SELECT a FROM 'x'",
		"SET client_encoding TO 'SJIS'",
		"SET NAMES 'BIG5'",
		"SET standard_conforming_strings = off",
		"SELECT set_config('standard_conforming_strings', 'off', false); SELECT 1",
	} {
		if st, err := Split(sql); err == nil {
			t.Errorf("%q: read as %+v, want an error", sql, st)
		}
	}
}

// With standard_conforming_strings off, a backslash escapes a quote in '...' as the server
// reads it: the broker reads the same statement boundaries.
func TestSplitBackslashStrings(t *testing.T) {
	sql := `SELECT 'a\'; DROP TABLE items; --'`
	on, err := split(sql, false)
	if err != nil || len(on) != 2 || on[1].Command != "DROP TABLE" {
		t.Fatalf("standard strings: %+v %v", on, err)
	}
	off, err := split(sql, true)
	if err != nil || len(off) != 1 || off[0].Command != "SELECT" {
		t.Fatalf("backslash strings: %+v %v", off, err)
	}
}

func TestRedact(t *testing.T) {
	got := Redact("INSERT INTO t VALUES (42, 'secret', E'\\x', $q$dollar$q$) -- 'c'")
	if want := "INSERT INTO t VALUES (?, ?, ?, ?) -- 'c'"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if strings.Contains(Redact("SELECT 'open"), "open") {
		t.Fatal("unreadable text kept")
	}
}

func FuzzSplit(f *testing.F) {
	for _, s := range []string{"SELECT 1", "BEGIN; SET ROLE x; COMMIT", "SELECT $a$;$a$ FROM t", "/* /* */ */ DO $$ $$"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		sts, err := Split(sql)
		if err != nil {
			return
		}
		for _, st := range sts {
			switch st.Kind {
			case "read", "write", "ddl", "other":
			default:
				t.Fatalf("kind %q", st.Kind)
			}
		}
	})
}
