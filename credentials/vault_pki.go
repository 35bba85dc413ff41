package credentials

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/vault/api"
)

// SignedIntermediate is a CA certificate the PKI engine signed: the certificate and the chain
// above it, as Vault returned them (PEM).
type SignedIntermediate struct {
	Certificate string
	// Chain is the issuing CA and the CAs above it (Vault's ca_chain, or issuing_ca when that
	// is empty), nearest first.
	Chain []string
}

// SignIntermediate has the PKI engine sign csrPEM as an intermediate CA that may sign leaves
// only (max_path_length 0), valid for ttl, at path: <mount>/root/sign-intermediate (the
// mount's default issuer) or <mount>/issuer/<ref>/sign-intermediate. Only the CSR goes to
// Vault; the key stays with the caller. The broker's token needs, for mount "pki":
//
//	path "pki/root/sign-intermediate" { capabilities = ["update"] }
//
// Failures match ErrUnavailable.
func (v *Vault) SignIntermediate(ctx context.Context, path string, csrPEM []byte, commonName string, ttl time.Duration) (*SignedIntermediate, error) {
	if _, err := v.token(); err != nil {
		return nil, err
	}
	path = strings.Trim(path, "/")
	s, err := v.client.Logical().WriteWithContext(ctx, path, map[string]any{
		"csr":                  string(csrPEM),
		"common_name":          commonName,
		"ttl":                  fmt.Sprintf("%ds", int64(ttl/time.Second)),
		"format":               "pem",
		"max_path_length":      0,
		"exclude_cn_from_sans": true,
	})
	if err != nil {
		var re *api.ResponseError
		if errors.As(err, &re) && re.StatusCode == http.StatusForbidden {
			v.tokenCheck()
			return nil, &vaultError{msg: fmt.Sprintf("permission denied signing the CA at %s: the broker's vault token needs update on %s", path, path), cause: err}
		}
		return nil, vaultFailure("signing the CA at "+path, err)
	}
	if s == nil || s.Data == nil {
		return nil, &vaultError{msg: "signing the CA at " + path + ": vault returned no certificate"}
	}
	out := &SignedIntermediate{}
	out.Certificate, _ = s.Data["certificate"].(string)
	if chain, ok := s.Data["ca_chain"].([]any); ok {
		for _, c := range chain {
			if p, ok := c.(string); ok && p != "" {
				out.Chain = append(out.Chain, p)
			}
		}
	}
	if issuing, _ := s.Data["issuing_ca"].(string); len(out.Chain) == 0 && issuing != "" {
		out.Chain = []string{issuing}
	}
	if out.Certificate == "" {
		return nil, &vaultError{msg: "signing the CA at " + path + ": vault returned no certificate"}
	}
	return out, nil
}

// PKIChain reads, without a token, the certificate chain of a PKI mount's issuer: its
// default issuer (<mount>/cert/ca_chain) or the issuer named (<mount>/issuer/<ref>/json).
// It returns the PEM text Vault gave, for the caller to pick the root from.
func (v *Vault) PKIChain(ctx context.Context, mount, issuer string) (string, error) {
	path := strings.Trim(mount, "/") + "/cert/ca_chain"
	if issuer != "" {
		path = strings.Trim(mount, "/") + "/issuer/" + issuer + "/json"
	}
	s, err := v.anon.Logical().ReadWithContext(ctx, path)
	if err != nil {
		return "", vaultFailure("reading the CA chain at "+path, err)
	}
	if s == nil || s.Data == nil {
		return "", &vaultError{msg: "reading the CA chain at " + path + ": vault returned nothing"}
	}
	var b strings.Builder
	if c, ok := s.Data["certificate"].(string); ok {
		b.WriteString(c + "\n")
	}
	if chain, ok := s.Data["ca_chain"].([]any); ok {
		for _, c := range chain {
			if p, ok := c.(string); ok {
				b.WriteString(p + "\n")
			}
		}
	}
	return b.String(), nil
}
