package postgres

import (
	"bytes"
	"context"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// pipeConn is a net.Conn that reads from r and discards what is written.
type pipeConn struct {
	net.Conn
	r io.Reader
}

func (c pipeConn) Read(b []byte) (int, error)  { return c.r.Read(b) }
func (c pipeConn) Write(b []byte) (int, error) { return len(b), nil }

func encodeAll(b *testing.B, msgs ...pgproto3.Message) []byte {
	var out []byte
	var err error
	for _, m := range msgs {
		if out, err = m.Encode(out); err != nil {
			b.Fatal(err)
		}
	}
	return out
}

// BenchmarkRelayFromUpstream relays a 100-row result: allocations per batch, not per row.
func BenchmarkRelayFromUpstream(b *testing.B) {
	var msgs []pgproto3.Message
	for range 100 {
		msgs = append(msgs, &pgproto3.DataRow{Values: [][]byte{[]byte("12345"), []byte("some text in a row")}})
	}
	msgs = append(msgs, &pgproto3.CommandComplete{CommandTag: []byte("SELECT 100")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	wire := encodeAll(b, msgs...)
	b.ReportAllocs()
	b.SetBytes(int64(len(wire)))
	for b.Loop() {
		ss := &session{conn: pipeConn{}}
		if err := ss.fromUpstream(bytes.NewReader(wire)); err != io.EOF {
			b.Fatal(err)
		}
	}
}

// BenchmarkRelayFromAgent relays pgbench's transaction, connection-level.
func BenchmarkRelayFromAgent(b *testing.B) {
	var msgs []pgproto3.Message
	for _, q := range []string{"BEGIN;", "UPDATE pgbench_accounts SET abalance = abalance + -2873 WHERE aid = 214508;",
		"SELECT abalance FROM pgbench_accounts WHERE aid = 214508;", "UPDATE pgbench_tellers SET tbalance = tbalance + -2873 WHERE tid = 31;",
		"UPDATE pgbench_branches SET bbalance = bbalance + -2873 WHERE bid = 4;",
		"INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (31, 4, 214508, -2873, CURRENT_TIMESTAMP);", "END;"} {
		msgs = append(msgs, &pgproto3.Query{String: q})
	}
	wire := encodeAll(b, msgs...)
	b.ReportAllocs()
	for b.Loop() {
		ss := &session{s: &Server{}, counts: map[string]int64{}}
		ss.conn = pipeConn{r: bytes.NewReader(wire)}
		if err := ss.fromAgent(context.Background(), io.Discard); err != io.EOF {
			b.Fatal(err)
		}
		if ss.counts["write"] != 4 {
			b.Fatal(ss.counts)
		}
	}
}
