// Command testsummary runs `go test -json` with the arguments it is given, prints what a plain
// `go test` prints (each package's result, and the output of the tests that failed), then how
// many tests were skipped and why. `make test` runs the suite through it.
//
// A skip of a required kind fails the run: today a test skipped for want of a Vault binary
// (the tests against a real Vault would otherwise pass unnoticed without one). The user opts
// out with CAPBROKER_ALLOW_SKIP, a comma-separated list of kinds (CAPBROKER_ALLOW_SKIP=vault).
//
//	go run ./scripts/testsummary -race -count=1 ./...
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"syscall"
)

// requiredKinds are the skips that fail the run unless CAPBROKER_ALLOW_SKIP names their kind:
// a kind, and texts of which any marks a skip reason as of it (vaulttest.Start skips only when
// it finds no Vault binary, whatever the reason it gives).
var requiredKinds = []struct {
	kind    string
	markers []string
}{
	{"vault", []string{"no Vault binary", "vaulttest: "}},
}

const allowVar = "CAPBROKER_ALLOW_SKIP"

func main() {
	args := append([]string{"test", "-json"}, os.Args[1:]...)
	gobin := os.Getenv("GO")
	if gobin == "" {
		gobin = "go"
	}
	cmd := exec.Command(gobin, args...)
	cmd.Stdin, cmd.Stderr = os.Stdin, os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(2)
	}
	signal.Ignore(syscall.SIGINT) // Ctrl-C reaches go test too; let it end and report
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(2)
	}
	s := newSummary(os.Stdout)
	s.read(out)
	runErr := cmd.Wait()
	code := s.report(os.Stdout, os.Getenv(allowVar))
	if runErr != nil && code == 0 {
		code = 1
	}
	os.Exit(code)
}

// event is one line of `go test -json` (see `go doc test2json`).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// summary follows the events of one run.
type summary struct {
	w       io.Writer
	output  map[string][]string // package + "\x00" + test: the test's output lines so far
	skipped []skip
	failed  int
	passed  int
}

type skip struct{ pkg, test, reason string }

func newSummary(w io.Writer) *summary {
	return &summary{w: w, output: map[string][]string{}}
}

// read prints what a plain go test would as the events arrive.
func (s *summary) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(s.w, "%s\n", line) // not an event: pass it on
			continue
		}
		s.event(e)
	}
}

func (s *summary) event(e event) {
	key := e.Package + "\x00" + e.Test
	switch e.Action {
	case "build-output":
		fmt.Fprint(s.w, e.Output)
	case "output":
		if e.Test == "" {
			if e.Output != "PASS\n" && !strings.HasPrefix(e.Output, "=== ") {
				fmt.Fprint(s.w, e.Output)
			}
			return
		}
		s.output[key] = append(s.output[key], e.Output)
	case "fail":
		if e.Test != "" {
			s.failed++
			for _, l := range s.output[key] {
				if !strings.HasPrefix(l, "=== ") {
					fmt.Fprint(s.w, l)
				}
			}
		}
		delete(s.output, key)
	case "skip":
		if e.Test != "" {
			s.skipped = append(s.skipped, skip{e.Package, e.Test, skipReason(s.output[key])})
		}
		delete(s.output, key)
	case "pass":
		if e.Test != "" {
			s.passed++
		}
		delete(s.output, key)
	}
}

// skipReason is the message a test gave t.Skip, without its file:line prefix.
func skipReason(lines []string) string {
	var msg []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- ") {
			continue
		}
		if file, rest, ok := strings.Cut(t, ": "); ok && strings.Contains(file, ".go:") && !strings.Contains(file, " ") {
			t = rest
		}
		msg = append(msg, t)
	}
	if len(msg) == 0 {
		return "(no reason given)"
	}
	return msg[len(msg)-1] // t.Log lines come first; t.Skip's message is the last
}

// report prints the skips grouped by reason and returns the exit code the skips call for:
// 1 if a required kind was skipped and allow does not name it.
func (s *summary) report(w io.Writer, allow string) int {
	allowed := map[string]bool{}
	for _, k := range strings.Split(allow, ",") {
		allowed[strings.TrimSpace(k)] = true
	}
	fmt.Fprintf(w, "\n%d tests passed, %d failed, %d skipped\n", s.passed, s.failed, len(s.skipped))
	byReason := map[string][]string{}
	for _, sk := range s.skipped {
		name := sk.pkg[strings.LastIndex(sk.pkg, "/")+1:] + "." + sk.test
		byReason[sk.reason] = append(byReason[sk.reason], name)
	}
	reasons := make([]string, 0, len(byReason))
	for r := range byReason {
		reasons = append(reasons, r)
	}
	sort.Slice(reasons, func(i, j int) bool {
		if len(byReason[reasons[i]]) != len(byReason[reasons[j]]) {
			return len(byReason[reasons[i]]) > len(byReason[reasons[j]])
		}
		return reasons[i] < reasons[j]
	})
	var refused []string
	for _, r := range reasons {
		tests := byReason[r]
		slices.Sort(tests)
		kind := kindOf(r)
		mark := ""
		if kind != "" && !allowed[kind] {
			mark = " [not allowed]"
			if !slices.Contains(refused, kind) {
				refused = append(refused, kind)
			}
		}
		shown := tests
		if len(shown) > 6 {
			shown = append(slices.Clone(shown[:6]), fmt.Sprintf("and %d more", len(tests)-6))
		}
		fmt.Fprintf(w, "  %d skipped%s: %s\n      %s\n", len(tests), mark, r, strings.Join(shown, ", "))
	}
	if len(refused) == 0 {
		return 0
	}
	for _, k := range refused {
		fmt.Fprintf(w, "FAIL: tests skipped for want of %s; install it (see README.md) or accept the skips with %s=%s\n",
			what(k), allowVar, strings.Join(refused, ","))
	}
	return 1
}

// kindOf is the required kind a skip reason is of, or "".
func kindOf(reason string) string {
	for _, k := range requiredKinds {
		for _, m := range k.markers {
			if strings.Contains(reason, m) {
				return k.kind
			}
		}
	}
	return ""
}

func what(kind string) string {
	if kind == "vault" {
		return "a Vault binary"
	}
	return kind
}
