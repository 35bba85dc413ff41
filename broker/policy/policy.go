// Package policy evaluates the Rego policy (query data.broker.decision) for each request.
// The query is prepared once per policy revision; evaluation fails closed; a reload that does
// not compile keeps the last good policy.
package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
)

// Query is the rule every policy defines.
const Query = "data.broker.decision"

// ErrEvaluation is wrapped by every failure to evaluate the policy (the agent sees 503 policy_error).
var ErrEvaluation = errors.New("policy evaluation failed")

// evalTimeout bounds one evaluation; a policy that runs longer is an evaluation error.
const evalTimeout = 2 * time.Second

// forbiddenBuiltins are removed from the capabilities policies compile against: a policy
// decides on its input alone and cannot reach the network or the runtime.
var forbiddenBuiltins = map[string]bool{
	"http.send":              true,
	"net.lookup_ip_addr":     true,
	"opa.runtime":            true,
	"providers.aws.sign_req": true,
}

// Capabilities returns the OPA capabilities policies are compiled with.
func Capabilities() *ast.Capabilities {
	caps := ast.CapabilitiesForThisVersion()
	kept := caps.Builtins[:0]
	for _, b := range caps.Builtins {
		if !forbiddenBuiltins[b.Name] {
			kept = append(kept, b)
		}
	}
	caps.Builtins = kept
	caps.AllowNet = []string{} // no network for any builtin
	return caps
}

// Engine holds the current prepared policy. Safe for concurrent use; Load swaps atomically.
type Engine struct {
	cur atomic.Pointer[prepared]
}

type prepared struct {
	query    rego.PreparedEvalQuery
	revision string
}

// New compiles the policy in fsys. A policy that does not compile is an error.
func New(ctx context.Context, fsys fs.FS) (*Engine, error) {
	e := &Engine{}
	if err := e.Load(ctx, fsys); err != nil {
		return nil, err
	}
	return e, nil
}

// Load compiles the policy in fsys and, only if it compiles, makes it current.
func (e *Engine) Load(ctx context.Context, fsys fs.FS) error {
	p, err := compile(ctx, fsys)
	if err != nil {
		return err
	}
	e.cur.Store(p)
	return nil
}

// Revision is the content hash of the current policy.
func (e *Engine) Revision() string { return e.cur.Load().revision }

// Files returns the policy files in fsys that are loaded at run time: *.rego, not *_test.rego.
func Files(fsys fs.FS) ([]string, error) {
	var names []string
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != "." && strings.HasPrefix(d.Name(), ".") {
				return fs.SkipDir // editors' and Kubernetes' ..data-style directories
			}
			return nil
		}
		if path.Ext(p) == ".rego" && !strings.HasSuffix(p, "_test.rego") {
			names = append(names, p)
		}
		return nil
	})
	sort.Strings(names)
	return names, err
}

func compile(ctx context.Context, fsys fs.FS) (*prepared, error) {
	names, err := Files(fsys)
	if err != nil {
		return nil, fmt.Errorf("reading policies: %w", err)
	}
	if len(names) == 0 {
		return nil, errors.New("no .rego policy files found")
	}
	h := sha256.New()
	opts := []func(*rego.Rego){
		rego.Query(Query),
		rego.Capabilities(Capabilities()),
		rego.StrictBuiltinErrors(true),
	}
	for _, n := range names {
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", n, err)
		}
		fmt.Fprintf(h, "%s\x00%d\x00", n, len(b))
		h.Write(b)
		opts = append(opts, rego.Module(n, string(b)))
	}
	pq, err := rego.New(opts...).PrepareForEval(ctx)
	if err != nil {
		return nil, fmt.Errorf("compiling policies: %w", err)
	}
	return &prepared{query: pq, revision: hex.EncodeToString(h.Sum(nil))[:12]}, nil
}

// Decide evaluates the policy for one input. Errors (including timeouts and panics inside the
// evaluator) wrap ErrEvaluation; an undefined or malformed decision is a deny, not an error.
func (e *Engine) Decide(ctx context.Context, in *Input) (d Decision, err error) {
	p := e.cur.Load()
	d.Revision = p.revision
	defer func() {
		if r := recover(); r != nil {
			d, err = Decision{Revision: p.revision}, fmt.Errorf("%w: panic: %v", ErrEvaluation, r)
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, evalTimeout)
	defer cancel()
	rs, err := p.query.Eval(ctx, rego.EvalInput(in.value()))
	if err != nil {
		return d, fmt.Errorf("%w: %w", ErrEvaluation, err)
	}
	return parseResult(rs, p.revision), nil
}
