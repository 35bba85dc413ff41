package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/tester"

	"github.com/capbroker/capbroker/broker"
	"github.com/capbroker/capbroker/broker/audit/ocsf"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/inject"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/internal/svcdial"
)

const policyUsage = `Usage:
  broker policy test [-v] [--run REGEX] [DIR]              run the *_test.rego tests in DIR (default ./policies)
  broker policy eval [--policies DIR] [--config FILE] --input FILE
                                                          print the decision for one policy input
  broker policy eval [--policies DIR] [--config FILE] --agent ID METHOD URL
                                                          the same for a request given on the command line
                                                          (CONNECT host:port for the connect phase)
  broker policy replay [--policies DIR] --log FILE [--reasons]
                                                          re-decide audit events; exit 1 if any changed
  broker policy learn --from FILE --out DIR [--force] [--skip-denied]
                                                          draft a policy from a monitor-mode audit log
FILE may be - for standard input.
`

// cmdPolicy is the policy authoring toolbox: test, eval, replay, learn.
func cmdPolicy(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, policyUsage)
		return errUsage
	}
	switch args[0] {
	case "test":
		return cmdPolicyTest(args[1:], stdout, stderr)
	case "eval":
		return cmdPolicyEval(args[1:], stdout, stderr)
	case "replay":
		return cmdPolicyReplay(args[1:], stdout, stderr)
	case "learn":
		return cmdPolicyLearn(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, policyUsage)
		return nil
	default:
		fmt.Fprintf(stderr, "broker policy: unknown command %q\n\n%s", args[0], policyUsage)
		return errUsage
	}
}

// parseWithArgs parses flags that may come before or after positional arguments
// (`policy test DIR -v` as well as `policy test -v DIR`) and returns the positional ones.
func parseWithArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, errUsage
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func cmdPolicyTest(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("policy test", "policy test [-v] [--run REGEX] [DIR]", stderr)
	verbose := fs.Bool("v", false, "print every test, not only failures (like opa test -v)")
	run := fs.String("run", "", "run only the tests whose names match this regular expression")
	timeout := fs.Duration("timeout", 5*time.Second, "time limit for each test")
	pos, err := parseWithArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		fmt.Fprintf(stderr, "unexpected arguments: %s\n", strings.Join(pos[1:], " "))
		fs.Usage()
		return errUsage
	}
	dir := "policies"
	if len(pos) == 1 {
		dir = pos[0]
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return fmt.Errorf("policy test: %s is not a directory", dir)
	}
	ch, err := policy.RunTests(context.Background(), os.DirFS(dir), dir, policy.TestOptions{Run: *run, Timeout: *timeout, Trace: true})
	if err != nil {
		return fmt.Errorf("policy test %s:\n%w", dir, indent(err))
	}
	// Tests run in parallel; report them in file and line order, and count the failures
	// for the exit code.
	var results []*tester.Result
	var failed int
	for r := range ch {
		results = append(results, r)
		if r.Fail || r.Error != nil {
			failed++
		}
	}
	total := len(results)
	sort.SliceStable(results, func(i, j int) bool {
		a, b := results[i].Location, results[j].Location
		if a == nil || b == nil {
			return b != nil
		}
		return a.File < b.File || a.File == b.File && a.Row < b.Row
	})
	counted := make(chan *tester.Result, len(results))
	for _, r := range results {
		counted <- r
	}
	close(counted)
	rep := tester.PrettyReporter{Output: stdout, Verbose: *verbose, FailureLine: true}
	if err := rep.Report(counted); err != nil {
		return err
	}
	switch {
	case total == 0 && *run != "":
		return fmt.Errorf("policy test: no test matches --run %q", *run)
	case total == 0:
		return errors.New("policy test: no tests found (rules named test_* in *_test.rego files)")
	case failed > 0:
		return fmt.Errorf("policy test: %d of %d tests failed", failed, total)
	}
	return nil
}

// indent puts every line of an error's text under a two-space indent.
func indent(err error) error {
	return errors.New("  " + strings.ReplaceAll(err.Error(), "\n", "\n  "))
}

// evalOutput is what `policy eval` prints: the decision as the broker applies it.
type evalOutput struct {
	Allow          bool     `json:"allow"`
	Reason         string   `json:"reason"`
	Credentials    []string `json:"credentials"`
	Intercept      bool     `json:"intercept"`
	Ask            *evalAsk `json:"ask,omitempty"`
	PolicyRevision string   `json:"policy_revision"`
}

type evalAsk struct {
	Reason  string   `json:"reason"`
	Timeout string   `json:"timeout,omitempty"`
	Scopes  []string `json:"scopes"`
}

func cmdPolicyEval(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("policy eval", "policy eval [--policies DIR] [--config FILE] (--input FILE | --agent ID METHOD URL)", stderr)
	dir := fs.String("policies", "policies", "policy directory (Rego and data files; default: --config's policy.dir, else ./policies)")
	inputFile := fs.String("input", "", "the policy input, a JSON file (- for standard input)")
	cfgFile := fs.String("config", "", "broker config: input.credentials and the agent's labels come from it, as the broker would set them")
	agent := fs.String("agent", "", "agent id, for a request given as METHOD URL")
	pos, err := parseWithArgs(fs, args)
	if err != nil {
		return err
	}
	var cfg *config.Config
	if *cfgFile != "" {
		if cfg, err = config.Load(*cfgFile); err == nil {
			err = errors.Join(cfg.Validate()...)
		}
		if err != nil {
			return configError(*cfgFile, err)
		}
	}
	var input any
	switch {
	case *inputFile != "" && len(pos) > 0:
		fmt.Fprintln(stderr, "give either --input FILE or METHOD URL, not both")
		fs.Usage()
		return errUsage
	case *inputFile != "":
		b, err := readInput(*inputFile)
		if err != nil {
			return err
		}
		if input, err = decodeJSON(b); err != nil {
			return fmt.Errorf("--input %s: %w", *inputFile, err)
		}
		if _, ok := input.(map[string]any); !ok {
			return fmt.Errorf("--input %s: the policy input must be a JSON object (see README, Writing and testing policies)", *inputFile)
		}
	case len(pos) == 2:
		if *agent == "" {
			fmt.Fprintln(stderr, "--agent is required with METHOD URL")
			fs.Usage()
			return errUsage
		}
		if input, err = requestInput(*agent, pos[0], pos[1]); err != nil {
			return err
		}
	default:
		fmt.Fprintln(stderr, "--input is required (or --agent ID METHOD URL)")
		fs.Usage()
		return errUsage
	}
	if cfg != nil {
		bindConfig(input.(map[string]any), cfg)
		// The policy the broker would run: the config's, unless --policies names another.
		if !flagSet(fs, "policies") {
			if cfg.Policy.Bundle != nil {
				return fmt.Errorf("--config %s: the policy is a bundle (policy.bundle), which eval does not fetch: give --policies DIR", *cfgFile)
			}
			*dir = cfg.Policy.Dir
		}
	}
	ctx := context.Background()
	engine, err := policy.NewDir(ctx, *dir)
	if err != nil {
		return fmt.Errorf("--policies %s:\n%w", *dir, indent(err))
	}
	d, err := engine.DecideValue(ctx, input)
	if err != nil {
		return fmt.Errorf("%w (the broker answers 503 policy_error)", err)
	}
	d = policy.Effective(input, d)
	out := evalOutput{Allow: d.Allow, Reason: d.Reason, Credentials: d.Credentials, Intercept: d.Intercept, PolicyRevision: d.Revision}
	if out.Credentials == nil {
		out.Credentials = []string{}
	}
	if a := d.Ask; a != nil {
		out.Ask = &evalAsk{Reason: a.Reason, Scopes: a.Scopes}
		if a.Timeout > 0 {
			out.Ask.Timeout = a.Timeout.String()
		}
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(out)
}

// requestInput builds the policy input of a request given on the command line, as the broker
// builds it: "GET https://host/path?q=1" (request phase, no headers, no body) or
// "CONNECT host:port" (connect phase).
// flagSet reports whether the command line gave the flag.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func requestInput(agent, method, target string) (map[string]any, error) {
	method = strings.ToUpper(method)
	in := policy.Input{AgentID: agent, SourceIP: "127.0.0.1", Method: method, Headers: map[string]string{}}
	if method == http.MethodConnect {
		host, port, err := net.SplitHostPort(target)
		n, perr := strconv.Atoi(port)
		if err != nil || perr != nil || host == "" {
			return nil, fmt.Errorf("CONNECT %s: want host:port", target)
		}
		in.Phase, in.Host, in.Port = policy.PhaseConnect, strings.ToLower(host), n
		return in.Document(true), nil
	}
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return nil, fmt.Errorf("%s: want an absolute http:// or https:// URL", target)
	}
	in.Phase, in.Scheme, in.Host = policy.PhaseRequest, u.Scheme, strings.ToLower(u.Hostname())
	in.Port = map[string]int{"http": 80, "https": 443}[u.Scheme]
	if p := u.Port(); p != "" {
		if in.Port, err = strconv.Atoi(p); err != nil {
			return nil, fmt.Errorf("%s: bad port", target)
		}
	}
	if in.RawPath, in.Path, err = broker.RequestPath(u); err != nil {
		return nil, fmt.Errorf("%s: the broker refuses this path: %w", target, err)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("%s: bad query: %w", target, err)
	}
	in.Query = q
	return in.Document(true), nil
}

// bindConfig sets what the broker takes from its config: input.credentials (the configured
// credentials bound to the request's host) and the agent's labels. Without it a granted
// credential is reported as not bound to the host, as the input names none.
func bindConfig(input map[string]any, cfg *config.Config) {
	req, _ := input["request"].(map[string]any)
	host, _ := req["host"].(string)
	names := []any{}
	for _, n := range inject.NewSet(cfg.Credentials).Matching(strings.ToLower(host)) {
		names = append(names, n)
	}
	input["credentials"] = names
	ag, _ := input["agent"].(map[string]any)
	if ag == nil {
		return
	}
	id, _ := ag["id"].(string)
	for _, a := range cfg.Agents {
		if a.ID == id {
			labels := map[string]any{}
			for k, v := range a.Labels {
				labels[k] = v
			}
			ag["labels"] = labels
		}
	}
}

func readInput(name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(name)
}

// decodeJSON decodes one JSON value, keeping numbers exact.
func decodeJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("more than one JSON value")
	}
	return v, nil
}

// outcome is one decision as replay compares it.
type outcome struct {
	kind        string // "allow", "deny" or "error"
	reason      string
	credentials []string
}

func (o outcome) String() string {
	switch o.kind {
	case "allow":
		if len(o.credentials) > 0 {
			return "allow [" + strings.Join(o.credentials, ",") + "]"
		}
		return "allow"
	default:
		return fmt.Sprintf("%s %q", o.kind, o.reason)
	}
}

// changed reports whether two outcomes differ: in kind, in the credentials an allowed
// request carries (request phase only: the audit event of a CONNECT names none), and, with
// reasons, in the reason of a deny.
func changed(old, cur outcome, phase string, reasons bool) bool {
	if old.kind != cur.kind {
		return true
	}
	switch old.kind {
	case "allow":
		if phase != policy.PhaseConnect {
			a, b := slices.Clone(old.credentials), slices.Clone(cur.credentials)
			slices.Sort(a)
			slices.Sort(b)
			return !slices.Equal(a, b)
		}
	case "deny":
		return reasons && old.reason != cur.reason
	}
	return false
}

// auditLine is what replay reads from an audit event (CONTRACT §6).
type auditLine struct {
	Msg         string   `json:"msg"`
	Message     string   `json:"message"` // the name operational log lines use`
	RequestID   string   `json:"request_id"`
	Agent       string   `json:"agent"`
	Phase       string   `json:"phase"`
	Method      string   `json:"method"`
	Host        string   `json:"host"`
	Path        string   `json:"path"`
	Decision    string   `json:"decision"`
	Reason      string   `json:"reason"`
	Credentials []string `json:"credentials"`
	WouldDeny   bool     `json:"would_deny"`
	Error       string   `json:"error"`
	Input       any      `json:"input"`
}

// recorded is the decision an audit event records: deny for a monitor-mode would_deny,
// error for a policy evaluation failure.
func (ev *auditLine) recorded() outcome {
	switch {
	case strings.HasPrefix(ev.Error, policy.ErrEvaluation.Error()):
		return outcome{kind: "error", reason: ev.Reason}
	case ev.Decision == "allow" && !ev.WouldDeny:
		return outcome{kind: "allow", credentials: ev.Credentials}
	default:
		return outcome{kind: "deny", reason: ev.Reason}
	}
}

func cmdPolicyReplay(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("policy replay", "policy replay [--policies DIR] --log FILE [--reasons]", stderr)
	dir := fs.String("policies", "policies", "candidate policy directory (Rego and data files)")
	logFile := fs.String("log", "", "audit log written with audit.include_input: full (- for standard input)")
	reasons := fs.Bool("reasons", false, "also count a deny whose reason changed as a change")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := requireFlag(fs, "log", *logFile); err != nil {
		return err
	}
	ctx := context.Background()
	engine, err := policy.NewDir(ctx, *dir)
	if err != nil {
		return fmt.Errorf("--policies %s:\n%w", *dir, indent(err))
	}
	var in io.Reader = os.Stdin
	if *logFile != "-" {
		f, err := os.Open(*logFile)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	var decided, nChanged, noInput, ignored int
	r := bufio.NewReader(in)
	for {
		line, err := r.ReadBytes('\n')
		if native, ok := ocsf.Native(line); ok { // a log written with audit.format: ocsf
			line = native
		}
		if len(bytes.TrimSpace(line)) > 0 {
			var ev auditLine
			dec := json.NewDecoder(bytes.NewReader(line))
			dec.UseNumber()
			switch {
			case dec.Decode(&ev) != nil || (ev.Msg != "decision" && ev.Message != "decision"):
				ignored++
			case ev.Input == nil:
				noInput++
			default:
				decided++
				old := ev.recorded()
				d, evalErr := engine.DecideValue(ctx, ev.Input)
				cur := outcome{kind: "deny", reason: d.Reason}
				if evalErr != nil {
					cur = outcome{kind: "error", reason: evalErr.Error()}
				} else if d = policy.Effective(ev.Input, d); d.Allow {
					cur = outcome{kind: "allow", credentials: d.Credentials}
				} else {
					cur.reason = d.Reason
				}
				if changed(old, cur, ev.Phase, *reasons) {
					nChanged++
					path := ev.Path
					if path == "" {
						path = "-"
					}
					fmt.Fprintf(stdout, "%s %s %s %s %s: %s -> %s\n", ev.RequestID, ev.Agent, ev.Method, ev.Host, path, old, cur)
				}
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("--log %s: %w", *logFile, err)
		}
	}
	summary := fmt.Sprintf("replay: %d re-decided, %d changed, %d unchanged, %d skipped without input", decided, nChanged, decided-nChanged, noInput)
	if ignored > 0 {
		summary += fmt.Sprintf(", %d lines not decision events", ignored)
	}
	fmt.Fprintf(stdout, "%s (policy revision %s)\n", summary, engine.Revision())
	switch {
	case decided == 0 && noInput > 0:
		// A gate that re-decided nothing has checked nothing: it must not pass.
		return fmt.Errorf("policy replay: no event in %s carries its input, nothing was re-decided: "+
			"record inputs with audit.include_input: full", *logFile)
	case decided == 0:
		return fmt.Errorf("policy replay: %s holds no decision events (audit lines with \"msg\":\"decision\"), nothing was re-decided: "+
			"is it the audit log (audit.file, or the broker's stdout)?", *logFile)
	case nChanged > 0:
		return fmt.Errorf("policy replay: %d of %d decisions changed", nChanged, decided)
	}
	return nil
}

// newBundlePoller builds the poller for policy.bundle: its key (policy.bundle.public_key_file)
// and its HTTP client (system roots plus policy.bundle.ca_file; proxy variables ignored).
func newBundlePoller(e *policy.Engine, b *config.Bundle, dial svcdial.Func) (*policy.BundlePoller, error) {
	o, err := bundleOptions(b, dial)
	if err != nil {
		return nil, err
	}
	p, err := policy.NewBundlePoller(e, o)
	if err != nil {
		return nil, fmt.Errorf("policy.bundle: %w", err)
	}
	return p, nil
}

func bundleOptions(b *config.Bundle, dial svcdial.Func) (policy.BundleOptions, error) {
	o := policy.BundleOptions{URL: b.URL, PollInterval: b.PollInterval, KeyID: b.KeyID, Algorithm: b.Algorithm}
	if b.PublicKeyFile != "" {
		key, err := os.ReadFile(b.PublicKeyFile)
		if err != nil {
			return o, fmt.Errorf("policy.bundle.public_key_file: %w", err)
		}
		o.PublicKey = key
	}
	roots, err := x509.SystemCertPool()
	if err != nil {
		roots = x509.NewCertPool()
	}
	if b.CAFile != "" {
		pem, err := os.ReadFile(b.CAFile)
		if err != nil {
			return o, fmt.Errorf("policy.bundle.ca_file: %w", err)
		}
		if !roots.AppendCertsFromPEM(pem) {
			return o, fmt.Errorf("policy.bundle.ca_file: no PEM certificates in %s", b.CAFile)
		}
	}
	o.Client = &http.Client{
		Transport: policy.BundleTransport(dial, &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}),
		Timeout:   time.Minute,
	}
	return o, nil
}
