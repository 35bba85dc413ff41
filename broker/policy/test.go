package policy

import (
	"context"
	"errors"
	"io/fs"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/tester"
)

// TestOptions tune RunTests.
type TestOptions struct {
	// Run, if set, is a regular expression: only the tests whose names match run (like `opa test --run`).
	Run string
	// Timeout bounds each test (5s if zero).
	Timeout time.Duration
	// Trace records each test's evaluation, so that a report can show the expression that failed.
	Trace bool
}

// RunTests runs the *_test.rego tests in fsys as OPA's tester does, with what the broker
// loads beside them: the policy modules and the data files, compiled with the broker's
// capabilities, builtin errors raised as the broker raises them. display is the directory
// as the user named it, used in file names. A policy or test that does not compile is an
// error listing every problem with its file:line.
func RunTests(ctx context.Context, fsys fs.FS, display string, o TestOptions) (chan *tester.Result, error) {
	src, err := readDir(fsys, display, true)
	if err != nil {
		return nil, err
	}
	if len(src.tests) == 0 {
		return nil, errors.New("no *_test.rego files found")
	}
	modules, err := parseModules(append(append([]module(nil), src.modules...), src.tests...))
	if err != nil {
		return nil, err
	}
	timeout := o.Timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	compiler := ast.NewCompiler().WithCapabilities(Capabilities()).WithEnablePrintStatements(true)
	return tester.NewRunner().
		SetCompiler(compiler).
		SetStore(newStore(src.data)).
		RaiseBuiltinErrors(true).
		CapturePrintOutput(true).
		SetTimeout(timeout).
		EnableTracing(o.Trace).
		Filter(o.Run).
		Run(ctx, modules)
}
