// Package gitssh is the broker's SSH front door for git. An agent connects to it as a jump
// host (ssh -J, ProxyJump) and asks for a git host by name; the broker answers that inner
// connection itself, with its own host key, lets only git-upload-pack, git-receive-pack and
// git-upload-archive run, decides each one with the policy (phase "ssh", input.ssh) — a
// push with its ref updates, read before a byte of it goes upstream — and runs the command
// upstream signed in with a key the agent never holds: an ephemeral key Vault signs for the
// one connection, or a private key read from Vault KV. One audit event per session.
//
// It shares the steps every front door uses: identity (the agent's proxy token as its SSH
// password, a key listed for it, or its source address), policy, audit, and the broker's one
// outbound dialer. It imports no part of the HTTP pipeline.
package gitssh

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/crypto/ssh"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/identity"
	"github.com/capbroker/capbroker/broker/policy"
)

// Decider is the policy.
type Decider interface {
	Decide(ctx context.Context, in *policy.Input) (policy.Decision, error)
}

// Auditor writes audit events.
type Auditor interface {
	Write(*audit.Event)
}

// Deps are the steps the front door shares with the HTTP pipeline.
type Deps struct {
	// Agents returns the running config's identities (they change on reload).
	Agents  func() *identity.Identifier
	Policy  Decider
	Audit   Auditor
	Dial    DialFunc
	Vault   Vault
	HostKey ssh.Signer
	Log     zerolog.Logger
	// Metrics, when set, is where the front door's counters are registered.
	Metrics prometheus.Registerer
}

// Server serves agents' SSH connections.
type Server struct {
	cfg        config.SSH
	policyMode string
	auditInput audit.Level
	deps       Deps
	targets    map[string]*target // by "host:port"
	agentKeys  map[string][][]byte
	server     *ssh.ServerConfig

	mu       sync.Mutex
	sessions map[string]int // open git sessions by agent id

	sessionsTotal *prometheus.CounterVec
	bytesTotal    *prometheus.CounterVec
}

// handshakeTimeout bounds an agent's SSH handshake and sign-in.
const handshakeTimeout = 30 * time.Second

// upstreamTimeout bounds signing a key and signing in upstream.
const upstreamTimeout = 30 * time.Second

// agentKey is the Permissions.ExtraData key of the identified agent.
type agentKey struct{}

// New builds the front door from a validated config.
func New(cfg *config.Config, deps Deps) (*Server, error) {
	if deps.Agents == nil || deps.Policy == nil || deps.Audit == nil || deps.Dial == nil || deps.HostKey == nil {
		return nil, errors.New("gitssh: Agents, Policy, Audit, Dial and HostKey are required")
	}
	s := &Server{
		cfg: cfg.SSH, policyMode: cfg.Policy.Mode, auditInput: cfg.Audit.IncludeInput, deps: deps,
		targets: map[string]*target{}, agentKeys: map[string][][]byte{}, sessions: map[string]int{},
		sessionsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capbroker_ssh_sessions_total",
			Help: "Git sessions over SSH, by service (fetch, push, archive, none) and decision (allow, deny, error).",
		}, []string{"service", "decision"}),
		bytesTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capbroker_ssh_bytes_total",
			Help: "Bytes of git sessions over SSH, by service and direction (in: from the agent, out: to the agent).",
		}, []string{"service", "direction"}),
	}
	if deps.Metrics != nil {
		for _, c := range []prometheus.Collector{s.sessionsTotal, s.bytesTotal} {
			if err := deps.Metrics.Register(c); err != nil {
				return nil, err
			}
		}
	}
	for _, u := range cfg.SSH.Upstreams {
		t, err := newTarget(u)
		if err != nil {
			return nil, err
		}
		s.targets[fmt.Sprintf("%s:%d", u.Host, u.Port)] = t
	}
	for id, keys := range cfg.SSH.AgentKeys {
		for _, k := range keys {
			pk, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k))
			if err != nil {
				return nil, fmt.Errorf("ssh.agent_keys.%s: %w", id, err)
			}
			s.agentKeys[id] = append(s.agentKeys[id], pk.Marshal())
		}
	}
	s.server = &ssh.ServerConfig{
		NoClientAuth: true,
		NoClientAuthCallback: func(c ssh.ConnMetadata) (*ssh.Permissions, error) {
			a, err := deps.Agents().Identify("", sourceAddr(c.RemoteAddr()))
			return permissions(a, err)
		},
		PasswordCallback: func(c ssh.ConnMetadata, password []byte) (*ssh.Permissions, error) {
			basic := "Basic " + base64.StdEncoding.EncodeToString([]byte(c.User()+":"+string(password)))
			a, err := deps.Agents().Identify(basic, sourceAddr(c.RemoteAddr()))
			return permissions(a, err)
		},
		PublicKeyCallback: func(c ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			want := key.Marshal()
			for _, k := range s.agentKeys[c.User()] {
				if string(k) == string(want) {
					return s.agentByID(c.User())
				}
			}
			return nil, identity.ErrUnauthenticated
		},
		ServerVersion: "SSH-2.0-capbroker",
		MaxAuthTries:  6,
	}
	s.server.AddHostKey(deps.HostKey)
	return s, nil
}

// agentByID is the configured agent with this id (its labels), for a key listed for it.
func (s *Server) agentByID(id string) (*ssh.Permissions, error) {
	a, ok := s.deps.Agents().Lookup(id)
	if !ok {
		return nil, identity.ErrUnauthenticated
	}
	return permissions(a, nil)
}

func permissions(a identity.Agent, err error) (*ssh.Permissions, error) {
	if err != nil {
		return nil, err
	}
	return &ssh.Permissions{ExtraData: map[any]any{agentKey{}: a}}, nil
}

func sourceAddr(a net.Addr) netip.Addr {
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// PublicKey is the broker's host key, which agents pin (agent-env prints it).
func (s *Server) PublicKey() ssh.PublicKey { return s.deps.HostKey.PublicKey() }

// Serve accepts agents' connections on ln until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		go s.serveConn(ctx, c)
	}
}

// conn is one agent connection (the jump host's, or a redirected one) and who it is.
type conn struct {
	agent  identity.Agent
	source string
	mode   string // audit.ModeExplicit, or audit.ModeTransparent for a redirected connection
}

// serveConn runs the outer connection: the agent signs in and asks for git hosts by name
// (direct-tcpip channels). Nothing else is served on it: no shell, no forwarding.
func (s *Server) serveConn(ctx context.Context, nc net.Conn) {
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(handshakeTimeout))
	sc, chans, reqs, err := ssh.NewServerConn(nc, s.server)
	if err != nil {
		s.deps.Log.Debug().Err(err).Str("source_ip", sourceAddr(nc.RemoteAddr()).String()).Msg("ssh handshake failed")
		return
	}
	_ = nc.SetDeadline(time.Time{})
	defer sc.Close()
	c := &conn{agent: sc.Permissions.ExtraData[agentKey{}].(identity.Agent), source: sourceAddr(nc.RemoteAddr()).String(), mode: audit.ModeExplicit}
	go s.refuseRequests(c, reqs)
	for nch := range chans {
		if nch.ChannelType() != "direct-tcpip" {
			s.refuseChannel(c, nch, "", 0, fmt.Sprintf("a %s channel is not allowed: the broker is a jump host for git (ssh -J, ProxyJump)", nch.ChannelType()))
			continue
		}
		var dest struct {
			Host       string
			Port       uint32
			OriginAddr string
			OriginPort uint32
		}
		if err := ssh.Unmarshal(nch.ExtraData(), &dest); err != nil {
			_ = nch.Reject(ssh.ConnectionFailed, "malformed direct-tcpip request")
			continue
		}
		host := strings.ToLower(strings.TrimSuffix(dest.Host, "."))
		t, ok := s.targets[fmt.Sprintf("%s:%d", host, dest.Port)]
		if !ok {
			s.refuseChannel(c, nch, host, int(dest.Port), fmt.Sprintf("%s port %d is not a git host the broker serves over SSH", host, dest.Port))
			continue
		}
		release, ok := s.admit(c.agent.ID)
		if !ok {
			reason := fmt.Sprintf("agent %s has %d connections to git hosts open, the most ssh.max_sessions_per_agent allows", c.agent.ID, s.cfg.MaxSessionsPerAgent)
			_ = nch.Reject(ssh.ResourceShortage, "capbroker: "+reason)
			ev := s.event(c, host, int(dest.Port))
			ev.Decision, ev.Reason, ev.Status = audit.Deny, reason, 429
			s.finish(ev, "none")
			continue
		}
		ch, creqs, err := nch.Accept()
		if err != nil {
			release()
			continue
		}
		go ssh.DiscardRequests(creqs)
		go func() {
			defer release()
			s.serveInner(ctx, c, t, channelConn{ch})
		}()
	}
}

// Serves reports whether host:port is a git host the front door serves: in transparent
// mode, a redirected connection to it is SSH.
func (s *Server) Serves(host string, port int) bool {
	_, ok := s.targets[fmt.Sprintf("%s:%d", strings.ToLower(strings.TrimSuffix(host, ".")), port)]
	return ok
}

// ServeRedirected serves a connection the sandbox's rules redirected (transparent mode) to
// host:port, the name its address was given by the sandbox's resolver: the agent, already
// identified by its source address, speaks to the git host directly, and the broker
// answers as that host, as it answers a ProxyJump's inner connection. It closes nc.
func (s *Server) ServeRedirected(ctx context.Context, nc net.Conn, agent identity.Agent, host string, port int) {
	defer nc.Close()
	c := &conn{agent: agent, source: sourceAddr(nc.RemoteAddr()).String(), mode: audit.ModeTransparent}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	t, ok := s.targets[fmt.Sprintf("%s:%d", host, port)]
	if !ok {
		ev := s.event(c, host, port)
		ev.Decision, ev.Reason = audit.Deny, fmt.Sprintf("%s port %d is not a git host the broker serves over SSH", host, port)
		s.finish(ev, "none")
		return
	}
	release, ok := s.admit(agent.ID)
	if !ok {
		ev := s.event(c, host, port)
		ev.Decision, ev.Reason, ev.Status = audit.Deny, fmt.Sprintf("agent %s has %d connections to git hosts open, the most ssh.max_sessions_per_agent allows", agent.ID, s.cfg.MaxSessionsPerAgent), 429
		s.finish(ev, "none")
		return
	}
	defer release()
	s.serveInner(ctx, c, t, nc)
}

// serveInner answers the agent's SSH connection to the git host t: carried in a channel of
// its jump-host connection, or redirected to the broker in transparent mode. The agent was
// identified already (its jump-host sign-in, its source address), so this connection takes
// no credential of its own.
func (s *Server) serveInner(ctx context.Context, c *conn, t *target, nc net.Conn) {
	defer nc.Close()
	cfg := &ssh.ServerConfig{NoClientAuth: true, ServerVersion: "SSH-2.0-capbroker"}
	cfg.AddHostKey(s.deps.HostKey)
	_ = nc.SetDeadline(time.Now().Add(handshakeTimeout))
	sc, chans, reqs, err := ssh.NewServerConn(nc, cfg)
	if err != nil {
		s.deps.Log.Debug().Err(err).Str("source_ip", c.source).Msg("ssh handshake failed")
		return
	}
	_ = nc.SetDeadline(time.Time{})
	defer sc.Close()
	go s.refuseRequests(c, reqs)
	// One git command at a time per connection, as git runs them: the per-agent cap counts
	// connections, and this bounds what each may run.
	busy := make(chan struct{}, 1)
	for nch := range chans {
		if nch.ChannelType() != "session" {
			s.refuseChannel(c, nch, t.cfg.Host, t.cfg.Port, fmt.Sprintf("a %s channel (port forwarding) is not allowed: only git commands", nch.ChannelType()))
			continue
		}
		select {
		case busy <- struct{}{}:
		default:
			_ = nch.Reject(ssh.ResourceShortage, "capbroker: one git command at a time per connection")
			continue
		}
		sch, sreqs, err := nch.Accept()
		if err != nil {
			<-busy
			continue
		}
		go func() {
			defer func() { <-busy }()
			s.session(ctx, c, t, sc.User(), sch, sreqs)
		}()
	}
}

// refuseRequests refuses every global request (remote port forwarding among them), audited.
func (s *Server) refuseRequests(c *conn, reqs <-chan *ssh.Request) {
	for r := range reqs {
		if r.WantReply {
			_ = r.Reply(false, nil)
		}
		switch r.Type {
		case "tcpip-forward", "streamlocal-forward@openssh.com":
			// Remote port forwarding: refused and audited. Other global requests (keepalives,
			// OpenSSH's no-more-sessions) are refused quietly: they ask for nothing.
			ev := s.event(c, "", 0)
			ev.Decision, ev.Reason = audit.Deny, fmt.Sprintf("the request %s (port forwarding) is not allowed: only git commands", r.Type)
			s.finish(ev, "none")
		}
	}
}

func (s *Server) refuseChannel(c *conn, nch ssh.NewChannel, host string, port int, reason string) {
	_ = nch.Reject(ssh.Prohibited, "capbroker: "+reason)
	ev := s.event(c, host, port)
	ev.Decision, ev.Reason = audit.Deny, reason
	s.finish(ev, "none")
}

// event starts an audit event of the ssh phase.
func (s *Server) event(c *conn, host string, port int) *audit.Event {
	return &audit.Event{
		RequestID: newID(), Agent: c.agent.ID, SourceIP: c.source, Phase: policy.PhaseSSH, Scheme: "ssh",
		Host: host, Port: port, Start: time.Now(), Mode: c.mode, PolicyMode: s.policyMode,
	}
}

// finish writes ev and counts it.
func (s *Server) finish(ev *audit.Event, service string) {
	s.sessionsTotal.WithLabelValues(service, ev.Decision).Inc()
	if ev.BytesIn > 0 {
		s.bytesTotal.WithLabelValues(service, "in").Add(float64(ev.BytesIn))
	}
	if ev.BytesOut > 0 {
		s.bytesTotal.WithLabelValues(service, "out").Add(float64(ev.BytesOut))
	}
	s.deps.Audit.Write(ev)
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// channelConn is an SSH channel as the net.Conn an inner SSH connection runs over.
type channelConn struct{ ssh.Channel }

func (channelConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (channelConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (channelConn) SetDeadline(time.Time) error      { return nil }
func (channelConn) SetReadDeadline(time.Time) error  { return nil }
func (channelConn) SetWriteDeadline(time.Time) error { return nil }

// admit counts a connection of the agent to a git host, or refuses it over
// ssh.max_sessions_per_agent.
func (s *Server) admit(agent string) (release func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessions[agent] >= s.cfg.MaxSessionsPerAgent {
		return nil, false
	}
	s.sessions[agent]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.sessions[agent]--; s.sessions[agent] <= 0 {
			delete(s.sessions, agent)
		}
	}, true
}

// activity closes a session that moved no byte for the idle timeout.
type activity struct {
	last atomic.Int64
}

func (a *activity) touch() { a.last.Store(time.Now().UnixNano()) }

// watch calls stop once nothing moved for idle, or returns when done closes.
func (a *activity) watch(idle time.Duration, done <-chan struct{}, stop func()) {
	a.touch()
	tick := time.NewTicker(max(idle/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case now := <-tick.C:
			if now.Sub(time.Unix(0, a.last.Load())) >= idle {
				stop()
				return
			}
		}
	}
}

// counter counts the bytes through a reader or writer and marks activity.
type counter struct {
	n   atomic.Int64
	act *activity
}

type countingReader struct {
	r io.Reader
	c *counter
}

func (r countingReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.c.n.Add(int64(n))
		r.c.act.touch()
	}
	return n, err
}
