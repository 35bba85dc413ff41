package postgres

import (
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/sha256"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/capbroker/capbroker/broker/approvals"
	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/identity"
	"github.com/capbroker/capbroker/broker/inject"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/credentials"
)

const upstreamPassword = "upstream-canary-7f3a9c"

// hostileUpstream is a Postgres server that logs the broker in by SCRAM with
// upstreamPassword, then echoes the password in a notice when asked, answers a refusal's
// placeholder as Postgres does (a syntax error naming it), and everything else with an empty
// result.
func hostileUpstream(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	keys := identity.SCRAMKeys{Salt: []byte("0123456789abcdef"), Iterations: 4096}
	salted, _ := pbkdf2.Key(sha256.New, upstreamPassword, keys.Salt, keys.Iterations, sha256.Size)
	ck := hmac.New(sha256.New, salted)
	ck.Write([]byte("Client Key"))
	keys.StoredKey = sha256.Sum256(ck.Sum(nil))
	sk := hmac.New(sha256.New, salted)
	sk.Write([]byte("Server Key"))
	copy(keys.ServerKey[:], sk.Sum(nil))
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				be := pgproto3.NewBackend(c, c)
				if _, err := be.ReceiveStartupMessage(); err != nil {
					return
				}
				if err := scramServer(be, keys, true); err != nil {
					return
				}
				be.Send(&pgproto3.AuthenticationOk{})
				be.Send(&pgproto3.ParameterStatus{Name: "standard_conforming_strings", Value: "on"})
				be.Send(&pgproto3.BackendKeyData{ProcessID: 42, SecretKey: []byte{1, 2, 3, 4}})
				be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
				_ = be.Flush()
				for {
					msg, err := be.Receive()
					if err != nil {
						return
					}
					q, ok := msg.(*pgproto3.Query)
					if !ok {
						return
					}
					switch {
					case strings.HasPrefix(q.String, refusedPrefix):
						be.Send(&pgproto3.ErrorResponse{Severity: "ERROR", Code: "42601", Message: `syntax error at or near "` + q.String + `"`})
					case q.String == "SELECT 'notice'":
						be.Send(&pgproto3.NoticeResponse{Severity: "NOTICE", Code: "00000", Message: "your password is " + upstreamPassword})
						be.Send(&pgproto3.CommandComplete{CommandTag: []byte("DO")})
					default:
						be.Send(&pgproto3.CommandComplete{CommandTag: []byte("SELECT 0")})
					}
					be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
					_ = be.Flush()
				}
			}()
		}
	}()
	return ln.Addr().String()
}

type denyDeletes struct{}

func (denyDeletes) DecideValue(_ context.Context, input any) (policy.Decision, error) {
	pg := input.(map[string]any)["postgres"].(map[string]any)
	st, _ := pg["statement"].(map[string]any)
	switch {
	case st != nil && st["command"] == "DELETE":
		return policy.Decision{Reason: "no deletes"}, nil
	case st != nil && st["kind"] == "ddl":
		return policy.Decision{Ask: &policy.Ask{Reason: "ddl"}}, nil
	}
	return policy.Decision{Allow: true}, nil
}

// withdrawn holds until the statement's agent goes away.
type withdrawn struct{ started, ended chan approvals.Request }

func (w withdrawn) Hold(ctx context.Context, req approvals.Request) (approvals.Outcome, error) {
	w.started <- req
	<-ctx.Done()
	w.ended <- req
	return approvals.Outcome{ID: "ap-1", State: approvals.StateWithdrawn}, nil
}

func (denyDeletes) Revision() string { return "r1" }

type staticVault struct{}

func (staticVault) IssueLease(context.Context, string) (*credentials.Lease, error) {
	return nil, errors.New("no leases here")
}

func (staticVault) ReadKV(context.Context, credentials.VaultRef) (credentials.Secret, error) {
	return credentials.NewFields(map[string]string{"username": "u", "password": upstreamPassword}), nil
}

type events struct {
	mu  sync.Mutex
	evs []*audit.Event
	c   chan *audit.Event
}

func (e *events) Write(ev *audit.Event) {
	e.mu.Lock()
	e.evs = append(e.evs, ev)
	e.mu.Unlock()
	e.c <- ev
}

// frontDoor serves the front door before a hostile upstream, with statement rules on.
func frontDoor(t *testing.T, idle time.Duration, holder ...Holder) (string, *events) {
	t.Helper()
	t.Setenv("PG_TEST_AGENT_TOKEN", "agent-token")
	ids, err := identity.NewWith([]config.Agent{{ID: "agent1", TokenEnv: "PG_TEST_AGENT_TOKEN"}}, identity.Options{SCRAM: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Postgres{Listen: "127.0.0.1:0", TLS: config.PostgresTLSOff, Statements: true, MaxConnectionsPerAgent: 4,
		IdleTimeout: idle, Upstreams: []config.PostgresUpstream{{Name: "app", Database: "app", Address: hostileUpstream(t),
			TLS: "disable", Static: &config.VaultSource{Mount: "secret", Path: "db", KVVersion: 2}}}}
	ev := &events{c: make(chan *audit.Event, 64)}
	var h Holder
	if len(holder) > 0 {
		h = holder[0]
	}
	srv, err := New(cfg, Deps{Identity: ids, Policy: denyDeletes{}, Vault: staticVault{}, Audit: ev, Approvals: h,
		Known: inject.NewKnown(inject.KnownOptions{}), Dial: (&net.Dialer{}).DialContext})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String(), ev
}

func connect(t *testing.T, addr string, notices *[]string) *pgconn.PgConn {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	cfg, err := pgconn.ParseConfig("host=" + host + " port=" + port + " user=agent1 password=agent-token dbname=app sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { *notices = append(*notices, n.Message) }
	c, err := pgconn.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestFrontDoorScrubsAndRefusesInPlace(t *testing.T) {
	addr, ev := frontDoor(t, time.Minute)
	var notices []string
	c := connect(t, addr, &notices)
	ctx := context.Background()
	if c.PID() == 42 {
		t.Fatal("the agent sees the upstream backend's pid")
	}
	if _, err := c.Exec(ctx, "SELECT 'notice'").ReadAll(); err != nil {
		t.Fatal(err)
	}
	if len(notices) != 1 || strings.Contains(notices[0], upstreamPassword) || !strings.Contains(notices[0], "[REDACTED]") {
		t.Fatalf("the upstream's notice reached the agent as %q", notices)
	}
	_, err := c.Exec(ctx, "SELECT 1; DELETE FROM t").ReadAll()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != codePrivilege || pe.Message != "capbroker: statement refused by policy: no deletes" {
		t.Fatalf("a batch with a refused statement: %v", err)
	}
	if _, err := c.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatalf("the connection after a refusal: %v", err)
	}
	refused := <-ev.c
	if refused.Method != "DELETE" || refused.Postgres.Statement.Text != "DELETE FROM t" || refused.Decision != audit.Deny {
		t.Fatalf("refusal event: %+v %+v", refused, refused.Postgres.Statement)
	}
	_ = c.Close(ctx)
	conn := <-ev.c
	if conn.Method != "CONNECT" || conn.Decision != audit.Allow || conn.Postgres.Role != "static" ||
		conn.Postgres.Statements["read"] != 3 || conn.Postgres.Statements["write"] != 1 || conn.Postgres.Statements["other"] != 0 {
		t.Fatalf("connection event: %+v %+v", conn, conn.Postgres)
	}
}

func TestFrontDoorIdleTimeout(t *testing.T) {
	addr, ev := frontDoor(t, 100*time.Millisecond)
	var notices []string
	c := connect(t, addr, &notices)
	defer c.Close(context.Background())
	select {
	case e := <-ev.c:
		if e.Method != "CONNECT" || e.Decision != audit.Allow {
			t.Fatalf("event: %+v", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an idle connection was not closed")
	}
	if _, err := c.Exec(context.Background(), "SELECT 1").ReadAll(); err == nil {
		t.Fatal("the idle connection still answers")
	}
}

func TestFrontDoorWrongToken(t *testing.T) {
	addr, _ := frontDoor(t, time.Minute)
	host, port, _ := net.SplitHostPort(addr)
	_, err := pgconn.Connect(context.Background(), "host="+host+" port="+port+" user=agent1 password=wrong dbname=app sslmode=disable")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != codeAuth {
		t.Fatalf("wrong token: %v", err)
	}
	_, err = pgconn.Connect(context.Background(), "host="+host+" port="+port+" user=nobody password=agent-token dbname=app sslmode=disable")
	if !errors.As(err, &pe) || pe.Code != codeAuth {
		t.Fatalf("unknown agent: %v", err)
	}
}

// A held statement is withdrawn when its agent goes away, not left pending.
func TestFrontDoorHeldStatementWithdrawn(t *testing.T) {
	w := withdrawn{started: make(chan approvals.Request, 1), ended: make(chan approvals.Request, 1)}
	addr, ev := frontDoor(t, time.Minute, w)
	var notices []string
	c := connect(t, addr, &notices)
	go func() { _, _ = c.Exec(context.Background(), "CREATE TABLE t (a int)").ReadAll() }()
	req := <-w.started
	if req.BodyPreview != "CREATE TABLE t (a int)" || req.Method != "CREATE TABLE" || req.Agent != "agent1" {
		t.Fatalf("the approver sees %+v", req)
	}
	_ = c.Conn().Close() // the agent goes away
	select {
	case <-w.ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the hold outlived its agent")
	}
	e := <-ev.c
	if e.Decision != audit.Deny || e.Approval == nil || e.Approval.Outcome != approvals.StateWithdrawn {
		t.Fatalf("held statement's event: %+v", e)
	}
}
