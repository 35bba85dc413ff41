package broker

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/identity"
)

// fakeDoor serves the git hosts it is given, and records what it was handed.
type fakeDoor struct {
	hosts  map[string]int
	mu     sync.Mutex
	handed []string // "agent host:port"
	done   chan struct{}
}

func (d *fakeDoor) Serves(host string, port int) bool { p, ok := d.hosts[host]; return ok && p == port }

func (d *fakeDoor) ServeRedirected(_ context.Context, c net.Conn, a identity.Agent, host string, port int) {
	defer c.Close()
	d.mu.Lock()
	d.handed = append(d.handed, a.ID+" "+net.JoinHostPort(host, strconv.Itoa(port)))
	d.mu.Unlock()
	_, _ = c.Write([]byte("SSH-2.0-capbroker\r\n"))
	d.done <- struct{}{}
}

// TestTransparentSSH: a redirected connection to a git host's name and port goes to the SSH
// front door, for the agent its source address names; HTTPS on the same port to another name,
// and SSH to a port or name the door does not serve, do not.
func TestTransparentSSH(t *testing.T) {
	e := newTransparentEnv(t, func(c *config.Config) { c.Transparent.Ports = []int{443, 22} })
	door := &fakeDoor{hosts: map[string]int{"git.test": 22, "ssh.git.test": 443}, done: make(chan struct{}, 4)}
	e.b.SetSSHDoor(door)

	e.redirect(t, "git.test", 22)
	c, err := net.Dial("tcp", e.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	banner, _ := io.ReadAll(c)
	c.Close()
	<-door.done
	if string(banner) != "SSH-2.0-capbroker\r\n" || len(door.handed) != 1 || door.handed[0] != "dev-agent git.test:22" {
		t.Fatalf("banner %q, handed %v", banner, door.handed)
	}

	// HTTPS on 443 to a name that is not the door's: served as ever.
	e.redirect(t, "api.github.com", 443)
	resp, err := e.client().Get("https://api.github.com/user")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("HTTPS beside a git host on 443: %d", resp.StatusCode)
	}

	// SSH to a name the door does not serve: peeked, and refused as not TLS or HTTP.
	e.redirect(t, "other.test", 22)
	c, err = net.Dial("tcp", e.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte("SSH-2.0-OpenSSH_9.2\r\n"))
	_, _ = io.ReadAll(c)
	c.Close()
	ev := e.event(t, func(ev map[string]any) bool { return ev["host"] == "other.test" })
	if ev["decision"] != "deny" || !strings.HasPrefix(ev["reason"].(string), "not TLS or HTTP") {
		t.Fatalf("event: %v", ev)
	}
	door.mu.Lock()
	defer door.mu.Unlock()
	if len(door.handed) != 1 {
		t.Fatalf("handed to the door: %v", door.handed)
	}
}
