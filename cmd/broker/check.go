package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/identity"
	"github.com/capbroker/capbroker/broker/policy"
)

// cmdCheckConfig validates a config as `run` would, without serving: the config itself, the CA,
// the agents' tokens, the policies (compiled with the broker's capabilities, the decision's
// shape type-checked; a bundle is downloaded once and verified) and the credential sources.
// It prints every problem; it never prints a secret value (the errors name variables, files
// and key paths only).
func cmdCheckConfig(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("check-config", "check-config --config FILE", stderr)
	path := fs.String("config", "", "config file (YAML)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := requireFlag(fs, "config", *path); err != nil {
		return err
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return configError(*path, err)
	}
	var problems []error
	if _, err := loadFileCA(cfg); err != nil {
		problems = append(problems, fmt.Errorf("ca: %w", err))
	}
	if _, err := identity.New(cfg.Agents); err != nil {
		problems = append(problems, err)
	}
	if _, err := cfg.Admin.Token(); err != nil {
		problems = append(problems, err)
	}
	problems = append(problems, checkPolicy(cfg)...)
	warnPolicy(cfg, stderr)
	if creds, err := buildCredentials(cfg, zerolog.Nop(), nil); err != nil {
		problems = append(problems, err)
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		problems = append(problems, creds.check(ctx)...)
		if err := checkVaultCA(ctx, cfg, creds); err != nil {
			problems = append(problems, err)
		}
		_ = creds.close(ctx)
		cancel()
	}
	if len(problems) > 0 {
		return configError(*path, errors.Join(problems...))
	}
	fmt.Fprintf(stdout, "%s: OK\n", *path)
	return nil
}

// checkPolicy compiles and type-checks the policy directory, or downloads, verifies and
// checks the bundle. Each problem names its key path and, for Rego and data, its file:line.
func checkPolicy(cfg *config.Config) []error {
	ctx := context.Background()
	var errs []error
	if b := cfg.Policy.Bundle; b != nil {
		o, err := bundleOptions(b, ownDial(cfg))
		if err != nil {
			return []error{err}
		}
		for _, err := range policy.CheckBundle(ctx, o) {
			errs = append(errs, fmt.Errorf("policy.bundle: %w", err))
		}
		return errs
	}
	if st, err := os.Stat(cfg.Policy.Dir); err != nil || !st.IsDir() {
		return []error{fmt.Errorf("policy.dir: %s is not a directory", cfg.Policy.Dir)}
	}
	for _, err := range policy.Check(ctx, os.DirFS(cfg.Policy.Dir), cfg.Policy.Dir) {
		errs = append(errs, fmt.Errorf("policy.dir: %w", err))
	}
	return errs
}
