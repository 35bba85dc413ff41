package gitssh

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/crypto/ssh"
)

// LoadOrCreateHostKey reads the broker's SSH host key from path, or creates an ed25519 key
// there (0600) when the file does not exist, as the broker's CA is created on first run. A
// key file readable by group or others is refused, like the CA key.
func LoadOrCreateHostKey(path string) (ssh.Signer, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, err
		}
		block, err := ssh.MarshalPrivateKey(priv, "capbroker ssh host key")
		if err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("ssh.host_key_file: %w", err)
		}
		if _, err := f.Write(pem.EncodeToMemory(block)); err != nil {
			f.Close()
			return nil, fmt.Errorf("ssh.host_key_file: %w", err)
		}
		if err := f.Close(); err != nil {
			return nil, fmt.Errorf("ssh.host_key_file: %w", err)
		}
		signer, err := ssh.NewSignerFromKey(priv)
		if err != nil {
			return nil, err
		}
		// The public key beside it, for `broker agent-env` where the private key is not readable.
		if err := os.WriteFile(path+".pub", ssh.MarshalAuthorizedKey(signer.PublicKey()), 0o644); err != nil {
			return nil, fmt.Errorf("ssh.host_key_file: %w", err)
		}
		return signer, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ssh.host_key_file: %w", err)
	}
	if st, err := os.Stat(path); err == nil && st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("ssh.host_key_file %s: readable by group or others (mode %o); chmod 600 it", path, st.Mode().Perm())
	}
	s, err := ssh.ParsePrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("ssh.host_key_file %s: %w", path, err)
	}
	return s, nil
}

// ReadPublicKey is the public half of the host key at path: from path+".pub" when present
// (written beside the key when it is created), else from the key itself.
func ReadPublicKey(path string) (ssh.PublicKey, error) {
	if b, err := os.ReadFile(path + ".pub"); err == nil {
		k, _, _, _, err := ssh.ParseAuthorizedKey(b)
		return k, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s, err := ssh.ParsePrivateKey(b)
	if err != nil {
		return nil, err
	}
	return s.PublicKey(), nil
}
