package broker

import (
	"context"
	"net"

	"github.com/capbroker/capbroker/broker/identity"
)

// SSHDoor is the git-over-SSH front door (gitssh.Server) as the transparent listener uses it:
// a redirected connection to a port it serves is SSH, and is handed to it.
type SSHDoor interface {
	// Serves reports whether port is the SSH port of a git host the door serves.
	Serves(port int) bool
	// ServeRedirected serves c, redirected to host:port by the sandbox's rules, for agent. It
	// closes c.
	ServeRedirected(ctx context.Context, c net.Conn, agent identity.Agent, host string, port int)
}

// sshDoorRef holds an SSHDoor in an atomic.Pointer.
type sshDoorRef struct{ SSHDoor }

// SetSSHDoor makes the transparent listener hand redirected SSH connections to d (transparent
// mode, docs/ssh.md): a connection to a port listed in transparent.ports on which d serves a
// git host.
func (b *Broker) SetSSHDoor(d SSHDoor) { b.sshDoor.Store(&sshDoorRef{d}) }

// sshFor is the SSH front door when a redirected connection to port is SSH, or nil.
func (b *Broker) sshFor(port int) SSHDoor {
	if r := b.sshDoor.Load(); r != nil && r.Serves(port) {
		return r.SSHDoor
	}
	return nil
}

// serveSSHRedirected hands an admitted redirected SSH connection to the front door. SSH names
// no host in its first bytes (no SNI, no Host header): the host is the name the sandbox's
// resolver gave the address the agent dialled, and a connection to any other address is
// refused.
func (b *Broker) serveSSHRedirected(ctx context.Context, door SSHDoor, ac *admittedConn, flow Flow, agent identity.Agent) {
	defer ac.release()
	if flow.Host == "" {
		b.RefuseFlow(flow, "SSH names no host, and the address is not one the sandbox's resolver answered: use the git host's name")
		_ = ac.Close()
		return
	}
	door.ServeRedirected(ctx, ac, agent, flow.Host, int(flow.Dest.Port()))
}
