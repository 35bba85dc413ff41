// Package postgres is the broker's Postgres front door (docs/postgres.md). An agent connects
// with any Postgres client, naming a configured upstream as its database; it is identified as
// for HTTP (its proxy token as the password, checked by SCRAM-SHA-256, or its source address);
// the policy decides the connection (phase "postgres", input.postgres) and names the Vault role;
// the broker logs in upstream with a database user Vault issues for this connection alone,
// which the agent never sees, and revokes it when the connection ends. With statement rules on,
// the policy also decides every statement.
package postgres

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker/approvals"
	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/identity"
	"github.com/capbroker/capbroker/broker/inject"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/credentials"
)

// Identifier tells which agent connects (*identity.Identifier built with Options.SCRAM).
type Identifier interface {
	SCRAM(agentID string) (identity.Agent, identity.SCRAMKeys, bool)
	ByAddress(source netip.Addr) (identity.Agent, bool)
}

// Decider is the policy (*policy.Engine).
type Decider interface {
	DecideValue(ctx context.Context, input any) (policy.Decision, error)
	// Revision names the policy loaded now: a connection's statement decisions are reused
	// only while it is the same.
	Revision() string
}

// Vault issues the database users (*credentials.Vault).
type Vault interface {
	IssueLease(ctx context.Context, path string) (*credentials.Lease, error)
	ReadKV(ctx context.Context, ref credentials.VaultRef) (credentials.Secret, error)
}

// Holder holds a statement for a person's approval (*approvals.Queue).
type Holder interface {
	Hold(ctx context.Context, req approvals.Request) (approvals.Outcome, error)
}

// Certs issues the front door's TLS leaf from the broker's CA (*certs.Cache).
type Certs interface {
	Get(host string) (*tls.Certificate, error)
}

// Auditor writes audit events (*audit.Logger).
type Auditor interface {
	Write(e *audit.Event)
}

// Deps are the stages the front door uses.
type Deps struct {
	Identity  Identifier
	Policy    Decider
	Vault     Vault // nil: no upstream can be logged in to
	Approvals Holder
	Certs     Certs
	Audit     Auditor
	// Known is the process's registry of known secrets: every upstream password is recorded
	// in it before it is used, so every scrubber knows it.
	Known *inject.Known
	// Dial makes every upstream connection (upstream.Dialer.DialService).
	Dial    func(ctx context.Context, network, addr string) (net.Conn, error)
	Metrics *Metrics
	Log     zerolog.Logger
	// PolicyMode is policy.mode; IncludeInput is audit.include_input.
	PolicyMode   string
	IncludeInput audit.Level
}

// Server is the Postgres front door.
type Server struct {
	cfg       config.Postgres
	d         Deps
	upstreams map[string]*upstream

	mu       sync.Mutex
	perAgent map[string]int
	sessions map[uint32]*session // by the agent-side backend pid
	wg       sync.WaitGroup
	closing  bool
}

// upstream is one configured database, with what logging in to it needs.
type upstream struct {
	config.PostgresUpstream
	tls     *tls.Config // nil: no TLS (tls: disable)
	binding *inject.Binding
}

// New checks the upstreams' CA files and builds the front door.
func New(cfg config.Postgres, d Deps) (*Server, error) {
	if d.Metrics == nil {
		d.Metrics = NewMetrics(nil)
	}
	s := &Server{cfg: cfg, d: d, upstreams: map[string]*upstream{}, perAgent: map[string]int{}, sessions: map[uint32]*session{}}
	for i, u := range cfg.Upstreams {
		up := &upstream{PostgresUpstream: u}
		host, _, _ := net.SplitHostPort(u.Address)
		if u.TLS != "disable" {
			tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host}
			if u.ServerName != "" {
				tc.ServerName = u.ServerName
			}
			if u.CAFile != "" {
				pem, err := os.ReadFile(u.CAFile)
				if err != nil {
					return nil, fmt.Errorf("postgres.upstreams[%d].ca_file: %w", i, err)
				}
				pool := x509.NewCertPool()
				if !pool.AppendCertsFromPEM(pem) {
					return nil, fmt.Errorf("postgres.upstreams[%d].ca_file: no PEM certificate in %s", i, u.CAFile)
				}
				tc.RootCAs = pool
			}
			up.tls = tc
		}
		// The binding the upstream's passwords are known under: scrubbed from anything
		// that concerns this host (inject.Known).
		up.binding = inject.NewSet([]config.Credential{{Name: "postgres:" + u.Name, Hosts: []string{host},
			Inject: config.Inject{Header: "X-Postgres-Password", Value: "{{secret}}"}}}).All()[0]
		s.upstreams[u.Name] = up
	}
	return s, nil
}

// Serve accepts connections on ln until ctx ends; then it closes every connection (each
// revokes its lease) and returns once they are gone.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	go func() {
		<-ctx.Done()
		_ = ln.Close()
		s.mu.Lock()
		s.closing = true
		for _, ss := range s.sessions {
			ss.close()
		}
		s.mu.Unlock()
	}()
	var err error
	for {
		var c net.Conn
		c, err = ln.Accept()
		if err != nil {
			break
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConn(ctx, c)
		}()
	}
	s.wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// fatal sends a FATAL error to the agent. Its text is the broker's own, never an upstream's
// or Vault's.
func fatal(be *pgproto3.Backend, code, msg string) {
	be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: code, Message: msg})
	_ = be.Flush()
}

// SQLSTATEs the front door answers with.
const (
	codeAuth         = "28P01" // invalid_password
	codeAuthSpec     = "28000" // invalid_authorization_specification
	codeNoDatabase   = "3D000" // invalid_catalog_name
	codePrivilege    = "42501" // insufficient_privilege
	codeUnavailable  = "08001" // sqlclient_unable_to_establish_sqlconnection
	codeTooMany      = "53300" // too_many_connections
	codeProtocol     = "08P01" // protocol_violation
	codeAdminEnd     = "57P01" // admin_shutdown
	codeIdle         = "57P05" // idle_session_timeout
	startupTimeout   = 30 * time.Second
	maxMessageLength = 64 << 20
)

func (s *Server) serveConn(ctx context.Context, c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(startupTimeout))
	src, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	be := pgproto3.NewBackend(c, c)
	be.SetMaxBodyLen(maxMessageLength)
	var tlsOn bool
	var conn = c
	for {
		msg, err := be.ReceiveStartupMessage()
		if err != nil {
			return
		}
		switch m := msg.(type) {
		case *pgproto3.SSLRequest:
			if tlsOn || s.cfg.TLS == config.PostgresTLSOff || s.d.Certs == nil {
				if _, err := c.Write([]byte{'N'}); err != nil {
					return
				}
				continue
			}
			if _, err := c.Write([]byte{'S'}); err != nil {
				return
			}
			tc := tls.Server(c, &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: s.certificate(c)})
			if err := tc.HandshakeContext(ctx); err != nil {
				return
			}
			conn, tlsOn = tc, true
			be = pgproto3.NewBackend(tc, tc)
			be.SetMaxBodyLen(maxMessageLength)
		case *pgproto3.GSSEncRequest:
			if _, err := conn.Write([]byte{'N'}); err != nil {
				return
			}
		case *pgproto3.CancelRequest:
			s.cancel(ctx, m)
			return
		case *pgproto3.StartupMessage:
			if s.cfg.TLS == config.PostgresTLSRequired && !tlsOn {
				fatal(be, codeAuthSpec, "capbroker: this Postgres front door requires TLS (sslmode=require or verify-full, with the broker's CA)")
				return
			}
			s.startup(ctx, conn, be, m, src.Addr(), tlsOn)
			return
		default:
			return
		}
	}
}

// certificate issues the leaf for the name the client asked for (SNI), or for the address
// it connected to.
func (s *Server) certificate(c net.Conn) func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		name := h.ServerName
		if name == "" {
			name, _, _ = net.SplitHostPort(c.LocalAddr().String())
		}
		return s.d.Certs.Get(name)
	}
}

// startupParams are the startup parameters passed upstream; every other is dropped, and
// "options" (which can set any setting, the role among them) and "replication" are refused.
var startupParams = map[string]bool{"application_name": true, "client_encoding": true, "datestyle": true,
	"timezone": true, "extra_float_digits": true, "intervalstyle": true}

func (s *Server) startup(ctx context.Context, conn net.Conn, be *pgproto3.Backend, m *pgproto3.StartupMessage, src netip.Addr, tlsOn bool) {
	start := time.Now()
	user, db := m.Parameters["user"], m.Parameters["database"]
	if db == "" {
		db = user
	}
	// Authenticate: the user names an agent with a token (SCRAM on the token), or the source
	// address names one.
	var agent identity.Agent
	if a, keys, ok := s.d.Identity.SCRAM(user); ok {
		if err := scramServer(be, keys, true); err != nil {
			fatal(be, codeAuth, fmt.Sprintf("capbroker: password authentication failed for user %q (the password is the agent's proxy token)", user))
			s.d.Metrics.connections.WithLabelValues(db, "", "unauthenticated").Inc()
			return
		}
		agent = a
	} else if a, ok := s.d.Identity.ByAddress(src); ok {
		agent = a
	} else {
		_ = scramServer(be, decoyKeys, false)
		fatal(be, codeAuth, fmt.Sprintf("capbroker: password authentication failed for user %q (the password is the agent's proxy token)", user))
		s.d.Metrics.connections.WithLabelValues(db, "", "unauthenticated").Inc()
		return
	}
	ss := &session{s: s, agent: agent, src: src, conn: conn, be: be, start: start, tls: tlsOn,
		database: db, user: user, appName: m.Parameters["application_name"], counts: map[string]int64{},
		refusals: map[string]refusal{}, done: make(chan struct{}), params: map[string]string{}}
	for k, v := range m.Parameters {
		ss.params[strings.ToLower(k)] = v
	}
	ss.run(ctx, m)
}

// register gives the session its agent-side cancel key and counts it against its agent's cap.
func (s *Server) register(ss *session) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return errClosing
	}
	if n := s.perAgent[ss.agent.ID]; n >= s.cfg.MaxConnectionsPerAgent {
		return fmt.Errorf("%w: agent %q holds %d connections, the most it may (postgres.max_connections_per_agent)", errTooMany, ss.agent.ID, n)
	}
	for {
		var b [8]byte
		_, _ = rand.Read(b[:])
		pid := binary.BigEndian.Uint32(b[:4]) & 0x7fffffff
		if pid == 0 || s.sessions[pid] != nil {
			continue
		}
		ss.pid, ss.key = pid, b[4:]
		break
	}
	s.perAgent[ss.agent.ID]++
	s.sessions[ss.pid] = ss
	return nil
}

func (s *Server) unregister(ss *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessions[ss.pid] == ss {
		delete(s.sessions, ss.pid)
		if s.perAgent[ss.agent.ID]--; s.perAgent[ss.agent.ID] <= 0 {
			delete(s.perAgent, ss.agent.ID)
		}
	}
}

var (
	errClosing = errors.New("the broker is shutting down")
	errTooMany = errors.New("too many connections")
)

// cancel forwards a CancelRequest to the upstream backend of the session whose agent-side key
// it carries; any other is dropped, as Postgres drops a wrong key.
func (s *Server) cancel(ctx context.Context, m *pgproto3.CancelRequest) {
	s.mu.Lock()
	ss := s.sessions[m.ProcessID]
	s.mu.Unlock()
	if ss == nil || subtle.ConstantTimeCompare(ss.key, m.SecretKey) != 1 {
		s.d.Metrics.cancels.WithLabelValues("unknown").Inc()
		return
	}
	ss.mu.Lock()
	up, pid, key := ss.up, ss.upPID, ss.upKey
	ss.mu.Unlock()
	if up == nil {
		return
	}
	dctx, done := context.WithTimeout(ctx, 10*time.Second)
	defer done()
	c, err := s.d.Dial(dctx, "tcp", up.Address)
	if err != nil {
		s.d.Log.Warn().Err(err).Str("upstream", up.Name).Msg("postgres cancel: dialling the upstream failed")
		s.d.Metrics.cancels.WithLabelValues("failed").Inc()
		return
	}
	defer c.Close()
	req := (&pgproto3.CancelRequest{ProcessID: pid, SecretKey: key})
	buf, err := req.Encode(nil)
	if err == nil {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = c.Write(buf)
	}
	if err != nil {
		s.d.Metrics.cancels.WithLabelValues("failed").Inc()
		return
	}
	// Postgres closes the connection once it has read the request.
	var one [1]byte
	_, _ = c.Read(one[:])
	s.d.Metrics.cancels.WithLabelValues("forwarded").Inc()
	s.d.Log.Info().Str("agent", ss.agent.ID).Str("upstream", up.Name).Msg("postgres cancel forwarded")
}
