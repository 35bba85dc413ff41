package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/capbroker/capbroker/broker/certs"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/identity"
	"github.com/capbroker/capbroker/broker/policy"
)

// cmdCheckConfig validates a config as `run` would, without serving: the config itself, the CA,
// the agents' tokens, the policies and the credential sources. It prints every problem; it
// never prints a secret value (the errors name variables, files and key paths only).
func cmdCheckConfig(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("check-config", "check-config --config FILE", stderr)
	path := fs.String("config", "", "config file (YAML)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *path == "" {
		fmt.Fprintln(stderr, "--config is required")
		fs.Usage()
		return errUsage
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return configError(*path, err)
	}
	var problems []error
	if _, err := certs.LoadCA(cfg.CA.CertFile, cfg.CA.KeyFile); err != nil {
		problems = append(problems, fmt.Errorf("ca: %w", err))
	}
	if _, err := identity.New(cfg.Agents); err != nil {
		problems = append(problems, err)
	}
	if _, err := policy.New(context.Background(), os.DirFS(cfg.Policy.Dir)); err != nil {
		problems = append(problems, fmt.Errorf("policy.dir %s: %w", cfg.Policy.Dir, err))
	}
	if store, err := credentialStore(cfg); err != nil {
		problems = append(problems, err)
	} else {
		problems = append(problems, store.Warm(context.Background())...)
	}
	if len(problems) > 0 {
		return configError(*path, errors.Join(problems...))
	}
	fmt.Fprintf(stdout, "%s: OK\n", *path)
	return nil
}
