package postgres

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/capbroker/capbroker/broker/approvals"
	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/policy"
)

// A refused statement is not dropped: it is replaced, in place, by a statement that fails to
// parse upstream ("capbroker_refused_<nonce>"), so the agent's error arrives in the order
// Postgres would send it and an open transaction is aborted as a real error aborts it. The
// upstream's syntax error naming the nonce is then replaced by the refusal.
const refusedPrefix = "capbroker_refused_"

// refusal is why a statement was replaced.
type refusal struct {
	code, message, hint string
}

const bufSize = 32 << 10

// relay carries messages both ways until either side ends, the broker stops, the
// connection is idle for postgres.idle_timeout, or its database user's lease ends (expires,
// zero when the user has no lease: renewed leases move it on).
func (ss *session) relay(ctx context.Context, hc *pgconn.HijackedConn, expires func() time.Time) {
	ss.last.Store(time.Now().UnixNano())
	errc := make(chan error, 2)
	go func() { errc <- ss.fromUpstream(hc.Conn) }()
	go func() { errc <- ss.fromAgent(ctx, hc.Conn) }()
	idle := ss.s.cfg.IdleTimeout
	tick := time.NewTicker(min(idle/4+time.Millisecond, time.Second))
	defer tick.Stop()
	for {
		select {
		case <-errc:
			ss.close()
			<-errc
			return
		case <-ss.done:
			<-errc
			<-errc
			return
		case <-tick.C:
			switch end := expires(); {
			case time.Since(time.Unix(0, ss.last.Load())) >= idle:
				ss.end(codeIdle, "capbroker: connection closed after postgres.idle_timeout without a message")
			case !end.IsZero() && time.Now().After(end):
				// Vault would revoke the user now: the connection ends with it, rather than
				// go on under a user that no longer exists.
				ss.end(codeAdminEnd, "capbroker: connection closed: its database user's lease ended (the Vault role's max_ttl)")
			}
		}
	}
}

// end tells the agent why the connection closes, and closes it.
func (ss *session) end(code, msg string) {
	b, _ := (&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: code, Message: msg}).Encode(nil)
	_ = ss.conn.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = ss.conn.Write(b)
	ss.close()
}

// readHeader reads a message's type and body length.
func readHeader(r *bufio.Reader, hdr []byte) (byte, int, error) {
	if _, err := io.ReadFull(r, hdr[:5]); err != nil {
		return 0, 0, err
	}
	n := int(int32(binary.BigEndian.Uint32(hdr[1:5]))) - 4
	if n < 0 {
		return 0, 0, errors.New("invalid message length")
	}
	return hdr[0], n, nil
}

// fromUpstream copies the upstream's messages to the agent. Errors and notices are decoded:
// the upstream password and every known secret are scrubbed from them, and a refusal's
// placeholder error is replaced by the refusal. Everything else passes as it is, streamed.
func (ss *session) fromUpstream(upc io.Reader) error {
	ur := bufio.NewReaderSize(upc, bufSize)
	aw := bufio.NewWriterSize(ss.conn, bufSize)
	var hdr [5]byte
	var body []byte
	for {
		typ, n, err := readHeader(ur, hdr[:])
		if err != nil {
			return err
		}
		ss.last.Store(time.Now().UnixNano())
		switch typ {
		case 'S':
			// ParameterStatus: standard_conforming_strings decides how the broker reads the
			// strings of the next statements.
			body = grow(body, n)
			if _, err := io.ReadFull(ur, body); err != nil {
				return err
			}
			var ps pgproto3.ParameterStatus
			if err := ps.Decode(body); err != nil {
				return err
			}
			if ps.Name == "standard_conforming_strings" {
				ss.backslashes.Store(ps.Value != "on")
			}
			if _, err := aw.Write(hdr[:]); err != nil {
				return err
			}
			if _, err := aw.Write(body); err != nil {
				return err
			}
			ss.bytesOut.Add(int64(n + 5))
		case 'E', 'N':
			if n > maxMessageLength {
				return errors.New("upstream message too long")
			}
			body = grow(body, n)
			if _, err := io.ReadFull(ur, body); err != nil {
				return err
			}
			out, err := ss.rewriteNotice(typ, body)
			if err != nil {
				return err
			}
			if _, err := aw.Write(out); err != nil {
				return err
			}
			ss.bytesOut.Add(int64(len(out)))
		default:
			if _, err := aw.Write(hdr[:]); err != nil {
				return err
			}
			if err := copyN(aw, ur, n); err != nil {
				return err
			}
			ss.bytesOut.Add(int64(n + 5))
		}
		if ur.Buffered() == 0 {
			if err := aw.Flush(); err != nil {
				return err
			}
		}
	}
}

// copyN copies n bytes from r's buffer to w's, refilling r as needed: io.CopyN's allocation
// per message, without it.
func copyN(w *bufio.Writer, r *bufio.Reader, n int) error {
	for n > 0 {
		if r.Buffered() == 0 {
			if _, err := r.Peek(1); err != nil {
				return err
			}
		}
		b, _ := r.Peek(min(n, r.Buffered()))
		if _, err := w.Write(b); err != nil {
			return err
		}
		_, _ = r.Discard(len(b))
		n -= len(b)
	}
	return nil
}

func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// rewriteNotice scrubs an ErrorResponse or NoticeResponse and swaps a refusal's placeholder.
func (ss *session) rewriteNotice(typ byte, body []byte) ([]byte, error) {
	var e pgproto3.ErrorResponse
	if err := e.Decode(body); err != nil {
		return nil, err
	}
	if typ == 'E' {
		if i := strings.Index(e.Message, refusedPrefix); i >= 0 {
			nonce := e.Message[i:]
			if j := strings.IndexAny(nonce, `"' `); j >= 0 {
				nonce = nonce[:j]
			}
			ss.refMu.Lock()
			r, ok := ss.refusals[nonce]
			delete(ss.refusals, nonce)
			ss.refMu.Unlock()
			if ok {
				e = pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: r.code, Message: r.message, Hint: r.hint}
			}
		}
	}
	for _, f := range []*string{&e.Message, &e.Detail, &e.Hint, &e.Where, &e.InternalQuery, &e.ConstraintName,
		&e.SchemaName, &e.TableName, &e.ColumnName, &e.DataTypeName, &e.File, &e.Routine} {
		*f = ss.scrubText(*f)
	}
	for k, v := range e.UnknownFields {
		e.UnknownFields[k] = ss.scrubText(v)
	}
	if typ == 'N' {
		return (*pgproto3.NoticeResponse)(&e).Encode(nil)
	}
	return e.Encode(nil)
}

// fromAgent copies the agent's messages upstream, reading the SQL of each Query, Parse and
// FunctionCall: counted by kind and, with statement rules, decided.
func (ss *session) fromAgent(ctx context.Context, upc io.Writer) error {
	ar := bufio.NewReaderSize(ss.conn, bufSize)
	ss.agentReader = ar
	uw := bufio.NewWriterSize(upc, bufSize)
	var hdr [5]byte
	var body []byte
	for {
		typ, n, err := readHeader(ar, hdr[:])
		if err != nil {
			return err
		}
		ss.last.Store(time.Now().UnixNano())
		ss.bytesIn.Add(int64(n + 5))
		switch typ {
		case 'Q', 'P', 'F':
			if n > maxMessageLength {
				return errors.New("message too long")
			}
			body = grow(body, n)
			if _, err := io.ReadFull(ar, body); err != nil {
				return err
			}
			var out []byte // nil: the message as it came
			if ss.s.cfg.Statements {
				out, err = ss.statement(ctx, typ, body)
			} else {
				err = ss.count(typ, body) // connection-level: only counted
			}
			if err != nil {
				return err
			}
			if out == nil {
				if _, err := uw.Write(hdr[:]); err != nil {
					return err
				}
				out = body
			}
			if _, err := uw.Write(out); err != nil {
				return err
			}
		case 'X':
			_, _ = uw.Write(hdr[:])
			_ = uw.Flush()
			return io.EOF
		default:
			if _, err := uw.Write(hdr[:]); err != nil {
				return err
			}
			if err := copyN(uw, ar, n); err != nil {
				return err
			}
		}
		if ar.Buffered() == 0 {
			if err := uw.Flush(); err != nil {
				return err
			}
		}
	}
}

// statement reads one Query, Parse or FunctionCall and decides it: nil to send the message
// on as it came, or its refusal placeholder.
func (ss *session) statement(ctx context.Context, typ byte, body []byte) ([]byte, error) {
	sql, parse, sts, perr, err := ss.read(typ, body)
	if err != nil {
		return nil, err
	}
	if perr != nil {
		st := Statement{Kind: "other", Command: "UNREADABLE", Text: sql}
		return ss.refuse(typ, &parse, &st, refusal{code: codePrivilege,
			message: "capbroker: statement refused: the broker cannot read it (" + perr.Error() + "), and statement rules apply",
			hint:    "write it as plain SQL the broker can classify"}, "unreadable", "", nil)
	}
	for i := range sts {
		st := &sts[i]
		d, err := ss.decideStatement(ctx, st)
		switch {
		case err != nil:
			return ss.refuse(typ, &parse, st, refusal{code: codeUnavailable,
				message: "capbroker: the policy could not decide this statement (policy_error)"}, "policy_error", err.Error(), &d)
		case d.Allow:
			continue
		case d.Ask != nil:
			ok, r, reason := ss.hold(ctx, st, d)
			if ok {
				continue
			}
			return ss.refuse(typ, &parse, st, r, reason, "", &d)
		default:
			if ss.s.d.PolicyMode == config.ModeMonitor {
				ss.statementEvent(st, &d, audit.Allow, d.Reason, true, "")
				continue
			}
			return ss.refuse(typ, &parse, st, refusal{code: codePrivilege,
				message: "capbroker: statement refused by policy: " + d.Reason}, d.Reason, "", &d)
		}
	}
	return nil, nil
}

// read reads the SQL of a Query, Parse or FunctionCall into statements (perr: it cannot be
// read) and counts them by kind; err is a malformed message.
func (ss *session) read(typ byte, body []byte) (sql string, parse pgproto3.Parse, sts []Statement, perr, err error) {
	switch typ {
	case 'Q':
		i := bytes.IndexByte(body, 0)
		if i < 0 {
			return "", parse, nil, nil, errors.New("malformed Query message")
		}
		sql = string(body[:i])
	case 'P':
		if err := parse.Decode(body); err != nil {
			return "", parse, nil, nil, err
		}
		sql = parse.Query
	}
	if typ == 'F' {
		// A call by function OID: nothing names what it runs.
		perr = errors.New("a FunctionCall message names its function by OID only")
	} else {
		sts, perr = split(sql, ss.backslashes.Load())
	}
	ss.mu.Lock()
	if perr != nil {
		ss.counts["other"]++
	}
	for _, st := range sts {
		ss.counts[st.Kind]++
	}
	ss.mu.Unlock()
	return sql, parse, sts, perr, nil
}

// count counts a Query, Parse or FunctionCall by kind when statement rules are off: by its
// leading keyword when that settles it, else as read does.
func (ss *session) count(typ byte, body []byte) error {
	if kind := leadingKind(typ, body); kind != "" {
		ss.mu.Lock()
		ss.counts[kind]++
		ss.mu.Unlock()
		return nil
	}
	_, _, _, _, err := ss.read(typ, body)
	return err
}

// refuse audits the refusal and returns the placeholder that stands for the message upstream.
func (ss *session) refuse(typ byte, parse *pgproto3.Parse, st *Statement, r refusal, reason, internal string, d *policy.Decision) ([]byte, error) {
	ss.statementEvent(st, d, audit.Deny, reason, false, internal)
	ss.s.d.Metrics.statements.WithLabelValues(ss.up.Name, ss.role, st.Kind, "refused").Inc()
	var b [8]byte
	_, _ = rand.Read(b[:])
	nonce := refusedPrefix + hex.EncodeToString(b[:])
	ss.refMu.Lock()
	if len(ss.refusals) >= 1024 { // placeholders upstream skipped (after an earlier error): forget them
		clear(ss.refusals)
	}
	ss.refusals[nonce] = r
	ss.refMu.Unlock()
	if typ == 'P' {
		return (&pgproto3.Parse{Name: parse.Name, Query: nonce, ParameterOIDs: parse.ParameterOIDs}).Encode(nil)
	}
	return (&pgproto3.Query{String: nonce}).Encode(nil)
}

// hold asks a person about a statement (decision "ask") and waits.
func (ss *session) hold(ctx context.Context, st *Statement, d policy.Decision) (bool, refusal, string) {
	h := ss.s.d.Approvals
	if h == nil {
		return false, refusal{code: codePrivilege, message: "capbroker: statement needs an approval, and approvals are not configured"}, "approvals not configured"
	}
	host := ss.up.Name
	req := approvals.Request{RequestID: fmt.Sprintf("pg-%08x", ss.pid), Agent: ss.agent.ID, SourceIP: ss.src.String(),
		Phase: "postgres", Method: st.Command, Scheme: "postgres", Host: host, Port: 5432, Path: "/" + ss.database,
		BodyPreview: ss.scrubText(st.Text), BodySize: int64(len(st.Text)), Reason: d.Ask.Reason,
		Timeout: d.Ask.Timeout, Scopes: []string{approvals.ScopeOnce}}
	if len(req.BodyPreview) > approvals.BodyPreviewMax {
		req.BodyPreview, req.BodyTruncated = req.BodyPreview[:approvals.BodyPreviewMax]+"…", true
	}
	hctx, done := context.WithCancel(ctx)
	defer done()
	go func() {
		select {
		case <-ss.done:
			done()
		case <-hctx.Done():
		}
	}()
	// While the statement is held nothing reads the agent's side: watch it, so that an agent
	// that goes away withdraws the statement (approvals' "withdrawn") rather than leave it
	// pending until its timeout. Bytes it sends meanwhile (a pipelined Sync) stay buffered.
	watched := make(chan error, 1)
	go func() {
		_, err := ss.agentReader.Peek(1)
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			done()
		}
		watched <- err
	}()
	defer func() {
		_ = ss.conn.SetReadDeadline(time.Now()) // end the watch
		if err := <-watched; errors.Is(err, os.ErrDeadlineExceeded) {
			_, _ = ss.agentReader.Read(nil) // clear the deadline's error from the reader
		}
		_ = ss.conn.SetReadDeadline(time.Time{})
	}()
	ss.s.d.Metrics.statements.WithLabelValues(ss.up.Name, ss.role, st.Kind, "held").Inc()
	out, err := h.Hold(hctx, req)
	ev := ss.statementEvent(st, &d, "", d.Ask.Reason, false, "")
	ev.Approval = &audit.Approval{ID: out.ID, Outcome: out.State, By: out.By, Scope: out.Scope, Comment: out.Comment}
	switch {
	case err == nil && out.State == approvals.StateApproved:
		ev.Decision = audit.Allow
		ss.s.d.Audit.Write(ev)
		return true, refusal{}, ""
	case err == nil && out.State == approvals.StateTimeout:
		ev.Decision, ev.Reason = audit.Deny, "approval_timeout"
		ss.s.d.Audit.Write(ev)
		return false, refusal{code: codePrivilege, message: "capbroker: statement refused: no one approved it in time (approval_timeout)"}, "approval_timeout"
	case err != nil:
		ev.Decision, ev.Reason = audit.Deny, err.Error()
		ss.s.d.Audit.Write(ev)
		return false, refusal{code: codePrivilege, message: "capbroker: statement refused: it could not be held for approval: " + err.Error()}, err.Error()
	}
	ev.Decision, ev.Reason = audit.Deny, "denied_by_approver"
	ss.s.d.Audit.Write(ev)
	return false, refusal{code: codePrivilege, message: "capbroker: statement refused by the approver (denied_by_approver)"}, "denied_by_approver"
}

// statementEvent builds (and, unless it is a held statement's, writes) the audit event of one
// refused, held or monitored statement.
func (ss *session) statementEvent(st *Statement, d *policy.Decision, decision, reason string, wouldDeny bool, internal string) *audit.Event {
	ev := ss.event()
	ev.Start = time.Now()
	ev.Method = st.Command
	ev.Decision, ev.Reason, ev.WouldDeny, ev.Error = decision, reason, wouldDeny, internal
	if d != nil {
		ev.DecisionID, ev.PolicyRevision = d.ID, d.Revision
	}
	ev.Postgres.Role, ev.Postgres.LeaseID = ss.role, ss.leaseID
	text := Redact(st.Text)
	if ss.s.d.IncludeInput == audit.InputFull {
		text = st.Text
	}
	ev.Postgres.Statement = &audit.PostgresStatement{Kind: st.Kind, Command: st.Command, Tables: st.Tables,
		Functions: st.Functions, Text: ss.scrubText(text)}
	if decision != "" {
		ss.s.d.Audit.Write(ev)
	}
	return ev
}
