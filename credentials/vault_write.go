package credentials

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"

	"github.com/hashicorp/vault/api"
)

// WriteKV sets one field of a KV secret to value, keeping the secret's other fields. It is for
// values the broker itself must keep, such as a rotated OAuth2 refresh token. On KV v2 the
// write is a check-and-set against the version just read, so a concurrent change by someone
// else fails the write instead of being overwritten. The broker's token needs read and update
// (create, if the secret may not exist yet) on <mount>/data/<path> (KV v1: <mount>/<path>).
// Errors match ErrUnavailable and never hold the value.
func (v *Vault) WriteKV(ctx context.Context, ref VaultRef, value Secret) error {
	if err := ref.Validate(); err != nil {
		return &vaultError{msg: err.Error(), cause: err}
	}
	if ref.Lease {
		return &vaultError{msg: fmt.Sprintf("vault secret %s is a lease and cannot be written", ref.name())}
	}
	if value.IsZero() {
		return &vaultError{msg: fmt.Sprintf("writing vault secret %s: empty value", ref.name())}
	}
	if _, err := v.token(); err != nil {
		return err
	}
	sec, err := v.read(ctx, ref)
	if err != nil {
		return err
	}
	data := map[string]any{}
	version := json.Number("0") // KV v2: 0 means "must not exist yet"
	if sec != nil {
		if ref.KVVersion == 1 {
			maps.Copy(data, sec.Data)
		} else {
			if d, ok := sec.Data["data"].(map[string]any); ok {
				maps.Copy(data, d)
			}
			if md, ok := sec.Data["metadata"].(map[string]any); ok {
				if n, ok := md["version"].(json.Number); ok {
					version = n
				}
			}
		}
	}
	data[ref.Field] = value.Reveal()
	body := data
	if ref.KVVersion != 1 {
		body = map[string]any{"data": data, "options": map[string]any{"cas": version}}
	}
	if _, err := v.client.Logical().WriteWithContext(ctx, ref.apiPath(), body); err != nil {
		var re *api.ResponseError
		if errors.As(err, &re) && re.StatusCode == http.StatusForbidden {
			v.tokenCheck()
			return &vaultError{msg: fmt.Sprintf("permission denied writing vault secret %s: the broker's vault token needs update on %s",
				ref.name(), ref.apiPath()), cause: err}
		}
		return vaultFailure("writing vault secret "+ref.name(), err)
	}
	return nil
}
