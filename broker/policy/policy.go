// Package policy evaluates the Rego policy (query data.broker.decision) for each request.
// The query is prepared once per policy revision; evaluation fails closed; a reload that does
// not compile keeps the last good policy. A policy comes from a directory (Rego and data
// files, hot reloaded by Watch) or from an OPA bundle polled over HTTP (PollBundle).
package policy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capbroker/capbroker/broker/wire/strictjson"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
)

// Query is the rule every policy defines.
const Query = "data.broker.decision"

// ErrEvaluation is wrapped by every failure to evaluate the policy (the agent sees 503 policy_error).
var ErrEvaluation = errors.New("policy evaluation failed")

// ErrNoPolicy is wrapped (with ErrEvaluation) by Decide on an Engine that has no policy yet,
// for example while the first bundle has not been downloaded.
var ErrNoPolicy = errors.New("no policy loaded yet")

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
// The zero Engine has no policy: every Decide is an ErrEvaluation until a Load (or a bundle)
// succeeds, so a broker whose policy is not there yet fails closed.
type Engine struct {
	cur atomic.Pointer[prepared]
}

type prepared struct {
	query    rego.PreparedEvalQuery
	revision string
	cache    *decisionCache // nil when this policy's decisions cannot be cached
	data     map[string]any
	// readsUsage: the policy refers to input.usage (or the whole input), which is then
	// computed for each decision.
	readsUsage bool
	// readsGraphQL: the policy refers to input.graphql (or the whole input), which is then
	// read from a GraphQL request (Input.ReadGraphQL).
	readsGraphQL bool
	// readsMCP, readsJSONRPC: the policy refers to input.mcp, input.jsonrpc (or the whole
	// input), which are then derived from the body (Input.ReadMCP).
	readsMCP, readsJSONRPC bool
	// readsBody: the policy refers to input.request.body (or a document holding it), whose
	// text is then checked (Input.checkBody) before it is decided on.
	readsBody bool
}

// dataChecks check a policy's data document before it is loaded (RegisterDataCheck).
var dataChecks []func(data map[string]any) error

// RegisterDataCheck adds a check of the data document that every policy must pass to load
// (the budgets' data.budgets and data.prices). Call from an init function.
func RegisterDataCheck(f func(data map[string]any) error) { dataChecks = append(dataChecks, f) }

// Data returns the current policy's revision and data document (not to be modified).
func (e *Engine) Data() (revision string, data map[string]any) {
	if p := e.cur.Load(); p != nil {
		return p.revision, p.data
	}
	return "", nil
}

// New compiles the policy in fsys. A policy that does not compile is an error.
func New(ctx context.Context, fsys fs.FS) (*Engine, error) {
	e := &Engine{}
	if err := e.Load(ctx, fsys); err != nil {
		return nil, err
	}
	return e, nil
}

// Load compiles the policy in fsys (Rego and data files) and, only if it compiles, makes it current.
func (e *Engine) Load(ctx context.Context, fsys fs.FS) error { return e.load(ctx, fsys, "") }

// load compiles fsys, naming files under prefix in errors, and swaps it in only if it compiles.
func (e *Engine) load(ctx context.Context, fsys fs.FS, prefix string) error {
	src, err := readDir(fsys, prefix, false)
	if err != nil {
		return err
	}
	p, err := compile(ctx, src)
	if err != nil {
		return err
	}
	e.cur.Store(p)
	return nil
}

// Revision names the current policy: a content hash of its files, or the bundle's revision.
// It is "" while the Engine has no policy.
func (e *Engine) Revision() string {
	if p := e.cur.Load(); p != nil {
		return p.revision
	}
	return ""
}

// Files returns the policy files in fsys that are loaded at run time: *.rego, not *_test.rego.
// The data files loaded beside them are listed by DataFiles.
func Files(fsys fs.FS) ([]string, error) {
	var names []string
	err := walk(fsys, func(p string) {
		if path.Ext(p) == ".rego" && !isTest(p) {
			names = append(names, p)
		}
	})
	sort.Strings(names)
	return names, err
}

// compile prepares the decision query over the source's modules and data. The modules are
// compiled first on their own, so that errors are OPA's, one per problem, with file:line.
func compile(ctx context.Context, src *source) (*prepared, error) {
	if len(src.modules) == 0 {
		return nil, errors.New("no .rego policy files found")
	}
	c, err := compileModules(src.modules)
	if err != nil {
		return nil, fmt.Errorf("compiling policies: %w", err)
	}
	for _, check := range dataChecks {
		if err := check(src.data); err != nil {
			return nil, fmt.Errorf("policy data: %w", err)
		}
	}
	pq, err := rego.New(
		rego.Query(Query),
		rego.Compiler(c),
		rego.Capabilities(Capabilities()),
		rego.StrictBuiltinErrors(true),
		rego.Store(newStore(src.data)),
	).PrepareForEval(ctx)
	if err != nil {
		return nil, fmt.Errorf("compiling policies: %w", err)
	}
	return &prepared{query: pq, revision: src.revision, cache: newDecisionCache(c), data: src.data,
		readsUsage: readsInput(c, usagePath), readsGraphQL: readsInput(c, graphqlPath),
		readsMCP: readsInput(c, mcpPath), readsJSONRPC: readsInput(c, jsonrpcPath), readsBody: readsInput(c, bodyPaths[0])}, nil
}

// compileModules parses (Rego v1) and compiles modules with the broker's capabilities.
// The error is an ast.Errors listing every problem.
func compileModules(modules []module) (*ast.Compiler, error) {
	parsed, err := parseModules(modules)
	if err != nil {
		return nil, err
	}
	c := ast.NewCompiler().WithCapabilities(Capabilities())
	if c.Compile(parsed); c.Failed() {
		return nil, c.Errors
	}
	return c, nil
}

// parseModules parses modules as Rego v1 with the broker's capabilities. The error is an
// ast.Errors listing every problem in every file, not only the first.
func parseModules(modules []module) (map[string]*ast.Module, error) {
	parsed := make(map[string]*ast.Module, len(modules))
	var errs ast.Errors
	for _, m := range modules {
		pm, err := ast.ParseModuleWithOpts(m.name, string(m.raw), ast.ParserOptions{RegoVersion: ast.RegoV1, Capabilities: Capabilities()})
		if err != nil {
			var astErrs ast.Errors
			if errors.As(err, &astErrs) {
				errs = append(errs, astErrs...)
				continue
			}
			return nil, err
		}
		parsed[m.name] = pm
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return parsed, nil
}

// Decide evaluates the policy for one input. Errors (including timeouts, panics inside the
// evaluator and having no policy) wrap ErrEvaluation; an undefined or malformed decision is a
// deny, not an error. Every call gets a fresh decision ID. A decision the policy's cache holds
// for the same values at the paths the policy reads is returned without evaluating.
func (e *Engine) Decide(ctx context.Context, in *Input) (Decision, error) {
	p := e.cur.Load()
	var c *decisionCache
	if p != nil {
		c = p.cache
	}
	if c == nil || c.readsBody {
		in.loadBody()
	}
	if c == nil || c.readsHeaders {
		in.loadHeaders()
	}
	if p != nil && p.readsUsage {
		// Usage changes with every request: the cache keys on the counters the policy
		// reads, so a decision is reused only for the same counters, never a stale one.
		in.loadUsage()
	}
	if p != nil {
		if err := in.loadMeaning(p); err != nil {
			// A body the broker cannot read as the upstream will is refused with an error of
			// its own (strictjson.ErrAmbiguous, ErrBodyNotJSON); one that does not read as what
			// its endpoint speaks is a deny whose reason says why.
			d := Decision{ID: newDecisionID(), Reason: err.Error(), Revision: p.revision}
			if errors.Is(err, strictjson.ErrAmbiguous) || errors.Is(err, ErrBodyNotJSON) {
				return d, err
			}
			return d, nil
		}
	}
	if c == nil {
		return evaluateInput(ctx, p, in)
	}
	in.bodyMembers = c.bodyMembers
	kb := keyBuffers.Get().(*[]byte)
	defer keyBuffers.Put(kb)
	key, ok := c.key((*kb)[:0], in)
	if !ok {
		return evaluateInput(ctx, p, in)
	}
	if cap(key) <= maxCacheKey+64 { // one grown past what a key can hold is not kept
		*kb = key
	}
	if d, hit := c.get(key); hit {
		d.ID = newDecisionID()
		return d, nil
	}
	d, err := evaluateInput(ctx, p, in)
	if err == nil {
		c.put(key, d) // the map keeps a copy of the key, never the buffer
	}
	return d, err
}

// loadMeaning checks the body the policy p reads (checkBody) and derives the parts of the input
// that are read from it (input.graphql, input.mcp, input.jsonrpc). The cache keys on them as
// on any other part of the input the policy reads.
func (in *Input) loadMeaning(p *prepared) error {
	if p.readsBody {
		in.loadBody()
		if err := in.checkBody(); err != nil {
			return err
		}
	}
	if p.readsGraphQL {
		if err := in.loadGraphQL(); err != nil {
			return err
		}
	}
	return in.loadRPC(p.readsMCP, p.readsJSONRPC)
}

// keyBuffers hold the buffers decision cache keys are built in, one per decision under way:
// a key is only looked up, or copied into the cache, so its buffer serves the next decision.
var keyBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// evaluateInput evaluates p for in, converted directly to the evaluator's value.
func evaluateInput(ctx context.Context, p *prepared, in *Input) (Decision, error) {
	v, err := in.astValue()
	if err != nil {
		// Not expected (the body is parsed JSON); the general conversion decides it, or fails.
		return evaluate(ctx, p, in.value())
	}
	return evaluate(ctx, p, v)
}

// DecideValue evaluates the policy for an input given as a JSON-shaped document, such as
// the `input` of an audit event or a file given to `broker policy eval`.
func (e *Engine) DecideValue(ctx context.Context, input any) (Decision, error) {
	return evaluate(ctx, e.cur.Load(), input)
}

// evaluate evaluates p (nil: no policy yet) for input: a JSON-shaped document or an ast.Value.
func evaluate(ctx context.Context, p *prepared, input any) (d Decision, err error) {
	id := newDecisionID()
	if p == nil {
		return Decision{ID: id, Reason: ReasonNoPolicy}, fmt.Errorf("%w: %w", ErrEvaluation, ErrNoPolicy)
	}
	d.ID, d.Revision = id, p.revision
	defer func() {
		if r := recover(); r != nil {
			d, err = Decision{ID: id, Revision: p.revision}, fmt.Errorf("%w: panic: %v", ErrEvaluation, r)
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, evalTimeout)
	defer cancel()
	opt := rego.EvalInput(input)
	if v, ok := input.(ast.Value); ok {
		opt = rego.EvalParsedInput(v) // already converted: skip the reflection pass
	}
	rs, err := p.query.Eval(ctx, opt)
	if err != nil {
		return d, fmt.Errorf("%w: %w", ErrEvaluation, err)
	}
	d = parseResult(rs, p.revision)
	d.ID = id
	return d, nil
}

// newDecisionID returns a random (version 4) UUID, as OPA's decision IDs are.
func newDecisionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand panics rather than return short)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	hex.Encode(s[9:13], b[4:6])
	hex.Encode(s[14:18], b[6:8])
	hex.Encode(s[19:23], b[8:10])
	hex.Encode(s[24:], b[10:])
	s[8], s[13], s[18], s[23] = '-', '-', '-', '-'
	return string(s[:])
}
