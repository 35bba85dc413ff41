package gitssh

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sync"
	"sync/atomic"

	"golang.org/x/crypto/ssh"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/policy"
)

// gitProtocol is the only environment variable passed upstream: git's protocol version.
var gitProtocol = regexp.MustCompile(`^version=[0-2](:version=[0-2])*$`)

// session serves one session channel of an inner connection: an exec of a git command, and
// nothing else. Shells, PTYs, subsystems, X11 and agent forwarding are refused, audited.
func (s *Server) session(ctx context.Context, c *conn, t *target, user string, ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer ch.Close()
	protocol := ""
	for r := range reqs {
		switch r.Type {
		case "env":
			var kv struct{ Name, Value string }
			ok := ssh.Unmarshal(r.Payload, &kv) == nil && kv.Name == "GIT_PROTOCOL" && gitProtocol.MatchString(kv.Value)
			if ok {
				protocol = kv.Value
			}
			reply(r, ok)
		case "exec":
			var cmd struct{ Command string }
			if ssh.Unmarshal(r.Payload, &cmd) != nil {
				reply(r, false)
				continue
			}
			reply(r, true)
			go func() { // nothing after the command is granted
				for r := range reqs {
					reply(r, false)
				}
			}()
			s.run(ctx, c, t, user, ch, cmd.Command, protocol)
			return
		case "shell", "subsystem":
			what := "an interactive shell"
			if r.Type == "subsystem" {
				var sub struct{ Name string }
				_ = ssh.Unmarshal(r.Payload, &sub)
				what = fmt.Sprintf("the subsystem %q", sub.Name)
			}
			reply(r, true)
			reason := what + " is not allowed through the broker: only git-upload-pack, git-receive-pack and git-upload-archive"
			ev := s.event(c, t.cfg.Host, t.cfg.Port)
			ev.SSH = &audit.SSHSession{Host: t.cfg.Host, Port: t.cfg.Port, User: user}
			ev.Decision, ev.Reason = audit.Deny, reason
			s.finish(ev, "none")
			_, _ = fmt.Fprintf(ch.Stderr(), "capbroker: %s (request id %s)\r\n", reason, ev.RequestID)
			exitStatus(ch, 1)
			return
		case "pty-req", "x11-req", "auth-agent-req@openssh.com":
			reply(r, false)
			what := map[string]string{"pty-req": "a terminal (PTY)", "x11-req": "X11 forwarding", "auth-agent-req@openssh.com": "agent forwarding"}[r.Type]
			ev := s.event(c, t.cfg.Host, t.cfg.Port)
			ev.Decision, ev.Reason = audit.Deny, what+" is not allowed through the broker"
			s.finish(ev, "none")
		default:
			reply(r, false)
		}
	}
}

func reply(r *ssh.Request, ok bool) {
	if r.WantReply {
		_ = r.Reply(ok, nil)
	}
}

func exitStatus(ch ssh.Channel, code uint32) {
	_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{code}))
}

// refuseGit ends a session before git's protocol started: an ERR packet, which git prints as
// "fatal: remote error: ...", and exit status 1.
func refuseGit(ch ssh.Channel, ev *audit.Event, text string) {
	_, _ = ch.Write(pkt(fmt.Sprintf("ERR capbroker: %s (request id %s)\n", text, ev.RequestID)))
	exitStatus(ch, 1)
}

// run decides and runs one git command.
func (s *Server) run(ctx context.Context, c *conn, t *target, user string, ch ssh.Channel, line, protocol string) {
	ev := s.event(c, t.cfg.Host, t.cfg.Port)
	info := &audit.SSHSession{Host: t.cfg.Host, Port: t.cfg.Port, User: user}
	ev.SSH = info
	act := &activity{}
	in, out := &counter{act: act}, &counter{act: act}
	service := "none"
	defer func() {
		ev.BytesIn, ev.BytesOut = in.n.Load(), out.n.Load()
		s.finish(ev, service)
	}()
	cmd, err := parseCommand(line)
	if err != nil {
		ev.Decision, ev.Reason = audit.Deny, err.Error()
		_, _ = fmt.Fprintf(ch.Stderr(), "capbroker: %v (request id %s)\n", err, ev.RequestID)
		exitStatus(ch, 1)
		return
	}
	service, info.Service, info.Repository = cmd.service, cmd.service, cmd.repository
	// Every command is decided before the broker signs in upstream: a fetch or archive once
	// and for all, a push with refs [] first (a repository the policy refuses pushes to is
	// refused here, before the git host advertises its refs to the agent), then again with
	// its ref updates (gatePush).
	if !s.decide(ctx, ev, c, t, user, cmd, nil) {
		refuseGit(ch, ev, "denied: "+ev.Reason)
		return
	}
	dctx, cancel := context.WithTimeout(ctx, upstreamTimeout)
	client, err := dialUpstream(dctx, s.deps.Dial, s.deps.Vault, t)
	cancel()
	if err != nil {
		s.upstreamFailed(ch, ev, t, err)
		return
	}
	defer client.Close()
	sess, err := client.NewSession()
	if err != nil {
		s.upstreamFailed(ch, ev, t, fmt.Errorf("%w: %v", ErrUpstream, err))
		return
	}
	defer sess.Close()
	if protocol != "" {
		_ = sess.Setenv("GIT_PROTOCOL", protocol) // a host that does not accept it speaks v0
	}
	upIn, err1 := sess.StdinPipe()
	upOut, err2 := sess.StdoutPipe()
	upErr, err3 := sess.StderrPipe()
	if err := errors.Join(err1, err2, err3); err != nil {
		s.upstreamFailed(ch, ev, t, fmt.Errorf("%w: %v", ErrUpstream, err))
		return
	}
	if err := sess.Start(cmd.program + " " + sqQuote(cmd.repository)); err != nil {
		s.upstreamFailed(ch, ev, t, fmt.Errorf("%w: %v", ErrUpstream, err))
		return
	}
	done := make(chan struct{})
	defer close(done)
	var idle atomic.Bool
	go act.watch(s.cfg.IdleTimeout, done, func() {
		idle.Store(true)
		client.Close()
		ch.Close()
	})
	defer func() {
		if idle.Load() {
			ev.Error = fmt.Sprintf("closed after ssh.idle_timeout (%s) without a byte moved", s.cfg.IdleTimeout)
		}
	}()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(ch.Stderr(), upErr)
	}()
	fromAgent := countingReader{ch, in}
	toAgent := countingReader{upOut, out}
	if cmd.service == ServicePush {
		if !s.gatePush(ctx, ev, c, t, user, cmd, ch, upIn, fromAgent, toAgent) {
			_ = upIn.Close()
			_ = sess.Close()
			wg.Wait()
			return
		}
	}
	go func() {
		_, _ = io.Copy(upIn, fromAgent)
		_ = upIn.Close()
	}()
	_, _ = io.Copy(ch, toAgent)
	wg.Wait()
	code := uint32(0)
	if err := sess.Wait(); err != nil {
		code = 1
		var ee *ssh.ExitError
		if errors.As(err, &ee) {
			code = uint32(ee.ExitStatus())
		}
	}
	exitStatus(ch, code)
}

// gatePush relays the upstream's ref advertisement, reads the agent's ref updates and decides
// them before any of them, or any of the pack, is sent upstream. Refused, the agent is told
// in git's words (remote: REASON, and each ref rejected) and the upstream gets nothing.
func (s *Server) gatePush(ctx context.Context, ev *audit.Event, c *conn, t *target, user string, cmd command,
	ch ssh.Channel, upIn io.Writer, fromAgent, toAgent io.Reader) bool {
	for { // the advertisement, up to its flush
		_, raw, err := readPkt(toAgent)
		if raw != nil {
			if _, werr := ch.Write(raw); werr != nil {
				err = werr
			}
		}
		if errors.Is(err, errFlush) {
			break
		}
		if err != nil {
			// The git host ended the session (no such repository, no permission): what it
			// said went to the agent on stderr.
			ev.Decision, ev.Status, ev.Reason = audit.Deny, 502, "the git host ended the push before advertising its refs"
			exitStatus(ch, 1)
			return false
		}
	}
	p, err := readPush(fromAgent)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			ev.Decision, ev.Reason = audit.Allow, "the agent sent no ref update"
			return false
		}
		ev.Decision, ev.Reason = audit.Deny, err.Error()
		_, _ = fmt.Fprintf(ch.Stderr(), "capbroker: %v (request id %s)\n", err, ev.RequestID)
		exitStatus(ch, 1)
		return false
	}
	ev.SSH.Refs = make([]audit.SSHRef, len(p.refs))
	for i, r := range p.refs {
		ev.SSH.Refs[i] = audit.SSHRef(r)
	}
	if !s.decide(ctx, ev, c, t, user, cmd, p.refs) {
		_, _ = ch.Write(p.refusal(fmt.Sprintf("capbroker: push denied: %s (request id %s)", ev.Reason, ev.RequestID)))
		// The agent may be sending its pack: read it to the end, to nowhere, so that git
		// reads the refusal rather than failing to write.
		_, _ = io.Copy(io.Discard, fromAgent)
		exitStatus(ch, 0)
		return false
	}
	if _, err := upIn.Write(p.raw); err != nil {
		return true // the copy that follows ends too; the upstream's stderr says why
	}
	return true
}

// decide asks the policy about a git command (and a push's ref updates), recording the
// decision in ev. It reports whether the command may go on.
func (s *Server) decide(ctx context.Context, ev *audit.Event, c *conn, t *target, user string, cmd command, refs []Ref) bool {
	refList := make([]any, len(refs))
	for i, r := range refs {
		refList[i] = map[string]any{"name": r.Name, "old": r.Old, "new": r.New}
	}
	in := &policy.Input{
		Phase: policy.PhaseSSH, AgentID: c.agent.ID, Labels: c.agent.Labels, SourceIP: c.source, Mode: c.mode,
		Scheme: "ssh", Host: t.cfg.Host, Port: t.cfg.Port,
		SSH: map[string]any{
			"host": t.cfg.Host, "port": t.cfg.Port, "user": user,
			"service": cmd.service, "repository": cmd.repository, "refs": refList,
		},
	}
	d, err := s.deps.Policy.Decide(ctx, in)
	ev.PolicyRevision, ev.DecisionID = d.Revision, d.ID
	if s.auditInput.Logs() {
		ev.Input, ev.InputLevel = in.Document(false), s.auditInput
	}
	if err != nil {
		ev.Decision, ev.Status, ev.Reason, ev.Error = audit.Deny, 503, "policy_error: the policy could not decide", err.Error()
		return false
	}
	ev.Reason = d.Reason
	allow := d.Allow
	if d.Ask != nil {
		allow, ev.Reason = false, "the policy asks for approval, which git over SSH cannot wait for: "+d.Ask.Reason
	}
	if !allow && ev.Reason == "" {
		ev.Reason = policy.ReasonNoAllow
	}
	switch {
	case allow:
		ev.Decision = audit.Allow
	case s.policyMode == config.ModeMonitor:
		ev.Decision, ev.WouldDeny = audit.Allow, true
	default:
		ev.Decision = audit.Deny
		return false
	}
	return true
}

// upstreamFailed tells the agent why its command did not reach the git host, in words it
// can act on; the internal cause is in the audit event only.
func (s *Server) upstreamFailed(ch ssh.Channel, ev *audit.Event, t *target, err error) {
	ev.Error = err.Error()
	if ev.Decision == "" { // a push, not decided yet: nothing of it went upstream
		ev.Decision = audit.Deny
	}
	switch {
	case errors.Is(err, ErrHostKey):
		ev.Decision, ev.Status = audit.Deny, 502
		ev.Reason = fmt.Sprintf("host_key_mismatch: the host key of %s is not one pinned in the broker's config (ssh.upstreams known_hosts); refused, never trusted on first use", t.cfg.Host)
	case errors.Is(err, ErrUpstreamAuth):
		ev.Status = 502
		ev.Reason = fmt.Sprintf("upstream_auth_refused: %s refused the broker's certificate (expired, not yet valid, or a principal it does not accept)", t.cfg.Host)
	case errors.Is(err, ErrCredential):
		ev.Status = 503
		ev.Reason = fmt.Sprintf("credential_unavailable: the broker could not get a key to sign in to %s from Vault; try again later", t.cfg.Host)
	default:
		ev.Status = 502
		ev.Reason = fmt.Sprintf("upstream_error: the broker could not sign in to %s", t.cfg.Host)
	}
	refuseGit(ch, ev, ev.Reason)
}
