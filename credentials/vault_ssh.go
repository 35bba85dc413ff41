package credentials

import (
	"context"
	"strings"
	"time"
)

// SignSSHKey has Vault's SSH secrets engine at mount sign publicKey (an authorized_keys line)
// as a user certificate of role, for principals and ttl, and returns the certificate (an
// authorized_keys line). The private key never reaches Vault. The broker's token needs, for
// mount "ssh" and role "git":
//
//	path "ssh/sign/git" { capabilities = ["update"] }
//
// Failures match ErrUnavailable.
func (v *Vault) SignSSHKey(ctx context.Context, mount, role, publicKey string, principals []string, ttl time.Duration) (string, error) {
	if _, err := v.token(); err != nil {
		return "", err
	}
	path := strings.Trim(mount, "/") + "/sign/" + role
	s, err := v.client.Logical().WriteWithContext(ctx, path, map[string]any{
		"public_key":       publicKey,
		"cert_type":        "user",
		"valid_principals": strings.Join(principals, ","),
		"ttl":              ttl.String(),
	})
	if err != nil {
		return "", vaultFailure("signing an ssh key with "+path, err)
	}
	if s == nil || s.Data == nil {
		return "", &vaultError{msg: "signing an ssh key with " + path + ": vault returned no certificate"}
	}
	cert, _ := s.Data["signed_key"].(string)
	if cert == "" {
		return "", &vaultError{msg: "signing an ssh key with " + path + ": vault returned no certificate"}
	}
	return cert, nil
}
