package gitssh

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/credentials"
)

// Vault is what the front door asks of Vault: sign an ephemeral key (the SSH secrets
// engine), or read a private key from KV. *credentials.Vault implements it.
type Vault interface {
	SignSSHKey(ctx context.Context, mount, role, publicKey string, principals []string, ttl time.Duration) (string, error)
	Source(name string, ref credentials.VaultRef) credentials.Source
}

// DialFunc is the broker's one outbound dialer (upstream.Dialer.DialContext): destination
// checks and the upstream proxy apply to git hosts as to every upstream.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Failures of reaching an upstream, each shown to the agent in its own words.
var (
	// ErrHostKey: the upstream's host key is not one pinned for it (unknown or changed).
	ErrHostKey = errors.New("the git host's key is not the one pinned in the broker's config")
	// ErrCredential: Vault could not sign a key or give the private key.
	ErrCredential = errors.New("credential_unavailable")
	// ErrUpstream: the git host could not be reached.
	ErrUpstream = errors.New("upstream_error")
	// ErrUpstreamAuth: the git host refused the broker's key or certificate.
	ErrUpstreamAuth = errors.New("upstream_auth_refused")
)

// target is one configured git host.
type target struct {
	cfg  config.SSHUpstream
	keys [][]byte // pinned host keys, wire form
}

func newTarget(u config.SSHUpstream) (*target, error) {
	t := &target{cfg: u}
	for i, line := range u.KnownHosts {
		_, _, key, _, _, err := ssh.ParseKnownHosts([]byte(line))
		if err != nil {
			return nil, fmt.Errorf("ssh.upstreams %s known_hosts[%d]: %w", u.Host, i, err)
		}
		t.keys = append(t.keys, key.Marshal())
	}
	return t, nil
}

// hostKey accepts exactly the pinned keys: no trust on first use, no certificate authority.
func (t *target) hostKey(_ string, _ net.Addr, key ssh.PublicKey) error {
	got := key.Marshal()
	for _, k := range t.keys {
		if bytes.Equal(k, got) {
			return nil
		}
	}
	return fmt.Errorf("%w (%s offered %s %s)", ErrHostKey, t.cfg.Host, key.Type(), ssh.FingerprintSHA256(key))
}

// dialUpstream signs in to the git host: a fresh ed25519 key signed by Vault for this
// connection alone (or the private key read from Vault KV, held in memory only), the host
// key checked against the pins. The returned client is the caller's to close.
func dialUpstream(ctx context.Context, dial DialFunc, vault Vault, t *target) (*ssh.Client, error) {
	signer, err := upstreamSigner(ctx, vault, t.cfg)
	if err != nil {
		return nil, err
	}
	addr := t.cfg.UpstreamAddr()
	conn, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: dialling %s: %v", ErrUpstream, addr, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl) // the handshake's bound; cleared below
	}
	var hostKeyErr error
	cc, chans, reqs, err := ssh.NewClientConn(conn, net.JoinHostPort(t.cfg.Host, strconv.Itoa(t.cfg.Port)), &ssh.ClientConfig{
		User: t.cfg.User,
		Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: func(h string, a net.Addr, k ssh.PublicKey) error {
			hostKeyErr = t.hostKey(h, a, k)
			return hostKeyErr
		},
		Timeout: 10 * time.Second,
	})
	if err != nil {
		conn.Close()
		if hostKeyErr != nil {
			return nil, hostKeyErr
		}
		if strings.Contains(err.Error(), "unable to authenticate") {
			return nil, fmt.Errorf("%w: signing in to %s: %v", ErrUpstreamAuth, t.cfg.Host, err)
		}
		return nil, fmt.Errorf("%w: signing in to %s: %v", ErrUpstream, t.cfg.Host, err)
	}
	_ = conn.SetDeadline(time.Time{})
	return ssh.NewClient(cc, chans, reqs), nil
}

// upstreamSigner is the key the broker signs in upstream with.
func upstreamSigner(ctx context.Context, vault Vault, u config.SSHUpstream) (ssh.Signer, error) {
	if vault == nil {
		return nil, fmt.Errorf("%w: no vault configured", ErrCredential)
	}
	if v := u.VaultSSH; v != nil {
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, err
		}
		sshPub, err := ssh.NewPublicKey(pub)
		if err != nil {
			return nil, err
		}
		certText, err := vault.SignSSHKey(ctx, v.Mount, v.Role, string(ssh.MarshalAuthorizedKey(sshPub)), v.Principals, v.TTL)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrCredential, err)
		}
		key, _, _, _, err := ssh.ParseAuthorizedKey([]byte(certText))
		if err != nil {
			return nil, fmt.Errorf("%w: vault's certificate does not parse: %v", ErrCredential, err)
		}
		cert, ok := key.(*ssh.Certificate)
		if !ok || !bytes.Equal(cert.Key.Marshal(), sshPub.Marshal()) || cert.CertType != ssh.UserCert {
			return nil, fmt.Errorf("%w: vault returned a certificate of another key", ErrCredential)
		}
		if err := checkValidity(cert, time.Now()); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrCredential, err)
		}
		signer, err := ssh.NewSignerFromKey(priv)
		if err != nil {
			return nil, err
		}
		return ssh.NewCertSigner(cert, signer)
	}
	k := u.VaultKey
	src := vault.Source("ssh "+u.Host, credentials.VaultRef{Mount: k.Mount, Path: k.Path, Field: k.Field, KVVersion: k.KVVersion})
	sec, err := src.Fetch(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCredential, err)
	}
	pem := []byte(sec.Reveal())
	signer, err := ssh.ParsePrivateKey(pem)
	clear(pem)
	if err != nil {
		// The parser's text may quote the key: never shown.
		return nil, fmt.Errorf("%w: the private key in vault (%s) does not parse", ErrCredential, strings.TrimSpace(k.Path))
	}
	return signer, nil
}

// clockSkew is how far the certificate's start may be ahead of the broker's clock.
const clockSkew = time.Minute

// checkValidity refuses a certificate Vault signed that is not valid now (a Vault whose clock
// is wrong), or that is valid for longer than the most the config allows: the git host would
// refuse the one, and the other would outlive what the operator asked for.
func checkValidity(cert *ssh.Certificate, now time.Time) error {
	if cert.ValidBefore != ssh.CertTimeInfinity && now.Unix() >= int64(cert.ValidBefore) {
		return fmt.Errorf("vault signed a certificate that expired at %s (vault's clock?)", time.Unix(int64(cert.ValidBefore), 0).UTC().Format(time.RFC3339))
	}
	if int64(cert.ValidAfter) > now.Add(clockSkew).Unix() {
		return fmt.Errorf("vault signed a certificate valid only from %s (vault's clock?)", time.Unix(int64(cert.ValidAfter), 0).UTC().Format(time.RFC3339))
	}
	if cert.ValidBefore == ssh.CertTimeInfinity || int64(cert.ValidBefore) > now.Add(config.MaxSSHCertTTL+clockSkew).Unix() {
		return fmt.Errorf("vault signed a certificate valid for longer than %s: check the role's ttl and max_ttl", config.MaxSSHCertTTL)
	}
	return nil
}
