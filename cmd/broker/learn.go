package main

import (
	"fmt"
	"io"
	"os"

	"github.com/capbroker/capbroker/broker/policy/learn"
)

// cmdPolicyLearn drafts a policy from an audit log of a monitor-mode run (docs/learn.md).
func cmdPolicyLearn(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("policy learn", "policy learn --from AUDIT.jsonl --out DIR [--force] [--skip-denied]", stderr)
	from := fs.String("from", "", "audit log written with audit.include_input (- for standard input)")
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
	if *from != "-" {
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
