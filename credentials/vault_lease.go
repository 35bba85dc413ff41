package credentials

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Lease is one dynamic secret issued for one user of it (a database connection): not shared,
// not cached, renewed while it is held and revoked when it is given back. Its value is a
// secret with fields (a database engine's username and password).
type Lease struct {
	v *Vault
	l *lease
}

// IssueLease reads path (a dynamic secret such as database/creds/ROLE), which makes Vault
// issue a new secret and lease. A renewable lease is renewed until Revoke or Close; Close
// revokes every lease not given back. Errors match ErrUnavailable and never hold a value.
func (v *Vault) IssueLease(ctx context.Context, path string) (*Lease, error) {
	tok, err := v.token()
	if err != nil {
		return nil, err
	}
	ref := VaultRef{Path: strings.Trim(path, "/"), Fields: true, Lease: true}
	if err := ref.Validate(); err != nil {
		return nil, &vaultError{msg: err.Error(), cause: err}
	}
	s := &leaseSource{v: v, name: ref.name(), ref: ref}
	l, err := s.issue(ctx, tok.epoch)
	if err != nil {
		return nil, err
	}
	if l.id == "" {
		return nil, &vaultError{msg: fmt.Sprintf("vault dynamic secret %s: Vault gave no lease to revoke", ref.name())}
	}
	return &Lease{v: v, l: l}, nil
}

// ID is the lease's id (for the audit: it names what to revoke, it is no secret).
func (l *Lease) ID() string { return l.l.id }

// Secret is the issued value, with its fields.
func (l *Lease) Secret() Secret { return l.l.val }

// Expires is when the lease ends unless renewed (zero: Vault gave no duration).
func (l *Lease) Expires() time.Time {
	l.l.mu.Lock()
	defer l.l.mu.Unlock()
	return l.l.expires
}

// Revoke stops renewing the lease and revokes it: the secret stops working now. A lease the
// Vault client already revoked at Close is not revoked twice.
func (l *Lease) Revoke(ctx context.Context) error {
	l.l.stopRenewing()
	v := l.v
	v.mu.Lock()
	_, tracked := v.leases[l.l]
	delete(v.leases, l.l)
	v.mu.Unlock()
	if !tracked {
		return nil
	}
	if err := v.client.Sys().RevokeWithContext(ctx, l.l.id); err != nil {
		return vaultFailure("revoking the lease of "+l.l.path, err)
	}
	return nil
}

// ReadKV reads a KV secret whole, as a secret with fields (a static database user's
// username and password).
func (v *Vault) ReadKV(ctx context.Context, ref VaultRef) (Secret, error) {
	ref.Fields, ref.Field, ref.Lease = true, "", false
	if err := ref.Validate(); err != nil {
		return Secret{}, &vaultError{msg: err.Error(), cause: err}
	}
	return v.readKV(ctx, ref)
}
