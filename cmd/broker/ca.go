package main

import (
	"context"
	"fmt"
	"os"

	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker/certs"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/credentials"
)

// loadFileCA loads ca.cert_file and ca.key_file; nil with ca.vault_pki (startVaultCA).
func loadFileCA(cfg *config.Config) (*certs.CA, error) {
	if cfg.CA.VaultPKI != nil {
		return nil, nil
	}
	return certs.LoadCA(cfg.CA.CertFile, cfg.CA.KeyFile)
}

// startVaultCA starts the ca.vault_pki CA: an intermediate whose key is generated in memory
// and which Vault's PKI engine signs, through the credentials' Vault client (its login, its
// service dialer), renewed at half life until ctx ends.
func startVaultCA(ctx context.Context, cfg *config.Config, creds *credentialSet, log zerolog.Logger) (*certs.CA, error) {
	p := cfg.CA.VaultPKI
	if creds.vault == nil {
		return nil, fmt.Errorf("ca.vault_pki: no vault section")
	}
	return certs.StartVaultPKI(ctx, certs.VaultPKIOptions{
		Signer: vaultSigner{creds.vault}, Path: p.SignPath(), CommonName: p.CommonName, TTL: p.TTL, Log: log,
	})
}

// vaultSigner adapts the Vault client to certs.IntermediateSigner.
type vaultSigner struct{ v *credentials.Vault }

func (s vaultSigner) SignIntermediate(ctx context.Context, req certs.IntermediateRequest) (string, []string, error) {
	si, err := s.v.SignIntermediate(ctx, req.Path, req.CSR, req.CommonName, req.TTL)
	if err != nil {
		return "", nil, err
	}
	return si.Certificate, si.Chain, nil
}

// vaultRoot returns the PEM root certificate agents trust under ca.vault_pki: ca.vault_pki.root_file,
// else the root at the top of the PKI issuer's chain, read from Vault without a token.
func vaultRoot(ctx context.Context, cfg *config.Config) ([]byte, error) {
	p := cfg.CA.VaultPKI
	if p.RootFile != "" {
		b, err := os.ReadFile(p.RootFile)
		if err != nil {
			return nil, fmt.Errorf("ca.vault_pki.root_file: %w", err)
		}
		return certs.Roots(b)
	}
	creds, err := buildCredentials(cfg, zerolog.Nop(), nil)
	if err != nil {
		return nil, err
	}
	defer creds.close(ctx)
	chain, err := creds.vault.PKIChain(ctx, p.Mount, p.Issuer)
	if err != nil {
		return nil, fmt.Errorf("ca.vault_pki: %w", err)
	}
	root, err := certs.Roots([]byte(chain))
	if err != nil {
		return nil, fmt.Errorf("ca.vault_pki: the chain of %s does not reach a root Vault knows; set ca.vault_pki.root_file: %w", p.Mount, err)
	}
	return root, nil
}

// checkVaultCA has Vault sign one intermediate, for check-config; nil without ca.vault_pki.
func checkVaultCA(ctx context.Context, cfg *config.Config, creds *credentialSet) error {
	p := cfg.CA.VaultPKI
	if p == nil || creds.vault == nil {
		return nil
	}
	err := certs.CheckVaultPKI(ctx, certs.VaultPKIOptions{Signer: vaultSigner{creds.vault}, Path: p.SignPath(), CommonName: p.CommonName, TTL: p.TTL})
	if err != nil {
		return fmt.Errorf("ca.vault_pki: %w", err)
	}
	return nil
}
