package postgres

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/identity"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/credentials"
)

// session is one agent connection.
type session struct {
	s        *Server
	agent    identity.Agent
	src      netip.Addr
	conn     net.Conn
	be       *pgproto3.Backend
	start    time.Time
	tls      bool
	database string
	user     string
	appName  string
	params   map[string]string // startup parameters, names lower-cased

	pid uint32 // agent-side cancel key
	key []byte

	mu    sync.Mutex
	up    *upstream
	upPID uint32 // the upstream backend's cancel key
	upKey []byte
	upc   net.Conn

	role, leaseID string
	password      string // the upstream password: scrubbed from every message to the agent
	counts        map[string]int64
	bytesIn       atomic.Int64 // from the agent
	bytesOut      atomic.Int64 // to the agent
	last          atomic.Int64 // Unix nanoseconds of the last message either way
	// backslashes: the server reads '...' with backslash escapes (standard_conforming_strings
	// off), and so does the broker.
	backslashes atomic.Bool

	// allowed holds, by statement shape (statementKey), the statements the policy allowed
	// on this connection at revision allowedRev: the input of a statement decision is the
	// connection's (fixed) and the statement's shape, so the same shape gets the same answer
	// until the policy changes. Only allows are kept; at most maxAllowed.
	allowed    map[string]bool
	allowedRev string

	agentReader *bufio.Reader // the agent side's reader (fromAgent's), watched while a statement is held

	refMu    sync.Mutex
	refusals map[string]refusal // by nonce: statements replaced upstream by a refusal

	closeOnce sync.Once
	done      chan struct{}
}

func (ss *session) close() {
	ss.closeOnce.Do(func() {
		close(ss.done)
		_ = ss.conn.Close()
		ss.mu.Lock()
		if ss.upc != nil {
			_ = ss.upc.Close()
		}
		ss.mu.Unlock()
	})
}

// input is the policy input of the connection (statement nil) or of one statement.
func (ss *session) input(st *Statement) map[string]any {
	pg := map[string]any{
		"database": ss.database, "user": ss.user, "application_name": ss.appName, "tls": ss.tls, "upstream": "",
	}
	if ss.up != nil {
		pg["upstream"] = ss.up.Name
	}
	if st != nil {
		pg["statement"] = map[string]any{"kind": st.Kind, "command": st.Command, "setting": st.Setting,
			"tables": strs(st.Tables), "functions": strs(st.Functions)}
	}
	return map[string]any{
		"phase":    "postgres",
		"agent":    map[string]any{"id": ss.agent.ID, "labels": labels(ss.agent.Labels)},
		"source":   map[string]any{"ip": ss.src.String(), "mode": audit.ModeExplicit},
		"postgres": pg,
	}
}

func strs(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

func labels(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// event is the audit event of this connection, or of one of its statements.
func (ss *session) event() *audit.Event {
	e := &audit.Event{RequestID: fmt.Sprintf("pg-%08x", ss.pid), Agent: ss.agent.ID, SourceIP: ss.src.String(),
		Phase: "postgres", Method: "CONNECT", Scheme: "postgres", Path: "/" + ss.database, Start: ss.start,
		Mode: audit.ModeExplicit, PolicyMode: ss.s.d.PolicyMode,
		Postgres: &audit.PostgresCall{Database: ss.database, User: ss.user, ApplicationName: ss.appName, TLS: ss.tls}}
	if ss.up != nil {
		host, port, _ := net.SplitHostPort(ss.up.Address)
		e.Host, e.Postgres.Upstream = host, ss.up.Name
		e.Port, _ = strconv.Atoi(port)
	}
	return e
}

func (ss *session) decide(ctx context.Context, st *Statement) (policy.Decision, error) {
	return ss.s.d.Policy.DecideValue(ctx, ss.input(st))
}

const maxAllowed = 512

// statementKey is what a statement decision depends on besides the connection.
func statementKey(st *Statement) string {
	return st.Kind + "\x00" + st.Command + "\x00" + st.Setting + "\x00" + strings.Join(st.Tables, "\x01") + "\x00" + strings.Join(st.Functions, "\x01")
}

// decideStatement is decide for a statement, reusing an allow of the same shape under the
// same policy revision.
func (ss *session) decideStatement(ctx context.Context, st *Statement) (policy.Decision, error) {
	rev := ss.s.d.Policy.Revision()
	key := statementKey(st)
	if rev != ss.allowedRev {
		ss.allowed, ss.allowedRev = map[string]bool{}, rev
	}
	if ss.allowed[key] {
		return policy.Decision{Allow: true, Revision: rev}, nil
	}
	d, err := ss.decide(ctx, st)
	if err == nil && d.Allow && d.Revision == rev && len(ss.allowed) < maxAllowed {
		ss.allowed[key] = true
	}
	return d, err
}

func (ss *session) run(ctx context.Context, m *pgproto3.StartupMessage) {
	s := ss.s
	ev := ss.event()
	ev.Decision, ev.Status = audit.Deny, 0
	outcome := "denied"
	defer func() {
		ev.BytesIn, ev.BytesOut = ss.bytesIn.Load(), ss.bytesOut.Load()
		ev.Postgres.Role, ev.Postgres.LeaseID = ss.role, ss.leaseID
		if ev.Decision == audit.Allow {
			ss.mu.Lock()
			ev.Postgres.Statements = ss.counts
			ss.mu.Unlock()
		}
		s.d.Audit.Write(ev)
		upName := ""
		if ss.up != nil {
			upName = ss.up.Name
		}
		s.d.Metrics.connections.WithLabelValues(upName, ss.role, outcome).Inc()
	}()
	up := s.upstreams[ss.database]
	if up == nil {
		ev.Reason = fmt.Sprintf("no upstream database %q is configured", ss.database)
		fatal(ss.be, codeNoDatabase, "capbroker: "+ev.Reason)
		return
	}
	ss.up = up
	ev = ss.event()
	ev.Decision = audit.Deny
	for k := range m.Parameters {
		if k == "options" || k == "replication" {
			ev.Reason = fmt.Sprintf("the startup parameter %q is not passed upstream", k)
			fatal(ss.be, codeProtocol, "capbroker: "+ev.Reason+"; set session settings with SQL, which the policy sees")
			return
		}
	}
	if enc := ss.params["client_encoding"]; enc != "" && !asciiSafe(enc) {
		ev.Reason = fmt.Sprintf("client_encoding %s can hide quotes and backslashes inside characters", enc)
		fatal(ss.be, codeProtocol, "capbroker: "+ev.Reason+"; use UTF8")
		return
	}
	d, err := ss.decide(ctx, nil)
	ev.DecisionID, ev.PolicyRevision = d.ID, d.Revision
	if err != nil {
		ev.Reason, ev.Error = "policy_error", err.Error()
		fatal(ss.be, codeUnavailable, "capbroker: the policy could not decide this connection (policy_error)")
		return
	}
	if !d.Allow {
		if s.d.PolicyMode != config.ModeMonitor {
			ev.Reason = d.Reason
			fatal(ss.be, codePrivilege, "capbroker: connection denied by policy: "+d.Reason)
			return
		}
		ev.WouldDeny = true
	}
	ev.Reason = d.Reason
	if err := s.register(ss); err != nil {
		ev.Reason = err.Error()
		code := codeTooMany
		if errors.Is(err, errClosing) {
			code = codeAdminEnd
		}
		fatal(ss.be, code, "capbroker: "+err.Error())
		return
	}
	defer s.unregister(ss)
	user, password, lease, err := ss.credential(ctx, d.Role)
	if err != nil {
		ev.Reason, ev.Error = "credential_unavailable", ss.scrubText(err.Error())
		outcome = "credential_unavailable"
		s.d.Log.Warn().Str("agent", ss.agent.ID).Str("upstream", up.Name).Str("role", ss.role).Str("error", ev.Error).
			Msg("postgres: no database credential")
		fatal(ss.be, codeUnavailable, "capbroker: database credentials are unavailable (credential_unavailable): "+credentialHint(err))
		return
	}
	if lease != nil {
		defer ss.revoke(lease)
	}
	ss.password = password
	ev.Credentials = []string{up.binding.Name}
	hc, err := ss.connectUpstream(ctx, user, password)
	if err != nil {
		ev.Reason, ev.Error = "upstream_error", ss.scrubText(err.Error())
		outcome = "upstream_error"
		s.d.Log.Warn().Str("agent", ss.agent.ID).Str("upstream", up.Name).Str("error", ev.Error).Msg("postgres: upstream login failed")
		fatal(ss.be, codeUnavailable, "capbroker: the upstream database refused or failed the broker's login (upstream_error); the broker's log has the cause")
		return
	}
	ss.mu.Lock()
	ss.upc, ss.upPID, ss.upKey = hc.Conn, hc.PID, hc.SecretKey
	ss.mu.Unlock()
	ss.backslashes.Store(hc.ParameterStatuses["standard_conforming_strings"] != "on")
	select {
	case <-ss.done: // the broker stopped while logging in
		_ = hc.Conn.Close()
		return
	default:
	}
	ev.Decision, outcome = audit.Allow, "allowed"
	ss.be.Send(&pgproto3.AuthenticationOk{})
	for k, v := range hc.ParameterStatuses {
		ss.be.Send(&pgproto3.ParameterStatus{Name: k, Value: v})
	}
	ss.be.Send(&pgproto3.BackendKeyData{ProcessID: ss.pid, SecretKey: ss.key})
	ss.be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	if err := ss.be.Flush(); err != nil {
		return
	}
	_ = ss.conn.SetDeadline(time.Time{})
	s.d.Metrics.open.WithLabelValues(up.Name, ss.role).Inc()
	defer s.d.Metrics.open.WithLabelValues(up.Name, ss.role).Dec()
	expires := func() time.Time { return time.Time{} }
	if lease != nil {
		expires = lease.Expires
	}
	ss.relay(ctx, hc, expires)
	ev.Status = 0
}

// credential returns the database user to log in with: one Vault issues for this connection
// from the role the decision names (else the upstream's default_role), or the static one.
func (ss *session) credential(ctx context.Context, role string) (user, password string, lease *credentials.Lease, err error) {
	up, v := ss.up, ss.s.d.Vault
	if v == nil {
		return "", "", nil, errors.New("no vault is configured")
	}
	if role == "" && up.Vault != nil {
		role = up.Vault.DefaultRole
	}
	var sec credentials.Secret
	switch {
	case role != "":
		if !up.Role(role) {
			return "", "", nil, fmt.Errorf("%w: the policy named role %q, which postgres.upstreams %q does not list", errRole, role, up.Name)
		}
		ss.role = role
		lctx, done := context.WithTimeout(ctx, 15*time.Second)
		defer done()
		lease, err = v.IssueLease(lctx, strings.Trim(up.Vault.Mount, "/")+"/creds/"+role)
		if err != nil {
			return "", "", nil, err
		}
		ss.leaseID = lease.ID()
		sec = lease.Secret()
	case up.Static != nil:
		ss.role = "static"
		st := up.Static
		sec, err = v.ReadKV(ctx, credentials.VaultRef{Mount: st.Mount, Path: st.Path, KVVersion: st.KVVersion})
		if err != nil {
			return "", "", nil, err
		}
	default:
		return "", "", nil, fmt.Errorf("%w: no role and no static user for upstream %q", errRole, up.Name)
	}
	user, _ = sec.Field("username")
	password, _ = sec.Field("password")
	if user == "" || password == "" {
		if lease != nil {
			ss.revoke(lease)
		}
		return "", "", nil, errors.New("the Vault secret has no username and password fields")
	}
	// Known before it is used: every scrubber redacts it from now on.
	ss.s.d.Known.Hold(up.binding, credentials.NewSecret(password))
	return user, password, lease, nil
}

var errRole = errors.New("no usable database role")

func credentialHint(err error) string {
	switch {
	case errors.Is(err, errRole):
		return "the policy's role is not configured for this database"
	case errors.Is(err, credentials.ErrUnavailable):
		return "Vault is unreachable or refused to issue a database user; try again later"
	}
	return "the broker's log has the cause"
}

// revoke revokes the connection's lease: the database user stops existing.
func (ss *session) revoke(l *credentials.Lease) {
	ctx, done := context.WithTimeout(context.Background(), 10*time.Second)
	defer done()
	if err := l.Revoke(ctx); err != nil {
		ss.s.d.Log.Warn().Str("agent", ss.agent.ID).Str("lease_id", l.ID()).Str("error", ss.scrubText(err.Error())).
			Msg("postgres: revoking the database user's lease failed; it ends with its TTL")
		return
	}
	ss.s.d.Log.Debug().Str("agent", ss.agent.ID).Str("lease_id", l.ID()).Msg("postgres: lease revoked")
}

// scrubText removes the upstream password, and every other known secret, from a text.
func (ss *session) scrubText(t string) string {
	if ss.password != "" {
		t = strings.ReplaceAll(t, ss.password, "[REDACTED]")
	}
	if ss.up != nil && ss.s.d.Known != nil {
		host, _, _ := net.SplitHostPort(ss.up.Address)
		t = ss.s.d.Known.Scrubber(host).String(t)
	}
	return t
}

// connectUpstream logs in upstream: TLS verified (unless tls: disable), SCRAM-SHA-256 only,
// through the one dialer.
func (ss *session) connectUpstream(ctx context.Context, user, password string) (*pgconn.HijackedConn, error) {
	up := ss.up
	cfg, err := pgconn.ParseConfig("")
	if err != nil {
		return nil, err
	}
	host, port, _ := net.SplitHostPort(up.Address)
	p, _ := strconv.ParseUint(port, 10, 16)
	cfg.Host, cfg.Port, cfg.Database, cfg.User, cfg.Password = host, uint16(p), up.Database, user, password
	cfg.TLSConfig, cfg.Fallbacks = up.tls, nil
	cfg.DialFunc = ss.s.d.Dial
	cfg.LookupFunc = func(_ context.Context, h string) ([]string, error) { return []string{h}, nil } // the dialer resolves
	cfg.RequireAuth = "scram-sha-256"
	cfg.ConnectTimeout = 15 * time.Second
	cfg.KerberosSrvName, cfg.KerberosSpn = "", ""
	cfg.RuntimeParams = map[string]string{}
	for k := range startupParams {
		if v, ok := ss.startupParam(k); ok {
			cfg.RuntimeParams[k] = v
		}
	}
	cctx, done := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer done()
	pc, err := pgconn.ConnectConfig(cctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pc.SyncConn(cctx); err != nil {
		_ = pc.Close(context.Background())
		return nil, err
	}
	return pc.Hijack()
}

// startupParam is set by run from the startup message.
func (ss *session) startupParam(k string) (string, bool) {
	v, ok := ss.params[k]
	return v, ok
}

// asciiSafe reports whether a client encoding keeps every byte below 0x80 a character of its
// own: the encodings whose multibyte characters may hold a quote or backslash byte (SJIS,
// BIG5, GBK, UHC, GB18030, JOHAB) would be read otherwise by the broker than by the server.
func asciiSafe(enc string) bool {
	e := strings.NewReplacer("-", "", "_", "").Replace(strings.ToUpper(strings.TrimSpace(enc)))
	switch e {
	case "SJIS", "SHIFTJIS", "SHIFTJIS2004", "MSKANJI", "WIN932", "CP932", "BIG5", "WIN950", "CP950",
		"GBK", "WIN936", "CP936", "UHC", "WIN949", "CP949", "GB18030", "JOHAB":
		return false
	}
	return true
}
