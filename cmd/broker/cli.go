package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/capbroker/capbroker/broker/certs"
)

// version and commit are set at build time with
// -ldflags "-X main.version=v1.2.3 -X main.commit=abc1234" (the Dockerfile's build args).
var version, commit = "dev", ""

const usage = `broker: an egress broker for AI agents (see README.md)

Usage:
  broker dev [--listen ADDR] [--admin-listen ADDR]     run on the embedded default, no Vault needed
  broker run --config FILE [--listen ADDR] [--admin-listen ADDR]
  broker ca init --out DIR [--force]                  write ca.crt (0644) and ca.key (0600)
  broker check-config --config FILE                   validate config and compile policies
  broker policy test [DIR]                            run the *_test.rego tests (default ./policies)
  broker policy eval --policies DIR --input FILE      print the decision for one policy input
  broker policy replay --policies DIR --log FILE      re-decide audit events; exit 1 if any changed
  broker policy learn --from FILE --out DIR          draft a policy from a monitor-mode audit log
  broker agent-env --agent ID [--config FILE] [--proxy HOST:PORT] [--write-ca FILE] [--format sh|env]
                                                      print an agent shell's proxy, CA and SDK variables
                                                      (--print-ca: the certificate agents trust, alone)
  broker healthcheck [--admin ADDR] [--path /readyz] exit 0 when the broker's admin endpoint answers 200
  broker approvals list|approve ID|deny ID|grants|revoke ID [--admin URL] [--token-env VAR]
                                                      decide on requests held for approval
  broker usage [--admin URL] [--token-env VAR] [--json]  every budget's counter now
  broker transparent rules [--sandbox-cidr CIDR]... [--config FILE] [--hook prerouting|output]
         [--apply | --remove]                         print, apply or remove transparent mode's nftables rules
  broker version | --version
`

// runCLI dispatches a command line and returns the exit code.
func runCLI(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch cmd, rest := args[0], args[1:]; cmd {
	case "dev":
		err = cmdDev(rest, stdout, stderr)
	case "run":
		err = cmdRun(rest, stdout, stderr)
	case "ca":
		err = cmdCA(rest, stdout, stderr)
	case "check-config":
		err = cmdCheckConfig(rest, stdout, stderr)
	case "policy":
		err = cmdPolicy(rest, stdout, stderr)
	case "healthcheck":
		err = cmdHealthcheck(rest, stdout, stderr)
	case "agent-env":
		err = cmdAgentEnv(rest, stdout, stderr)
	case "approvals":
		err = cmdApprovals(rest, stdout, stderr)
	case "usage":
		err = cmdUsage(rest, stdout, stderr)
	case "transparent":
		err = cmdTransparent(rest, stdout, stderr)
	case "version", "--version", "-version":
		cmdVersion(stdout)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "broker: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	default:
		fmt.Fprintf(stderr, "broker: %v\n", err)
		return 1
	}
}

var errUsage = errors.New("usage")

// newFlags makes a flag set that reports its own errors and usage on stderr.
func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: broker %s\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "unexpected arguments: %s\n", strings.Join(fs.Args(), " "))
		fs.Usage()
		return errUsage
	}
	return nil
}

// requireFlag reports a missing required flag with the command's usage.
func requireFlag(fs *flag.FlagSet, name, value string) error {
	if value != "" {
		return nil
	}
	fmt.Fprintf(fs.Output(), "--%s is required\n", name)
	fs.Usage()
	return errUsage
}

func cmdCA(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "init" {
		fmt.Fprint(stderr, "Usage: broker ca init --out DIR [--force]\n")
		return errUsage
	}
	fs := newFlags("ca init", "ca init --out DIR [--force]", stderr)
	out := fs.String("out", "", "directory to write ca.crt and ca.key into")
	force := fs.Bool("force", false, "overwrite an existing CA")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	if err := requireFlag(fs, "out", *out); err != nil {
		return err
	}
	if err := certs.WriteCA(*out, *force); err != nil {
		if errors.Is(err, certs.ErrExists) {
			return fmt.Errorf("%w (use --force to replace it; agents trusting the old CA must then trust the new one)", err)
		}
		return err
	}
	fmt.Fprintf(stdout, "wrote %s/ca.crt and %s/ca.key\n", *out, *out)
	return nil
}

// cmdVersion prints "capbroker v1.2.3 (commit abc1234, go 1.26.1)".
func cmdVersion(stdout io.Writer) {
	fmt.Fprintf(stdout, "capbroker %s (commit %s, go %s)\n", version, buildCommit(), strings.TrimPrefix(runtime.Version(), "go"))
}

// buildCommit is the commit set at build time, else the one Go recorded from the checkout.
func buildCommit() string {
	if commit != "" {
		return commit
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}
