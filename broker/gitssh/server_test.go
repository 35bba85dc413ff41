package gitssh

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/crypto/ssh"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/identity"
	"github.com/capbroker/capbroker/broker/policy"
)

type denyAll struct {
	mu  sync.Mutex
	ins []*policy.Input
}

func (d *denyAll) Decide(_ context.Context, in *policy.Input) (policy.Decision, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ins = append(d.ins, in)
	return policy.Decision{ID: "d1", Reason: "not today"}, nil
}

type events struct {
	mu  sync.Mutex
	evs []*audit.Event
	ch  chan struct{}
}

func (e *events) Write(ev *audit.Event) {
	e.mu.Lock()
	e.evs = append(e.evs, ev)
	e.mu.Unlock()
	e.ch <- struct{}{}
}

func newSigner(t *testing.T) ssh.Signer {
	t.Helper()
	_, k, _ := ed25519.GenerateKey(rand.Reader)
	s, err := ssh.NewSignerFromKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// testDoor serves a front door on loopback whose policy refuses everything, and whose
// upstream is never dialled (a test fails if it is).
func testDoor(t *testing.T, agentKey ssh.PublicKey) (addr string, hostKey ssh.PublicKey, pol *denyAll, ev *events) {
	t.Helper()
	sum := sha256.Sum256([]byte("tok"))
	agents := []config.Agent{{ID: "pw", TokenSHA256: hex.EncodeToString(sum[:])}, {ID: "keyed"}}
	ids, err := identity.New(agents)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{Agents: agents, Policy: config.Policy{Mode: config.ModeEnforce}, SSH: config.SSH{
		Listen: "127.0.0.1:0", MaxSessionsPerAgent: 4, IdleTimeout: 60e9,
		AgentKeys: map[string][]string{"keyed": {string(ssh.MarshalAuthorizedKey(agentKey))}},
		Upstreams: []config.SSHUpstream{{Host: "git.test", Port: 22, User: "git",
			KnownHosts: []string{"git.test " + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(newSigner(t).PublicKey())))},
			VaultSSH:   &config.SSHVaultSign{Mount: "ssh", Role: "git"}}},
	}}
	pol, ev = &denyAll{}, &events{ch: make(chan struct{}, 16)}
	hk := newSigner(t)
	s, err := New(cfg, Deps{Agents: func() *identity.Identifier { return ids }, Policy: pol, Audit: ev, HostKey: hk, Log: zerolog.Nop(),
		Dial: func(context.Context, string, string) (net.Conn, error) {
			t.Error("the upstream was dialled")
			return nil, errors.New("no")
		}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go s.Serve(ctx, ln)
	return ln.Addr().String(), hk.PublicKey(), pol, ev
}

// jump signs in to the door and opens the inner connection to git.test:22.
func jump(t *testing.T, addr string, hostKey ssh.PublicKey, user string, auth ssh.AuthMethod) (*ssh.Client, error) {
	t.Helper()
	outer, err := ssh.Dial("tcp", addr, &ssh.ClientConfig{User: user, Auth: []ssh.AuthMethod{auth}, HostKeyCallback: ssh.FixedHostKey(hostKey)})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { outer.Close() })
	c, err := outer.Dial("tcp", "git.test:22")
	if err != nil {
		return nil, err
	}
	cc, chans, reqs, err := ssh.NewClientConn(c, "git.test:22", &ssh.ClientConfig{User: "git", HostKeyCallback: ssh.FixedHostKey(hostKey)})
	if err != nil {
		return nil, err
	}
	return ssh.NewClient(cc, chans, reqs), nil
}

func TestAgentsSignIn(t *testing.T) {
	agentKey := newSigner(t)
	addr, hostKey, pol, ev := testDoor(t, agentKey.PublicKey())
	for name, c := range map[string]struct {
		user  string
		auth  ssh.AuthMethod
		agent string
	}{
		"proxy token as password": {"pw", ssh.Password("tok"), "pw"},
		"listed key":              {"keyed", ssh.PublicKeys(agentKey), "keyed"},
	} {
		t.Run(name, func(t *testing.T) {
			client, err := jump(t, addr, hostKey, c.user, c.auth)
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			sess, err := client.NewSession()
			if err != nil {
				t.Fatal(err)
			}
			out, _ := sess.Output("git-upload-pack '/org/repo.git'")
			if !bytes.Contains(out, []byte("ERR capbroker: denied: not today")) {
				t.Errorf("output %q", out)
			}
			<-ev.ch
			ev.mu.Lock()
			last := ev.evs[len(ev.evs)-1]
			ev.mu.Unlock()
			if last.Agent != c.agent || last.Decision != audit.Deny || last.SSH.Repository != "org/repo.git" || last.SSH.Service != ServiceFetch {
				t.Errorf("audit event %+v %+v", last, last.SSH)
			}
			pol.mu.Lock()
			in := pol.ins[len(pol.ins)-1]
			pol.mu.Unlock()
			if in.Phase != policy.PhaseSSH || in.AgentID != c.agent || in.SSH["repository"] != "org/repo.git" || in.SSH["user"] != "git" {
				t.Errorf("policy input %+v", in)
			}
		})
	}
	for name, c := range map[string]struct {
		user string
		auth ssh.AuthMethod
	}{
		"wrong password":             {"pw", ssh.Password("nope")},
		"token of another agent":     {"keyed", ssh.Password("tok")},
		"key listed for another":     {"pw", ssh.PublicKeys(agentKey)},
		"unlisted key":               {"keyed", ssh.PublicKeys(newSigner(t))},
		"no credential from nowhere": {"pw", ssh.KeyboardInteractive(func(string, string, []string, []bool) ([]string, error) { return nil, nil })},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := jump(t, addr, hostKey, c.user, c.auth); err == nil {
				t.Fatal("signed in")
			}
		})
	}
}

func TestAdmitCapsSessionsPerAgent(t *testing.T) {
	s := &Server{cfg: config.SSH{MaxSessionsPerAgent: 2}, sessions: map[string]int{}}
	r1, ok1 := s.admit("a")
	_, ok2 := s.admit("a")
	_, ok3 := s.admit("a")
	_, okB := s.admit("b")
	if !ok1 || !ok2 || ok3 || !okB {
		t.Fatalf("admit: %v %v %v %v", ok1, ok2, ok3, okB)
	}
	r1()
	if _, ok := s.admit("a"); !ok {
		t.Fatal("a released session is not given back")
	}
}

func TestConnectionsToGitHostsCappedPerAgent(t *testing.T) {
	addr, hostKey, _, ev := testDoor(t, newSigner(t).PublicKey())
	var open []*ssh.Client
	for range 4 { // ssh.max_sessions_per_agent in testDoor
		c, err := jump(t, addr, hostKey, "pw", ssh.Password("tok"))
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
	}
	if _, err := jump(t, addr, hostKey, "pw", ssh.Password("tok")); err == nil || !strings.Contains(err.Error(), "ssh.max_sessions_per_agent") {
		t.Fatalf("a fifth connection: %v", err)
	}
	<-ev.ch
	if last := ev.evs[len(ev.evs)-1]; last.Decision != audit.Deny || last.Status != 429 {
		t.Errorf("audit event %+v", last)
	}
	open[0].Close()
	// The slot comes back once the broker has seen the connection end; retry until then.
	for i := 0; ; i++ {
		c, err := jump(t, addr, hostKey, "pw", ssh.Password("tok"))
		if err == nil {
			c.Close()
			break
		}
		<-ev.ch // each refusal is audited: wait for it rather than for time
		if i > 100 {
			t.Fatalf("the slot of a closed connection never came back: %v", err)
		}
	}
}

func TestIdleSessionStopped(t *testing.T) {
	var a activity
	done := make(chan struct{})
	stopped := make(chan struct{})
	go a.watch(20*time.Millisecond, done, func() { close(stopped) })
	<-stopped // nothing moved: stopped once the idle time passed
	close(done)
}
