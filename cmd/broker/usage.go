package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"text/tabwriter"
)

const usageUsage = `Usage: broker usage [flags]

Prints every budget's counter in its current window (GET /api/usage on the admin listener).

Flags:
  --admin URL        the broker's admin listener (default http://127.0.0.1:9090)
  --token-env VAR    variable holding the admin token (default CAPBROKER_ADMIN_TOKEN, when set)
  --ca-file, --cert-file, --key-file   for an admin listener with admin.tls (mTLS)
  --json             print the API's JSON
`

func cmdUsage(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("usage", "usage [flags]", stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usageUsage) }
	admin := fs.String("admin", "http://127.0.0.1:9090", "admin listener URL")
	tokenEnv := fs.String("token-env", "", "environment variable holding the admin token")
	caFile := fs.String("ca-file", "", "CA of the admin listener's certificate (admin.tls)")
	certFile := fs.String("cert-file", "", "client certificate (admin.tls)")
	keyFile := fs.String("key-file", "", "client key (admin.tls)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return err
		}
		return errUsage
	}
	c, err := newApprovalsClient(*admin, *tokenEnv, *caFile, *certFile, *keyFile)
	if err != nil {
		return err
	}
	out, err := c.do(http.MethodGet, "/api/usage", nil)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	printUsage(stdout, out)
	return nil
}

// printUsage prints one line per counter: budget, agent, used of limit, unit, window, reset.
func printUsage(w io.Writer, out map[string]any) {
	lines, _ := out["usage"].([]any)
	if len(lines) == 0 {
		fmt.Fprintln(w, "no budgets (the policy's data declares none)")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BUDGET\tAGENT\tUSED\tLIMIT\tREMAINING\tUNIT\tWINDOW\tRESETS")
	for _, l := range lines {
		m, _ := l.(map[string]any)
		u, _ := m["usage"].(map[string]any)
		agent, _ := m["agent"].(string)
		if agent == "" {
			agent = "(all)"
		}
		fmt.Fprintf(tw, "%v\t%s\t%v\t%v\t%v\t%v\t%v\t%v\n", m["budget"], agent, u["used"], u["limit"], u["remaining"], u["unit"], u["window"], u["resets_at"])
	}
	tw.Flush()
}
