package gitssh

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/crypto/ssh"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/identity"
)

// redirectDoor is a front door for ServeRedirected: git.test:22, a policy refusing all, an
// upstream never dialled.
func redirectDoor(t *testing.T) (*Server, identity.Agent, ssh.PublicKey, *denyAll, *events) {
	t.Helper()
	agents := []config.Agent{{ID: "sandboxed", Addresses: []string{"10.0.0.2/32"}}}
	ids, err := identity.New(agents)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{Agents: agents, Policy: config.Policy{Mode: config.ModeEnforce}, SSH: config.SSH{
		Listen: "127.0.0.1:0", MaxSessionsPerAgent: 1, IdleTimeout: 60e9,
		Upstreams: []config.SSHUpstream{{Host: "git.test", Port: 22, User: "git",
			KnownHosts: []string{"git.test " + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(newSigner(t).PublicKey())))},
			VaultSSH:   &config.SSHVaultSign{Mount: "ssh", Role: "git"}}},
	}}
	pol, ev := &denyAll{}, &events{ch: make(chan struct{}, 16)}
	hk := newSigner(t)
	s, err := New(cfg, Deps{Agents: func() *identity.Identifier { return ids }, Policy: pol, Audit: ev, HostKey: hk, Log: zerolog.Nop(),
		Dial: func(context.Context, string, string) (net.Conn, error) {
			t.Error("the upstream was dialled")
			return nil, errors.New("no")
		}})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := ids.Lookup("sandboxed")
	return s, a, hk.PublicKey(), pol, ev
}

func (e *events) next(t *testing.T) *audit.Event {
	t.Helper()
	select {
	case <-e.ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no audit event")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.evs[len(e.evs)-1]
}

// TestServeRedirected: a redirected connection is answered as the git host it was sent to,
// with the broker's host key and no sign-in of its own, decided and audited as transparent.
func TestServeRedirected(t *testing.T) {
	s, agent, hostKey, pol, ev := redirectDoor(t)
	if !s.Serves("git.test", 22) || !s.Serves("GIT.test.", 22) || s.Serves("git.test", 443) || s.Serves("evil.test", 22) {
		t.Fatal("Serves: want git.test:22 only")
	}
	agentSide, brokerSide := tcpPair(t)
	done := make(chan struct{})
	go func() { defer close(done); s.ServeRedirected(t.Context(), brokerSide, agent, "Git.Test.", 22) }()
	cc, chans, reqs, err := ssh.NewClientConn(agentSide, "git.test:22", &ssh.ClientConfig{User: "git", HostKeyCallback: ssh.FixedHostKey(hostKey)})
	if err != nil {
		t.Fatal(err)
	}
	client := ssh.NewClient(cc, chans, reqs)
	defer client.Close()
	sess, err := client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	out, _ := sess.CombinedOutput("git-upload-pack 'org/repo.git'")
	if !strings.Contains(string(out), "capbroker: denied: not today") {
		t.Errorf("the agent read %q", out)
	}
	e := ev.next(t)
	if e.Mode != audit.ModeTransparent || e.Agent != "sandboxed" || e.Decision != audit.Deny || e.SSH == nil || e.SSH.Service != ServiceFetch {
		t.Errorf("audit event %+v", e)
	}
	pol.mu.Lock()
	if len(pol.ins) != 1 || pol.ins[0].Mode != audit.ModeTransparent || pol.ins[0].Host != "git.test" {
		t.Errorf("policy input %+v", pol.ins)
	}
	pol.mu.Unlock()
	client.Close()
	<-done

	// A name that is not a git host the door serves: refused, audited, closed unanswered.
	agentSide, brokerSide = tcpPair(t)
	go s.ServeRedirected(t.Context(), brokerSide, agent, "evil.test", 22)
	if _, err := io.ReadAll(agentSide); err != nil {
		t.Fatal(err)
	}
	if e := ev.next(t); e.Decision != audit.Deny || e.Host != "evil.test" || e.Mode != audit.ModeTransparent ||
		!strings.Contains(e.Reason, "not a git host") {
		t.Errorf("audit event %+v", e)
	}
}

// tcpPair is both ends of a loopback TCP connection (net.Pipe does not buffer: both SSH
// sides write their version at once).
func tcpPair(t *testing.T) (agentSide, brokerSide net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	agentSide, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	brokerSide, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agentSide.Close(); brokerSide.Close() })
	return agentSide, brokerSide
}
