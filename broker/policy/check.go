package policy

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/types"
)

// Check compiles the policy in fsys as the broker would and type-checks the decision's shape
// where the types are known: data.broker.decision must be defined, be a single object (not a
// set, a function or a partial rule), with allow a boolean, reason a string, credentials an
// array (or set) of strings and intercept a boolean. display is the directory as the user
// named it, used in file names. Every problem is one error starting with file:line
// (a problem with no line, such as a missing decision, names the directory).
func Check(ctx context.Context, fsys fs.FS, display string) []error {
	src, err := readDir(fsys, display, false)
	if err != nil {
		return splitErrors(err)
	}
	return checkSource(ctx, src, display)
}

// CheckBundle downloads the bundle once, verifies it as the poller would, and checks it as
// Check does.
func CheckBundle(ctx context.Context, o BundleOptions) []error {
	p, err := NewBundlePoller(&Engine{}, o)
	if err != nil {
		return []error{err}
	}
	body, _, _, err := p.download(ctx)
	if err != nil {
		return []error{err}
	}
	src, err := readBundle(body, p.verify)
	if err != nil {
		return []error{err}
	}
	return checkSource(ctx, src, o.URL)
}

// splitErrors turns a joined error, or OPA's list of errors, into one error per problem.
func splitErrors(err error) []error {
	var astErrs ast.Errors
	if errors.As(err, &astErrs) {
		out := make([]error, len(astErrs))
		for i, e := range astErrs {
			out[i] = e
		}
		return out
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, splitErrors(e)...)
		}
		return out
	}
	return []error{err}
}

func checkSource(ctx context.Context, src *source, where string) []error {
	c, err := compileModules(src.modules)
	if err != nil {
		return splitErrors(err)
	}
	problems := checkDecision(c, where)
	// The broker prepares the query with the data; that must work too.
	if _, err := compile(ctx, src); err != nil && len(problems) == 0 {
		problems = append(problems, splitErrors(err)...)
	}
	return problems
}

// decisionKeys are the decision's fields and the kind of value each must hold.
var decisionKeys = map[string]string{
	"allow":          "a boolean",
	"reason":         "a string",
	"credentials":    "an array of credential names (strings) or {name, scope} objects",
	"intercept":      "a boolean",
	"upstream_proxy": "a string (a configured proxy's name, or \"direct\")",
	"ask":            "an object {reason, timeout, scopes}",
}

// checkDecision checks every rule that defines data.broker.decision.
func checkDecision(c *ast.Compiler, where string) []error {
	ref := ast.MustParseRef(Query)
	rules := c.GetRules(ref)
	sort.SliceStable(rules, func(i, j int) bool {
		a, b := rules[i].Location, rules[j].Location
		return a.File < b.File || a.File == b.File && a.Row < b.Row
	})
	if len(rules) == 0 {
		return []error{fmt.Errorf("%s: no rule defines %s (package broker, rule decision): every request would be denied", where, Query)}
	}
	type problem struct {
		loc *ast.Location
		err error
	}
	var found []problem
	report := func(loc *ast.Location, format string, args ...any) {
		prefix := where
		if loc != nil {
			prefix = fmt.Sprintf("%s:%d", loc.File, loc.Row)
		}
		found = append(found, problem{loc, fmt.Errorf("%s: decision: %s", prefix, fmt.Sprintf(format, args...))})
	}
	for _, r := range rules {
		hr := r.Head.Ref()
		switch {
		case len(r.Head.Args) > 0:
			report(r.Location, "must be a value, not a function")
			continue
		case r.Head.RuleKind() == ast.MultiValue:
			report(r.Location, "must be one object (decision := {...}), not a set (decision contains ...)")
			continue
		case len(hr) > 2:
			report(r.Location, "must be one object; %v is nested too deep", hr)
			continue
		}
		for rule := r; rule != nil; rule = rule.Else {
			if len(hr) == 2 {
				// decision.allow := ... builds the object one key at a time.
				key, ok := hr[1].Value.(ast.String)
				if !ok {
					report(rule.Location, "must be one object; its keys must be the strings allow, ask, reason, credentials, intercept")
					continue
				}
				if kind, known := decisionKeys[string(key)]; known {
					if t := typeOf(c, rule, rule.Head.Value, 0); !fits(string(key), t) {
						report(loc(rule.Head.Value, rule), "%s must be %s, not %s", string(key), kind, describe(t))
					}
				}
				continue
			}
			checkObject(c, rule, rule.Head.Value, report)
		}
	}
	sort.SliceStable(found, func(i, j int) bool {
		a, b := found[i].loc, found[j].loc
		return a.File < b.File || a.File == b.File && a.Row < b.Row
	})
	problems := make([]error, len(found))
	for i, p := range found {
		problems[i] = p.err
	}
	return problems
}

// checkObject checks one decision value: an object literal key by key (each problem at its
// key's line), anything else by its inferred type.
func checkObject(c *ast.Compiler, rule *ast.Rule, t *ast.Term, report func(*ast.Location, string, ...any)) {
	t = resolve(rule, t, 0)
	if obj, ok := t.Value.(ast.Object); ok {
		obj.Foreach(func(k, v *ast.Term) {
			key, ok := k.Value.(ast.String)
			if !ok {
				return
			}
			kind, known := decisionKeys[string(key)]
			if !known {
				return
			}
			if vt := typeOf(c, rule, v, 0); !fits(string(key), vt) {
				report(loc(v, rule), "%s must be %s, not %s", string(key), kind, describe(vt))
			}
		})
		return
	}
	typ := typeOf(c, rule, t, 0)
	for _, m := range members(typ) {
		o, ok := m.(*types.Object)
		if !ok {
			report(rule.Location, "must be an object, not %s", describe(m))
			continue
		}
		for _, p := range o.StaticProperties() {
			key, ok := p.Key.(string)
			if !ok {
				continue
			}
			if kind, known := decisionKeys[key]; known && !fits(key, p.Value) {
				report(rule.Location, "%s must be %s, not %s", key, kind, describe(p.Value))
			}
		}
	}
}

func loc(t *ast.Term, rule *ast.Rule) *ast.Location {
	if t != nil && t.Location != nil && t.Location.File != "" {
		return t.Location
	}
	return rule.Location
}

// resolve follows a local variable to the term it was assigned in the rule's body (the
// compiler moves a head's calls and comprehensions into the body this way).
func resolve(rule *ast.Rule, t *ast.Term, depth int) *ast.Term {
	v, ok := t.Value.(ast.Var)
	if !ok || depth > 8 {
		return t
	}
	for _, expr := range rule.Body {
		if !expr.IsEquality() && !expr.IsAssignment() {
			continue
		}
		ops := expr.Operands()
		if len(ops) != 2 {
			continue
		}
		switch {
		case ops[0].Value.Compare(v) == 0:
			return resolve(rule, ops[1], depth+1)
		case ops[1].Value.Compare(v) == 0:
			return resolve(rule, ops[0], depth+1)
		}
	}
	return t
}

// typeOf infers a term's type inside a rule, or returns nil when it cannot tell.
func typeOf(c *ast.Compiler, rule *ast.Rule, t *ast.Term, depth int) types.Type {
	if depth > 8 {
		return nil
	}
	switch v := t.Value.(type) {
	case ast.Boolean:
		return types.B
	case ast.String:
		return types.S
	case ast.Number:
		return types.N
	case ast.Null:
		return types.Nl
	case *ast.Array:
		var elems []types.Type
		for i := 0; i < v.Len(); i++ {
			elems = append(elems, orAny(typeOf(c, rule, v.Elem(i), depth+1)))
		}
		return types.NewArray(elems, nil)
	case ast.Set:
		var elem types.Type
		v.Foreach(func(x *ast.Term) {
			et := orAny(typeOf(c, rule, x, depth+1))
			if elem == nil {
				elem = et
			} else {
				elem = types.Or(elem, et)
			}
		})
		return types.NewSet(orAny(elem))
	case ast.Object:
		var props []*types.StaticProperty
		v.Foreach(func(k, x *ast.Term) {
			if s, ok := k.Value.(ast.String); ok {
				props = append(props, types.NewStaticProperty(string(s), orAny(typeOf(c, rule, x, depth+1))))
			}
		})
		return types.NewObject(props, nil)
	case ast.Ref:
		if v.HasPrefix(ast.DefaultRootRef) && v.IsGround() {
			return c.TypeEnv.Get(v)
		}
		return nil
	case ast.Var:
		if r := resolve(rule, t, 0); r != t {
			return typeOf(c, rule, r, depth+1)
		}
		// The output of a builtin call: f(args..., v).
		for _, expr := range rule.Body {
			if !expr.IsCall() {
				continue
			}
			ops := expr.Operands()
			b, ok := ast.BuiltinMap[expr.Operator().String()]
			if !ok || len(ops) != len(b.Decl.FuncArgs().Args)+1 || ops[len(ops)-1].Value.Compare(v) != 0 {
				continue
			}
			return b.Decl.Result()
		}
		return nil
	}
	return nil
}

func orAny(t types.Type) types.Type {
	if t == nil {
		return types.A
	}
	return t
}

// members lists the alternatives of a type (the members of an any<...>), unwrapped.
func members(t types.Type) []types.Type {
	switch x := t.(type) {
	case nil:
		return nil
	case *types.NamedType:
		return members(x.Type)
	case *types.Recursive:
		return members(x.Unwrap())
	case types.Any:
		var out []types.Type
		for _, m := range x {
			out = append(out, members(m)...)
		}
		return out
	}
	return []types.Type{t}
}

// fits reports whether a value of type t can be what key needs. Unknown types fit: only a
// type known to be wrong is a problem.
func fits(key string, t types.Type) bool {
	for _, m := range members(t) {
		if !fitsOne(key, m) {
			return false
		}
	}
	return true
}

func fitsOne(key string, t types.Type) bool {
	switch key {
	case "allow", "intercept":
		_, ok := t.(types.Boolean)
		return ok
	case "reason", "upstream_proxy":
		_, ok := t.(types.String)
		return ok
	case "ask":
		_, ok := t.(*types.Object)
		return ok
	case "credentials":
		switch x := t.(type) {
		case *types.Array:
			for i := 0; i < x.Len(); i++ {
				if !isGrant(x.Select(i)) {
					return false
				}
			}
			return x.Dynamic() == nil || isGrant(x.Dynamic())
		case *types.Set:
			return isGrant(x.Of())
		}
		return false
	}
	return true
}

// isGrant is true for what may be an item of credentials: a name, or an object (a scoped
// grant, whose shape is checked when the decision is read).
func isGrant(t types.Type) bool {
	for _, m := range members(t) {
		switch m.(type) {
		case types.String, *types.Object:
		default:
			return false
		}
	}
	return true
}

// isString is true for strings and for types not known (any).
func isString(t types.Type) bool {
	for _, m := range members(t) {
		if _, ok := m.(types.String); !ok {
			return false
		}
	}
	return true
}

func describe(t types.Type) string {
	var kinds []string
	for _, m := range members(t) {
		s := types.Sprint(m)
		if s == "" {
			continue
		}
		kinds = append(kinds, s)
	}
	if len(kinds) == 0 {
		return "unknown"
	}
	return strings.Join(kinds, " or ")
}
