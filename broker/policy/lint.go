package policy

import (
	"context"
	"fmt"
	"io/fs"
	"sort"

	"github.com/open-policy-agent/opa/v1/ast"
)

// LargeArray is the length above which a data array that a policy tests membership in, or
// iterates over, is worth a warning (Warnings).
const LargeArray = 1000

// A Warning is a costly construct in a policy that still loads: it names the file and line
// of the Rego expression, and says what to write instead.
type Warning struct {
	File    string
	Line    int
	Message string
}

func (w Warning) String() string { return fmt.Sprintf("%s:%d: %s", w.File, w.Line, w.Message) }

// Warnings reads the policy in fsys as the broker would and reports the expressions whose
// cost grows with a data array of more than LargeArray entries: a membership test
// (`x in data.a.b`), an iteration (`data.a.b[_] == x`, `some x in data.a.b`, `every x in
// data.a.b`), directly or through a rule or a local variable that is the array or a document
// above it (`hosts := data.a.b`, `a := data.a` then `x in a.b`), or a function it is passed
// to that scans it (`f(x, l) if x in l`, then `f(x, data.a.b)`), or scans it under a document
// passed (`g(cfg) if cfg.b[_] == x`, then `g(data.a)`). Each such expression visits every
// entry on every evaluation the decision cache misses; an object keyed by entry, looked up as
// data.a.b[x], costs the same at any length. A policy that does not read or compile has no
// warnings: Check reports why.
func Warnings(fsys fs.FS, display string) []Warning {
	src, err := readDir(fsys, display, false)
	if err != nil {
		return nil
	}
	return lint(src)
}

// BundleWarnings downloads the bundle once, verifies it as the poller would and reports what
// Warnings does for a directory. A bundle that does not download, verify or compile has no
// warnings: CheckBundle reports why.
func BundleWarnings(ctx context.Context, o BundleOptions) []Warning {
	p, err := NewBundlePoller(&Engine{}, o)
	if err != nil {
		return nil
	}
	body, _, _, err := p.download(ctx)
	if err != nil {
		return nil
	}
	src, err := readBundle(body, p.verify)
	if err != nil {
		return nil
	}
	return lint(src)
}

// largeDoc is a data array of more than LargeArray entries, by the data path that holds it.
type largeDoc struct {
	path string // data.a.b
	n    int
}

// linter finds the large arrays of one policy's data and the expressions that scan them.
type linter struct {
	data map[string]any
	// aliases are complete rules (data.pkg.name) whose value is a document of data
	// (data.a.b), by the rule's path.
	aliases map[string]ast.Ref
	// scans are what each function (data.pkg.name) tests membership in or iterates over of
	// its parameters: a parameter itself, or a document under one (`cfg.hosts`). A large
	// array passed there, or held there by the document passed, is scanned.
	scans map[string]map[paramScan]ast.Ref
	found map[Warning]bool
}

// A paramScan is a function's parameter, by position, or the document at a path under it,
// that the function tests membership in or iterates over; the path is also kept as terms.
type paramScan struct {
	param int
	under string // the path's ast.Ref.String(), "" for the parameter itself
}

func lint(src *source) []Warning {
	c, err := compileModules(src.modules)
	if err != nil {
		return nil
	}
	l := &linter{data: src.data, aliases: map[string]ast.Ref{}, scans: map[string]map[paramScan]ast.Ref{}, found: map[Warning]bool{}}
	names := make([]string, 0, len(c.Modules))
	for name := range c.Modules {
		names = append(names, name)
	}
	sort.Strings(names)
	// A rule may be another rule that is the array: follow such chains a few links deep.
	for range 4 {
		before := len(l.aliases)
		for _, name := range names {
			ast.WalkRules(c.Modules[name], func(r *ast.Rule) bool {
				l.alias(r)
				return false
			})
		}
		if len(l.aliases) == before {
			break
		}
	}
	// Again until no function is found to scan another parameter: a function may pass its
	// own to another that scans it. Warnings found twice are one.
	for range 4 {
		before := l.scanned()
		for _, name := range names {
			ast.WalkRules(c.Modules[name], func(r *ast.Rule) bool {
				ast.WalkBodies(r, func(b ast.Body) bool {
					l.body(b, r)
					return false
				})
				return false
			})
		}
		if l.scanned() == before {
			break
		}
	}
	out := make([]Warning, 0, len(l.found))
	for w := range l.found {
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Message < b.Message
	})
	return out
}

// large reports whether ref is a large data array, or a rule that is one.
func (l *linter) large(ref ast.Ref) (largeDoc, bool) {
	ref = l.expand(ref)
	if len(ref) < 2 || !ref[0].Equal(ast.DefaultRootDocument) {
		return largeDoc{}, false
	}
	var v any = l.data
	for _, t := range ref[1:] {
		s, ok := t.Value.(ast.String)
		if !ok {
			return largeDoc{}, false
		}
		m, ok := v.(map[string]any)
		if !ok {
			return largeDoc{}, false
		}
		if v, ok = m[string(s)]; !ok {
			return largeDoc{}, false
		}
	}
	if a, ok := v.([]any); ok && len(a) > LargeArray {
		return largeDoc{path: ref.String(), n: len(a)}, true
	}
	return largeDoc{}, false
}

// expand rewrites the longest prefix of ref that is an alias into the document it names, until
// none is (a few links deep: an alias may name another).
func (l *linter) expand(ref ast.Ref) ast.Ref {
	for range 8 {
		k := len(ref)
		for ; k >= 2; k-- {
			if to, ok := l.aliases[ref[:k].String()]; ok {
				ref = to.Concat(ref[k:])
				break
			}
		}
		if k < 2 {
			break
		}
	}
	return ref
}

// dataRef reports whether t is a ground reference into data (data.a.b), which an alias may
// name.
func dataRef(t ast.Value) (ast.Ref, bool) {
	ref, ok := t.(ast.Ref)
	if !ok || len(ref) < 2 || !ref[0].Equal(ast.DefaultRootDocument) || !ref.IsGround() {
		return nil, false
	}
	return ref, true
}

// alias records r if it is a complete rule, without arguments, whose value is a document of
// data.
func (l *linter) alias(r *ast.Rule) {
	if r.Module == nil || len(r.Head.Args) > 0 || r.Head.Key != nil || r.Head.Value == nil {
		return
	}
	path := r.Ref()
	if !path.IsGround() {
		return
	}
	value := r.Head.Value.Value
	if v, ok := value.(ast.Var); ok {
		// The compiler binds the value in the body: `__local0__ = data.a.b`.
		for _, e := range r.Body {
			if ref, bound := assigned(e, v); bound {
				if _, ok := dataRef(ref); ok {
					value = ref
				}
			}
		}
	}
	if ref, ok := dataRef(value); ok && !ref.Equal(path) {
		l.aliases[path.String()] = ref
	}
}

// assigned reports the ref that expression e binds to v (`v = ref` or `ref = v`, a variable
// standing for the ref of itself alone), if any.
func assigned(e *ast.Expr, v ast.Var) (ast.Ref, bool) {
	if !e.IsEquality() || e.Negated {
		return nil, false
	}
	a, b := e.Operand(0), e.Operand(1)
	if b.Value.Compare(v) == 0 {
		a, b = b, a
	}
	if a.Value.Compare(v) != 0 {
		return nil, false
	}
	switch w := b.Value.(type) {
	case ast.Ref:
		return w, true
	case ast.Var: // `c := cfg`: a ref of the variable alone, which locals may resolve
		return ast.Ref{b}, w.Compare(v) != 0
	}
	return nil, false
}

// scanned counts the function parameters known to be scanned.
func (l *linter) scanned() (n int) {
	for _, ps := range l.scans {
		n += len(ps)
	}
	return n
}

// body checks one body of rule r, its expressions in their (compiled) order; a function's
// parameters are bound before it, by its caller.
func (l *linter) body(b ast.Body, r *ast.Rule) {
	bound := r.Head.Args.Vars()
	params := map[ast.Var]int{}
	for i, a := range r.Head.Args {
		if v, ok := a.Value.(ast.Var); ok {
			params[v] = i
		}
	}
	// locals are the body's variables bound to a document of data (`a := data.a`) or under
	// a parameter (the compiler's `__local5__ = cfg.hosts`), which a ref may start from
	// (`a.b`): local rewrites such a ref into the document's.
	locals := map[ast.Var]ast.Ref{}
	local := func(ref ast.Ref) ast.Ref {
		if v, ok := ref[0].Value.(ast.Var); ok {
			if to, ok := locals[v]; ok {
				return to.Concat(ref[1:])
			}
		}
		return ref
	}
	// refOf is t as a ref, with a local it starts from (or is) rewritten.
	refOf := func(t *ast.Term) ast.Ref {
		switch v := t.Value.(type) {
		case ast.Ref:
			return local(v)
		case ast.Var:
			return local(ast.Ref{t})
		}
		return nil
	}
	// underParam reports the parameter ref starts from, if it does, by position, and the
	// path under it when that is ground (`cfg.hosts`, not `cfg[i]`).
	underParam := func(ref ast.Ref) (int, ast.Ref, bool) {
		if len(ref) == 0 || !ref[1:].IsGround() {
			return 0, nil, false
		}
		v, ok := ref[0].Value.(ast.Var)
		i, isParam := params[v]
		return i, ref[1:], ok && isParam
	}
	// param records that r scans ref, if it is one of r's parameters (`list`) or a
	// document under one (`cfg.hosts`), its locals rewritten.
	param := func(ref ast.Ref) {
		if i, under, ok := underParam(ref); ok {
			fn := r.Ref().String()
			if l.scans[fn] == nil {
				l.scans[fn] = map[paramScan]ast.Ref{}
			}
			l.scans[fn][paramScan{param: i, under: under.String()}] = under
		}
	}
	// scan warns of e scanning t, a large array (as a ref or a local bound to one), or
	// records that it scans a parameter.
	scan := func(e *ast.Expr, t *ast.Term, what string) {
		ref := refOf(t)
		if d, ok := l.large(ref); ok {
			l.warn(e, d, what)
		} else {
			param(ref)
		}
	}
	// iterated is the part of ref before its first variable not yet bound, from position
	// from on: what `ref[_]...` iterates over.
	iterated := func(ref ast.Ref, from int) (ast.Ref, bool) {
		for k := from; k < len(ref); k++ {
			if v, ok := ref[k].Value.(ast.Var); ok && !bound.Contains(v) {
				return ref[:k], true
			}
		}
		return nil, false
	}
	for _, e := range b {
		switch {
		case e.IsCall() && collectionOf(e) != nil:
			scan(e, collectionOf(e), "tests membership in")
		case e.IsCall():
			ops := e.Operands()
			for s, under := range l.scans[e.Operator().String()] {
				if s.param < len(ops) {
					if t := within(ops[s.param], under); t != nil {
						scan(e, t, "passes to a function that scans")
					}
				}
			}
		case isEvery(e):
			scan(e, e.Terms.(*ast.Every).Domain, "iterates over")
		}
		for _, ref := range refsOf(e) {
			ref = local(ref)
			if list, ok := iterated(ref, 1); ok {
				param(list) // list[_], list[_].name, cfg.hosts[_]
			}
			if list, ok := iterated(l.expand(ref), 2); ok {
				if d, ok := l.large(list); ok {
					l.warn(e, d, "iterates over")
				}
			}
		}
		if !e.Negated && e.IsEquality() {
			for _, v := range []*ast.Term{e.Operand(0), e.Operand(1)} {
				if name, ok := v.Value.(ast.Var); ok {
					if ref, bound := assigned(e, name); bound {
						ref = l.expand(local(ref))
						_, _, isParam := underParam(ref)
						if _, isData := dataRef(ref); isData || isParam {
							locals[name] = ref
						}
					}
				}
			}
		}
		bound.Update(e.Vars(ast.VarVisitorParams{SkipClosures: true}))
	}
}

// within is the document at path under t (`cfg` and `.hosts` make `cfg.hosts`), t itself for
// an empty path, or nil if t is a value with nothing under it to name.
func within(t *ast.Term, under ast.Ref) *ast.Term {
	if len(under) == 0 {
		return t
	}
	switch v := t.Value.(type) {
	case ast.Ref:
		return ast.RefTerm(v.Concat(under)...)
	case ast.Var:
		return ast.RefTerm(append(ast.Ref{t}, under...)...)
	}
	return nil
}

// collectionOf returns the collection a membership test (`x in c`, `k, v in c`) looks in, or
// nil. The call may carry one more operand, its result captured (`a := x in c`).
func collectionOf(e *ast.Expr) *ast.Term {
	ops := e.Operands()
	switch {
	case e.Operator().Equal(ast.Member.Ref()) && len(ops) >= 2:
		return ops[1]
	case e.Operator().Equal(ast.MemberWithKey.Ref()) && len(ops) >= 3:
		return ops[2]
	}
	return nil
}

func isEvery(e *ast.Expr) bool {
	_, ok := e.Terms.(*ast.Every)
	return ok
}

// refsOf returns the refs in e's own terms, not inside comprehensions or an every's body
// (their bodies are checked on their own).
func refsOf(e *ast.Expr) []ast.Ref {
	var refs []ast.Ref
	vis := ast.NewGenericVisitor(func(x any) bool {
		switch x := x.(type) {
		case *ast.ArrayComprehension, *ast.SetComprehension, *ast.ObjectComprehension, *ast.Every:
			return true
		case ast.Ref:
			refs = append(refs, x)
		}
		return false
	})
	switch t := e.Terms.(type) {
	case *ast.Term:
		vis.Walk(t)
	case []*ast.Term:
		for _, x := range t[1:] { // the operator is a builtin's or function's name
			vis.Walk(x)
		}
	}
	return refs
}

// warn records expression e's cost over the large array d.
func (l *linter) warn(e *ast.Expr, d largeDoc, what string) {
	loc := e.Location
	if loc == nil {
		return
	}
	text := string(loc.Text)
	l.found[Warning{File: loc.File, Line: loc.Row, Message: fmt.Sprintf(
		"`%s` %s %s, an array of %d entries: every evaluation the decision cache misses "+
			"visits each entry (about 1 ms per 100,000); store it as an object keyed by entry "+
			"({\"entry\": true, ...}) and look the value up, %s[x], which costs the same at any "+
			"length (docs/policy.md, Large allow-lists)",
		text, what, d.path, d.n, d.path)}] = true
}
