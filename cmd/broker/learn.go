package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/capbroker/capbroker/broker/budget"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/policy/learn"
)

// readFleetRecords reads the decision events a fleet recorded (fleet.learn) from the Redis
// of the config at path.
func readFleetRecords(path string) (io.Reader, error) {
	if path == "" {
		return nil, fmt.Errorf("--config is required: the broker config whose budgets.store.redis holds the events")
	}
	cfg, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	r := cfg.Budgets.Store.Redis
	if r == nil {
		return nil, fmt.Errorf("%s has no budgets.store.redis", path)
	}
	ro := budget.RedisOptions{Address: r.Address, TLS: r.TLS, KeyPrefix: r.KeyPrefix, Timeout: 5 * time.Second, Dial: ownDial(cfg)}
	if r.PasswordEnv != "" {
		ro.Password = os.Getenv(r.PasswordEnv)
	}
	st := budget.NewRedis(ro)
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return learn.ReadShared(ctx, st.Client(), st.Prefix()+"learn")
}

// cmdPolicyLearn drafts a policy from an audit log of a monitor-mode run (docs/learn.md).
func cmdPolicyLearn(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("policy learn", "policy learn --from AUDIT.jsonl|fleet [--config FILE] --out DIR [--force] [--skip-denied]", stderr)
	from := fs.String("from", "", "audit log written with audit.include_input (- for standard input), or fleet: the events every replica recorded in Redis (fleet.learn; --config names the store)")
	cfgPath := fs.String("config", "", "with --from fleet: the broker config whose budgets.store.redis holds the events")
	out := fs.String("out", "", "directory to write the draft policy into (created if missing)")
	force := fs.Bool("force", false, "overwrite a draft already in DIR")
	skipDenied := fs.Bool("skip-denied", false, "leave out requests the recording policy denied (would_deny in monitor mode)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := requireFlag(fs, "from", *from); err != nil {
		return err
	}
	if err := requireFlag(fs, "out", *out); err != nil {
		return err
	}
	var in io.Reader = os.Stdin
	switch *from {
	case "-":
	case "fleet":
		r, err := readFleetRecords(*cfgPath)
		if err != nil {
			return fmt.Errorf("policy learn: --from fleet: %w", err)
		}
		in = r
	default:
		f, err := os.Open(*from)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	d, err := learn.Read(in, learn.Options{SkipDenied: *skipDenied})
	if err != nil {
		return fmt.Errorf("policy learn: --from %s: %w", *from, err)
	}
	if err := learn.Write(*out, d, *force); err != nil {
		return fmt.Errorf("policy learn: --out %s: %w", *out, err)
	}
	var rules int
	for _, a := range d.Agents {
		rules += len(a.Connect) + len(a.Requests)
	}
	skipped := ""
	if d.Skipped > 0 {
		skipped = fmt.Sprintf(" (%d denied skipped)", d.Skipped)
	}
	fmt.Fprintf(stdout, "learn: %d events%s, %d agents, %d rules written to %s (%s, %s, %s)\n",
		d.Events, skipped, len(d.Agents), rules, *out, learn.DataFile, learn.ModuleFile, learn.TestFile)
	return nil
}
