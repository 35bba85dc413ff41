package policy

import (
	"slices"
	"strings"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
)

// The decision cache. A policy that calls no builtin depending on the clock or on chance
// decides the same way whenever the parts of the input it reads are the same, and which parts
// it can read is known from the compiled policy: the references to input it contains. The
// cache keys each decision on the values at those references, so requests that differ only
// where the policy does not look (most headers, an LLM prompt beside its model) share one
// evaluation. It lives as long as one policy revision: a reload starts an empty one.

// Cache bounds: each generation holds up to cacheGeneration decisions; when the current one
// is full it becomes the previous one and the oldest is dropped, so at most twice that many
// are held. A key longer than maxCacheKey (a policy reading a whole body, say) is not cached.
const (
	cacheGeneration = 4096
	maxCacheKey     = 1024
)

// timeDependent are builtins that OPA does not mark nondeterministic but that read the clock
// (a token's or a certificate's expiry is checked against now).
var timeDependent = map[string]bool{
	"io.jwt.decode_verify":                                true,
	"crypto.x509.parse_and_verify_certificates":           true,
	"crypto.x509.parse_and_verify_certificates_with_opts": true,
}

type decisionCache struct {
	paths        []ast.Ref   // input paths the policy reads: ground prefixes, none covering another
	names        [][]refName // the terms of each of paths (namesOf), for find
	readsBody    bool        // one of them leads to or into input.request.body or body_size
	readsHeaders bool        // one of them leads to or into input.request.headers
	// bodyMembers are the paths into input.request.body the policy reads, below the body
	// (model, for input.request.body.model), when each is a chain of object member names and
	// none is the body itself or above it; else nil. A cache miss then evaluates the input
	// with a body holding only these (Input.prunedBody), not the whole body parsed.
	bodyMembers []ast.Ref
	mu          sync.Mutex
	cur, old    map[string]Decision
}

// newDecisionCache returns the cache for a compiled policy, or nil when its decisions cannot
// be cached: it calls a nondeterministic or clock-reading builtin, or reads the input whole.
func newDecisionCache(c *ast.Compiler) *decisionCache {
	var paths []ast.Ref
	cacheable := true
	for _, m := range c.Modules {
		ast.WalkRefs(m, func(r ast.Ref) bool {
			if b, ok := ast.BuiltinMap[r.String()]; ok && (b.Nondeterministic || timeDependent[b.Name]) {
				cacheable = false
			}
			if r[0].Equal(ast.InputRootDocument) {
				paths = append(paths, r.GroundPrefix())
			}
			return false
		})
	}
	paths = minimalPrefixes(paths)
	if !cacheable || (len(paths) > 0 && len(paths[0]) == 1) {
		return nil
	}
	dc := &decisionCache{paths: paths, cur: map[string]Decision{}}
	dc.names = compactNames(paths)
	dc.readsBody = dc.reads(bodyPaths...)
	dc.readsHeaders = dc.reads(headersPath)
	dc.bodyMembers = bodyMembers(paths)
	return dc
}

// compactNames returns the names of each of paths (namesOf), all in one array and their bytes
// in one string, so that reading them for a request touches a few cache lines, not the
// policy's terms and strings wherever they were allocated.
func compactNames(paths []ast.Ref) [][]refName {
	var all []refName
	var text strings.Builder
	for _, p := range paths {
		for _, n := range namesOf(p) {
			text.WriteString(n.s)
			all = append(all, n)
		}
	}
	joined, off := text.String(), 0
	for i := range all {
		n := len(all[i].s)
		all[i].s, off = joined[off:off+n], off+n
	}
	out := make([][]refName, len(paths))
	for i, p := range paths {
		out[i], all = all[:len(p):len(p)], all[len(p):]
	}
	return out
}

// reads reports whether the policy reads any of refs, a part of one, or an object holding one.
func (c *decisionCache) reads(refs ...ast.Ref) bool {
	for _, p := range c.paths {
		for _, r := range refs {
			if p.HasPrefix(r) || r.HasPrefix(p) {
				return true
			}
		}
	}
	return false
}

// usagePath is input.usage, the budgets' counters (Input.ReadUsage).
var usagePath = ast.MustParseRef("input.usage")

// mcpPath and jsonrpcPath are input.mcp and input.jsonrpc (Input.ReadMCP, ReadJSONRPC).
var (
	mcpPath     = ast.MustParseRef("input.mcp")
	jsonrpcPath = ast.MustParseRef("input.jsonrpc")
)

// readsInput reports whether the compiled policy refers to ref, a part of it, or a document
// holding it (input itself).
func readsInput(c *ast.Compiler, ref ast.Ref) bool {
	reads := false
	for _, m := range c.Modules {
		ast.WalkRefs(m, func(r ast.Ref) bool {
			if r[0].Equal(ast.InputRootDocument) {
				p := r.GroundPrefix()
				if p.HasPrefix(ref) || ref.HasPrefix(p) {
					reads = true
				}
			}
			return reads
		})
	}
	return reads
}

// bodyPaths are the input paths that need the request body read; headersPath, the headers.
var (
	bodyPaths   = []ast.Ref{ast.MustParseRef("input.request.body"), ast.MustParseRef("input.request.body_size")}
	headersPath = ast.MustParseRef("input.request.headers")
)

// bodyMembers returns the parts below input.request.body of the paths into it, or nil when
// one path reads the body whole (it, input.request or input) or is not a chain of names.
func bodyMembers(paths []ast.Ref) []ast.Ref {
	body := bodyPaths[0]
	members := []ast.Ref{}
	for _, p := range paths {
		switch {
		case body.HasPrefix(p):
			return nil // the body itself, or a document holding it
		case !p.HasPrefix(body):
			continue
		}
		for _, t := range p[len(body):] {
			if _, ok := t.Value.(ast.String); !ok {
				return nil
			}
		}
		members = append(members, p[len(body):])
	}
	return members
}

// minimalPrefixes sorts paths shortest first and drops each path another one covers.
func minimalPrefixes(paths []ast.Ref) []ast.Ref {
	slices.SortFunc(paths, func(a, b ast.Ref) int {
		if len(a) != len(b) {
			return len(a) - len(b)
		}
		return a.Compare(b)
	})
	var out []ast.Ref
	for _, p := range paths {
		if !slices.ContainsFunc(out, func(q ast.Ref) bool { return p.HasPrefix(q) }) {
			out = append(out, p)
		}
	}
	return out
}

// key encodes the input's values at the cache's paths (nil and false when too long), as
// in.find finds them: each value, or an error when there is none. Each value is
// written so that equal keys mean equal values: a string as 's', its length and its bytes;
// any other value as 'v' and its text as a complete Rego term (strings quoted, object keys
// sorted), which never holds a NUL, then a NUL; a missing value as 'm'.
func (c *decisionCache) key(buf []byte, in *Input) ([]byte, bool) {
	for i, p := range c.paths {
		f, err := in.findNamed(p, c.names[i])
		if err != nil {
			buf = append(buf, 'm')
		} else if buf, err = f.appendKey(buf); err != nil {
			return nil, false
		}
		if len(buf) > maxCacheKey {
			return nil, false
		}
	}
	return buf, true
}

// appendTerm appends v's text as a Rego term, and a NUL.
func appendTerm(buf []byte, v ast.Value) ([]byte, error) {
	if t, ok := v.(interface{ AppendText([]byte) ([]byte, error) }); ok {
		var err error
		if buf, err = t.AppendText(buf); err != nil {
			return nil, err
		}
	} else {
		buf = append(buf, v.String()...)
	}
	return append(buf, 0), nil
}

func (c *decisionCache) get(key []byte) (Decision, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d, ok := c.cur[string(key)]; ok { // a lookup by string(key) copies nothing
		return d, true
	}
	d, ok := c.old[string(key)]
	if ok {
		c.putLocked(string(key), d)
	}
	return d, ok
}

func (c *decisionCache) put(key []byte, d Decision) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(string(key), d)
}

func (c *decisionCache) putLocked(key string, d Decision) {
	if len(c.cur) >= cacheGeneration {
		c.old, c.cur = c.cur, make(map[string]Decision, cacheGeneration)
	}
	c.cur[key] = d
}
