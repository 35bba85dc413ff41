package main

import (
	"context"
	"fmt"
	"net"

	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker"
	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/gitssh"
	"github.com/capbroker/capbroker/broker/policy"
)

// listenSSH opens ssh.listen, or returns nil when the SSH front door is off.
func listenSSH(cfg *config.Config) (net.Listener, error) {
	if cfg.SSH.Listen == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", cfg.SSH.Listen)
	if err != nil {
		return nil, fmt.Errorf("ssh.listen: %w", err)
	}
	return ln, nil
}

// serveSSH runs the SSH front door on ln until ctx ends. Its config is read at start: a
// change of the ssh section takes a restart.
func serveSSH(ctx context.Context, ln net.Listener, cfg *config.Config, b *broker.Broker, engine *policy.Engine,
	auditLog *audit.Logger, creds *credentialSet, metrics *broker.Metrics, log zerolog.Logger) error {
	hostKey, err := gitssh.LoadOrCreateHostKey(cfg.SSH.HostKeyFile)
	if err != nil {
		return err
	}
	deps := gitssh.Deps{
		Agents: b.Agents, Policy: engine, Audit: auditLog, Dial: b.DialUpstream, HostKey: hostKey,
		Log: log, Metrics: metrics.Registry(),
	}
	if creds.vault != nil {
		deps.Vault = creds.vault
	}
	door, err := gitssh.New(cfg, deps)
	if err != nil {
		return err
	}
	b.SetSSHDoor(door) // transparent mode: a redirected connection to a git host's SSH port
	log.Info().Str("ssh", ln.Addr().String()).Msg("listening for git over ssh")
	go func() {
		if err := door.Serve(ctx, ln); err != nil {
			log.Error().Err(err).Msg("ssh listener stopped")
		}
	}()
	return nil
}
