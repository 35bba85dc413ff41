package postgres

import (
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// TestLeadingKindAgreesWithSplit: where the leading keyword settles a statement's kind, it is
// the kind split gives; everything else is left to split.
func TestLeadingKindAgreesWithSplit(t *testing.T) {
	for _, q := range []string{
		"BEGIN;", "END;", "UPDATE pgbench_accounts SET abalance = abalance + -2873 WHERE aid = 214508;",
		"SELECT abalance FROM pgbench_accounts WHERE aid = 214508;", "  select 1  ", "Select 1 ;  ",
		"INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (31, 4, 214508, -2873, CURRENT_TIMESTAMP);",
		"create table t (a int)", "drop table t",
		"vacuum", "do $$ begin end $$", "call p()", "show search_path", "table t", "values (1)",
		"delete from t where a = 1", "truncate t", "lock table t", "grant select on t to u",
	} {
		sts, err := split(q, false)
		if err != nil || len(sts) != 1 {
			t.Fatalf("%q: split %v %v", q, sts, err)
		}
		b, _ := (&pgproto3.Query{String: q}).Encode(nil)
		if got := leadingKind('Q', b[5:]); got != sts[0].Kind {
			t.Errorf("%q: leadingKind %q, split %q", q, got, sts[0].Kind)
		}
		b, _ = (&pgproto3.Parse{Name: "s1", Query: q}).Encode(nil)
		if got := leadingKind('P', b[5:]); got != sts[0].Kind {
			t.Errorf("Parse %q: leadingKind %q, split %q", q, got, sts[0].Kind)
		}
	}
	for _, q := range []string{
		"select 1; delete from t", "with x as (delete from t returning *) select * from x", "select * from t for update", "select * into t2 from t", "SELECT a INTO t2 FROM t", "/* c */ select 1",
		"-- c\nselect 1", "(select 1)", "set role postgres", "reset role", "copy t to program 'x'",
		"explain analyze delete from t", "prepare p as delete from t", "execute p", "set_config('a','b',false)",
		"create function f() returns int begin atomic select 1; end", "", " ; ", "selectx 1", "éselect 1",
	} {
		b, _ := (&pgproto3.Query{String: q}).Encode(nil)
		if got := leadingKind('Q', b[5:]); got != "" {
			t.Errorf("%q: leadingKind %q, want split to read it", q, got)
		}
	}
	if got := leadingKind('Q', []byte("select 1")); got != "" {
		t.Errorf("unterminated Query: %q", got)
	}
	if got := leadingKind('F', []byte{0, 0, 0, 1}); got != "" {
		t.Errorf("FunctionCall: %q", got)
	}
}

func BenchmarkCountPgbench(b *testing.B) {
	var msgs [][]byte
	for _, q := range []string{"BEGIN;", "UPDATE pgbench_accounts SET abalance = abalance + -2873 WHERE aid = 214508;",
		"SELECT abalance FROM pgbench_accounts WHERE aid = 214508;", "UPDATE pgbench_tellers SET tbalance = tbalance + -2873 WHERE tid = 31;",
		"UPDATE pgbench_branches SET bbalance = bbalance + -2873 WHERE bid = 4;",
		"INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (31, 4, 214508, -2873, CURRENT_TIMESTAMP);", "END;"} {
		m, _ := (&pgproto3.Query{String: q}).Encode(nil)
		msgs = append(msgs, m[5:])
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, m := range msgs {
			if leadingKind('Q', m) == "" {
				b.Fatal("not counted")
			}
		}
	}
}
