package broker

import (
	"context"
	"net"

	"github.com/capbroker/capbroker/broker/identity"
)

// SSHDoor is the git-over-SSH front door (gitssh.Server) as the transparent listener uses it:
// a redirected connection to a git host it serves is SSH, and is handed to it.
type SSHDoor interface {
	// Serves reports whether host:port is a git host the door serves over SSH.
	Serves(host string, port int) bool
	// ServeRedirected serves c, redirected to host:port by the sandbox's rules, for agent. It
	// closes c.
	ServeRedirected(ctx context.Context, c net.Conn, agent identity.Agent, host string, port int)
}

// sshDoorRef holds an SSHDoor in an atomic.Pointer.
type sshDoorRef struct{ SSHDoor }

// SetSSHDoor makes the transparent listener hand redirected SSH connections to d (transparent
// mode, docs/ssh.md): a connection, to a port listed in transparent.ports, whose address the
// sandbox's resolver gave out for the name of a git host d serves on that port.
func (b *Broker) SetSSHDoor(d SSHDoor) { b.sshDoor.Store(&sshDoorRef{d}) }

// sshFor is the SSH front door when a redirected connection to host:port is SSH, or nil.
// SSH names no host in its first bytes (no SNI, no Host header): host is the name the
// sandbox's resolver gave the address the agent dialled. A connection to another address
// is peeked as TLS or HTTP like any other, and an SSH client's is refused there.
func (b *Broker) sshFor(host string, port int) SSHDoor {
	if r := b.sshDoor.Load(); r != nil && host != "" && r.Serves(host, port) {
		return r.SSHDoor
	}
	return nil
}
