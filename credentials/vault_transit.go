package credentials

import (
	"context"
	"encoding/base64"
	"strings"
)

// TransitSignRS256 signs msg with the RSA key named key in the transit engine at mount
// (RSASSA-PKCS1-v1_5 with SHA-256, the JWT algorithm RS256) and returns the raw signature.
// The key never leaves Vault. The broker's token needs, for mount "transit" and key
// "github-app":
//
//	path "transit/sign/github-app/sha2-256" { capabilities = ["update"] }
//
// Failures match ErrUnavailable.
func (v *Vault) TransitSignRS256(ctx context.Context, mount, key string, msg []byte) ([]byte, error) {
	if _, err := v.token(); err != nil {
		return nil, err
	}
	path := strings.Trim(mount, "/") + "/sign/" + key + "/sha2-256"
	s, err := v.client.Logical().WriteWithContext(ctx, path, map[string]any{
		"input":               base64.StdEncoding.EncodeToString(msg),
		"signature_algorithm": "pkcs1v15",
	})
	if err != nil {
		return nil, vaultFailure("signing with "+path, err)
	}
	if s == nil || s.Data == nil {
		return nil, &vaultError{msg: "signing with " + path + ": vault returned no signature"}
	}
	sig, _ := s.Data["signature"].(string)
	// "vault:v<N>:<base64>": the key version, then the signature.
	parts := strings.SplitN(sig, ":", 3)
	if len(parts) != 3 || parts[0] != "vault" {
		return nil, &vaultError{msg: "signing with " + path + ": vault returned a signature in an unknown form"}
	}
	raw, err := base64.StdEncoding.DecodeString(parts[2])
	if err != nil || len(raw) == 0 {
		return nil, &vaultError{msg: "signing with " + path + ": vault returned a signature in an unknown form"}
	}
	return raw, nil
}
