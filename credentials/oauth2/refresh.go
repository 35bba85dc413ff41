package oauth2

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"

	"golang.org/x/oauth2"

	"github.com/capbroker/capbroker/credentials"
)

// A RefreshTokenStore keeps the refresh token of a refresh_token grant. The endpoint may
// answer a refresh with a new refresh token and invalidate the old one (rotation): the new one
// is written back before the access token that came with it is used, so a restarted broker
// starts from it.
type RefreshTokenStore interface {
	Read(ctx context.Context) (credentials.Secret, error)
	Write(ctx context.Context, rt credentials.Secret) error
}

// VaultRefreshToken keeps the refresh token in a field of a Vault KV secret. The broker's
// Vault token needs read and update on it (KV v2: <mount>/data/<path>).
type VaultRefreshToken struct {
	Vault *credentials.Vault
	Ref   credentials.VaultRef
	Name  string // the credential's name, for errors
}

// Read implements RefreshTokenStore.
func (v VaultRefreshToken) Read(ctx context.Context) (credentials.Secret, error) {
	return v.Vault.Source(v.Name, v.Ref).Fetch(ctx)
}

// Write implements RefreshTokenStore.
func (v VaultRefreshToken) Write(ctx context.Context, rt credentials.Secret) error {
	return v.Vault.WriteKV(ctx, v.Ref, rt)
}

// FileRefreshToken keeps the refresh token in a file, replaced whole (written beside it and
// renamed over it, mode 0600) when it rotates.
type FileRefreshToken struct{ Path string }

// Read implements RefreshTokenStore.
func (f FileRefreshToken) Read(ctx context.Context) (credentials.Secret, error) {
	return credentials.File{Path: f.Path}.Fetch(ctx)
}

// Write implements RefreshTokenStore.
func (f FileRefreshToken) Write(_ context.Context, rt credentials.Secret) error {
	tmp, err := os.CreateTemp(filepath.Dir(f.Path), "."+filepath.Base(f.Path)+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", f.Path, unwrapPath(err))
	}
	name := tmp.Name()
	_, werr := tmp.WriteString(rt.Reveal() + "\n")
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := firstErr(werr, serr, cerr, os.Chmod(name, 0o600), os.Rename(name, f.Path)); err != nil {
		_ = os.Remove(name)
		return fmt.Errorf("writing %s: %w", f.Path, unwrapPath(err))
	}
	return nil
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// unwrapPath drops the *PathError wrapper (its path is named by the caller).
func unwrapPath(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	if le, ok := err.(*os.LinkError); ok {
		return le.Err
	}
	return err
}

// refresh performs the refresh_token grant, under rtMu: each grant may rotate the token.
func (c *client) refresh(ctx context.Context, scopes []string, root credentials.Secret) (tok *oauth2.Token, err error) {
	c.rtMu.Lock()
	defer c.rtMu.Unlock()
	if c.rt.IsZero() {
		rt, err := c.cfg.RefreshToken.Read(ctx)
		if err != nil {
			return nil, &mintError{class: "reading the refresh token: " + err.Error()}
		}
		c.rt = rt
	}
	if c.pending {
		c.writeBack(ctx) // an earlier write-back failed: the store still has a used token
	}
	grant := func() (*oauth2.Token, error) {
		return c.request(ctx, scopes, root, url.Values{
			"grant_type":    {GrantRefreshToken},
			"refresh_token": {c.rt.Reveal()},
		})
	}
	tok, err = grant()
	if err != nil && !c.pending && code(classify(err)) == "invalid_grant" {
		// Perhaps an operator stored a new refresh token (the user consented again): read
		// the store once more and, if it holds another token, try that one.
		if rt, rerr := c.cfg.RefreshToken.Read(ctx); rerr == nil && rt.Reveal() != c.rt.Reveal() {
			c.rt = rt
			tok, err = grant()
		}
	}
	if err != nil {
		return nil, err
	}
	if tok.RefreshToken != "" && tok.RefreshToken != c.rt.Reveal() {
		// Rotated: the old one no longer works. Keep the new one before anything else, then
		// write it back before the access token is used.
		c.rt = credentials.NewSecret(tok.RefreshToken)
		c.pending = true
		c.writeBack(ctx)
	}
	return tok, nil
}

// writeBack stores the in-memory refresh token. A failure is logged and reported in Status;
// the token stays in memory and the write is tried again before the next grant. rtMu is held.
func (c *client) writeBack(ctx context.Context) {
	if err := c.cfg.RefreshToken.Write(ctx, c.rt); err != nil {
		c.writeErr = "writing the rotated refresh token back failed: " + err.Error()
		c.log.Error().Str("error", err.Error()).Msg("writing the rotated refresh token back failed; it is kept in memory and the write will be tried again")
		return
	}
	c.pending, c.writeErr = false, ""
	c.log.Info().Msg("rotated refresh token written back")
}

// writeBackError is the class of a write-back that has not succeeded yet ("" if none).
func (c *client) writeBackError() string {
	c.rtMu.Lock()
	defer c.rtMu.Unlock()
	return c.writeErr
}
