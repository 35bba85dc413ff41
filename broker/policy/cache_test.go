package policy

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/capbroker/capbroker/policies"
)

// cacheOf returns the decision cache of e's current policy (nil: not cacheable).
func cacheOf(e *Engine) *decisionCache { return e.cur.Load().cache }

func TestCachePathsAreWhatThePolicyReads(t *testing.T) {
	cases := map[string]struct {
		rego  string
		paths []string // nil: the policy is not cacheable
	}{
		"fields": {rego: `decision := {"allow": input.request.method == "GET", "reason": input.agent.id}`,
			paths: []string{"input.agent.id", "input.request.method"}},
		"a prefix covers longer paths": {rego: `
decision := {"allow": true} if {
	input.request.headers["x-a"] == "1"
	input.request.headers[k] == "2"
	input.request
}`, paths: []string{"input.request"}},
		"a variable ends the path": {rego: `decision := {"allow": true} if input.request.query[k][0] == "v"`,
			paths: []string{"input.request.query"}},
		"reads nothing":         {rego: `decision := {"allow": true}`, paths: []string{}},
		"through a function":    {rego: "f(x) := x.labels.team\n\ndecision := {\"allow\": f(input.agent) == \"a\"}", paths: []string{"input.agent"}},
		"the whole input":       {rego: `decision := {"allow": object.get(input, ["agent", "id"], "") == "a"}`},
		"iterating the input":   {rego: `decision := {"allow": true} if { some k, _ in input; k == "x" }`},
		"the clock":             {rego: `decision := {"allow": time.now_ns() > 0, "reason": input.request.path}`},
		"chance":                {rego: `decision := {"allow": rand.intn("x", 2) == 0}`},
		"a token's expiry":      {rego: `decision := {"allow": io.jwt.decode_verify(input.request.headers.t, {"secret": "s"})[0]}`},
		"uuid":                  {rego: `decision := {"allow": true, "reason": uuid.rfc4122("x")}`},
		"clock in another rule": {rego: "late if time.now_ns() > 0\n\ndecision := {\"allow\": late}"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			cache := cacheOf(engine(t, "package broker\n\n"+c.rego+"\n"))
			if c.paths == nil {
				if cache != nil {
					t.Fatalf("cacheable, with paths %v", cache.paths)
				}
				return
			}
			if cache == nil {
				t.Fatal("not cacheable")
			}
			got := []string{}
			for _, p := range cache.paths {
				got = append(got, p.String())
			}
			slices.Sort(got)
			if !slices.Equal(got, c.paths) {
				t.Fatalf("paths %v, want %v", got, c.paths)
			}
		})
	}
}

// TestFindMatchesTheDocument checks the lazy lookup the cache keys on against the value the
// evaluator is given, for every path into inputs of both phases.
func TestFindMatchesTheDocument(t *testing.T) {
	inputs := []*Input{
		{Phase: PhaseConnect, AgentID: "a", Labels: map[string]string{"profile": "p"}, SourceIP: "10.0.0.1", Method: "CONNECT", Host: "h", Port: 443, Credentials: []string{"c"}},
		{Phase: PhaseRequest, AgentID: "a", Labels: map[string]string{}, SourceIP: "10.0.0.1", Method: "POST", Scheme: "https", Host: "h", Port: 8443, Path: "/p", RawPath: "/x/../p",
			Query: map[string][]string{"q": {"1", "2"}}, Headers: map[string]string{"x": "y"}, BodySize: 12,
			Body: map[string]any{"model": "m", "n": float64(1.5), "list": []any{"a", map[string]any{"k": nil}}, "null": nil}},
		{Phase: PhaseRequest, Method: "GET", Scheme: "http", Host: "h", Port: 80, Path: "/", Body: []any{"x"}},
		{Phase: PhaseRequest, Method: "GET", Scheme: "http", Host: "h", Port: 80, Path: "/", Body: "text"},
	}
	paths := []string{
		"input", "input.phase", "input.phase.x", "input.agent", "input.agent.id", "input.agent.labels", "input.agent.labels.profile",
		"input.agent.labels.none", "input.source", "input.source.ip", "input.credentials", "input.credentials[0]", "input.none",
		"input.request", "input.request.method", "input.request.host", "input.request.port", "input.request.scheme",
		"input.request.path", "input.request.path.x", "input.request.raw_path", "input.request.query", "input.request.query.q", "input.request.query.q[1]",
		"input.request.query.none", "input.request.headers", "input.request.headers.x", "input.request.headers.none",
		"input.request.body", "input.request.body.model", "input.request.body.n", "input.request.body.list[1].k",
		"input.request.body.list[0]", "input.request.body.null", "input.request.body.null.x", "input.request.body.none",
		"input.request.body[0]", "input.request.body_size", "input[\"request\"][\"host\"]",
	}
	for i, in := range inputs {
		doc, err := in.astValue()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range paths {
			t.Run(fmt.Sprintf("%d/%s", i, s), func(t *testing.T) {
				checkFind(t, in, doc, ast.MustParseRef(s))
			})
		}
	}

	for i, text := range bodyTexts {
		for _, s := range append(paths, pathsIntoBodies...) {
			t.Run(fmt.Sprintf("text%d/%s", i, s), func(t *testing.T) { checkFindInText(t, text, ast.MustParseRef(s)) })
		}
	}
}

// bodyTexts are JSON bodies of every shape, and text that is not JSON.
var bodyTexts = []string{
	`{"model": "m", "n": 1.5, "list": ["a", {"k": null}], "null": null, "o": {"model": "inner", "x": [1, {"y": "}"}]}, "t": true}`,
	`{"model": "first", "model": "last"}`, `{"m\u006fdel": "escaped name", "e": "\"q\"", "caf\u00e9": 1}`,
	" \t{\"o\" : { \"model\" :\n\"spaced\" } , \"n\":-1e3 }\n", "{\"\xff\": \"invalid UTF-8\", \"\xef\xbf\xbd\": 2}",
	"{\"model\": \"caf\xc3\xa9\"}", "{\"model\": \"bad \xff byte\"}", `{"model": "tab\tescaped"}`,
	`["x"]`, `"text"`, `null`, `12`, `{}`, `{"model": "m"} trailing`, `{"model": `, ``,
	"\"\" \n", `"\""`, " \"padded\"\t",
}

// pathsIntoBodies lead into a body, beside the paths TestFindMatchesTheDocument tries.
var pathsIntoBodies = []string{"input.request.body.o.model", "input.request.body.o.x[1].y", "input.request.body.e",
	"input.request.body.model.x", `input.request.body["model"]`, `input.request.body["café"]`, `input.request.body["\ufffd"]`}

// checkFindInText checks find for path in an input whose body is still text, against the
// whole input, and checks that a path into the body did not parse it whole.
func checkFindInText(t *testing.T, text string, path ast.Ref) {
	t.Helper()
	withText := func() *Input {
		in := &Input{Phase: PhaseRequest, Method: "POST", Scheme: "https", Host: "h", Port: 443, Path: "/",
			ReadBody: func() ([]byte, int64) { return []byte(text), int64(len(text)) }}
		in.loadBody()
		return in
	}
	doc, err := withText().astValue()
	if err != nil {
		t.Fatal(err)
	}
	in := withText()
	checkFind(t, in, doc, path)
	if in.bodyText == nil && len(path) > len(bodyPaths[0]) && path.HasPrefix(bodyPaths[0]) {
		t.Fatal("the body was parsed whole for a path into it")
	}
}

// FuzzFindInText looks up paths in arbitrary bodies, as TestFindMatchesTheDocument does in
// chosen ones (go test -fuzz FuzzFindInText ./broker/policy/).
func FuzzFindInText(f *testing.F) {
	for _, text := range bodyTexts {
		f.Add(text)
	}
	var paths []ast.Ref
	for _, s := range []string{"input.request.body", "input.request.body.model", "input.request.body.o.model",
		"input.request.body.list[0]", `input.request.body["\ufffd"]`} {
		paths = append(paths, ast.MustParseRef(s))
	}
	f.Fuzz(func(t *testing.T, text string) {
		for _, path := range paths {
			checkFindInText(t, text, path)
		}
	})
}

// checkFind checks in.find(ref) against the value at ref in doc, the whole input.
func checkFind(t *testing.T, in *Input, doc ast.Value, ref ast.Ref) {
	t.Helper()
	f, gotErr := in.find(ref)
	got := f.value()
	want, wantErr := doc.Find(ref[1:])
	if (gotErr != nil) != (wantErr != nil) {
		t.Fatalf("find: %v, %v; document: %v, %v", got, gotErr, want, wantErr)
	}
	if wantErr == nil && got.Compare(want) != 0 {
		t.Fatalf("find: %v; document: %v", got, want)
	}
	if wantErr == nil {
		// The cache key is written from what find returned, without making its value: it
		// must be what the value itself encodes to.
		k, err := f.appendKey(nil)
		if err != nil {
			t.Fatal(err)
		}
		if wk := valueKey(t, want); string(k) != string(wk) {
			t.Fatalf("key %q; the document's value's key %q", k, wk)
		}
	}
}

// valueKey is the cache key's encoding of v (decisionCache.key): a string as 's', its length
// and bytes, anything else as 'v', its text and a NUL.
func valueKey(t *testing.T, v ast.Value) []byte {
	t.Helper()
	if s, ok := v.(ast.String); ok {
		return append(binary.AppendUvarint([]byte{'s'}, uint64(len(s))), s...)
	}
	k, err := appendTerm([]byte{'v'}, v)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestCachedDecisions(t *testing.T) {
	e := engine(t, `package broker

decision := {"allow": true, "reason": input.request.path} if input.request.headers["x-team"] == "a"

decision := {"allow": false, "reason": "team"} if not input.request.headers["x-team"] == "a"
`)
	ctx := context.Background()
	decide := func(path, team, other string) Decision {
		t.Helper()
		in := req()
		in.Path, in.Headers = path, map[string]string{"x-team": team, "user-agent": other}
		d, err := e.Decide(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	first := decide("/a", "a", "one")
	if !first.Allow || first.Reason != "/a" {
		t.Fatalf("got %+v", first)
	}
	again := decide("/a", "a", "two") // differs only in a header the policy does not read
	if again.ID == first.ID {
		t.Fatal("a cached decision kept the decision ID")
	}
	again.ID = first.ID
	if !slices.Equal(again.Credentials, first.Credentials) || again.Reason != first.Reason || again.Allow != first.Allow {
		t.Fatalf("cached %+v, first %+v", again, first)
	}
	if n := len(cacheOf(e).cur); n != 1 {
		t.Fatalf("%d cached decisions, want 1", n)
	}
	if d := decide("/b", "a", "one"); !d.Allow || d.Reason != "/b" {
		t.Fatalf("another path: %+v", d)
	}
	if d := decide("/a", "b", "one"); d.Allow || d.Reason != "team" {
		t.Fatalf("another value of a header the policy reads: %+v", d)
	}
	if d := decide("/a", "a", "three"); !d.Allow || d.Reason != "/a" {
		t.Fatalf("back to the first: %+v", d)
	}
}

// TestKeysTellValuesApart checks that inputs whose values at the policy's paths differ get
// different keys, and equal ones the same key: strings that hold a key's own separators, a
// string and the number it spells, a value and its absence.
func TestKeysTellValuesApart(t *testing.T) {
	refs := []ast.Ref{ast.MustParseRef("input.request.path"), ast.MustParseRef("input.request.body.model")}
	c := &decisionCache{paths: refs, names: compactNames(refs)}
	paths := []string{"", "a", "a\x00", "s\x01a", "m", "v1\x00", "\"a\"", "x", "xs"}
	bodies := []string{`{"model": "1"}`, `{"model": 1}`, `{}`, `{"model": null}`, `{"model": {"a": 1}}`,
		`{"model": "m"}`, `{"model": "s\u0001a"}`, `{"model": ""}`}
	keys := map[string]string{}
	for _, path := range paths {
		for _, body := range bodies {
			in := &Input{Phase: PhaseRequest, Method: "POST", Scheme: "https", Host: "h", Port: 443, Path: path,
				ReadBody: func() ([]byte, int64) { return []byte(body), int64(len(body)) }}
			in.loadBody()
			k, ok := c.key(nil, in)
			if !ok {
				t.Fatalf("no key for %q, %q", path, body)
			}
			if again, _ := c.key(nil, in); string(again) != string(k) {
				t.Fatalf("two keys for %q, %q", path, body)
			}
			if other, seen := keys[string(k)]; seen {
				t.Fatalf("%q, %q has the key of %s", path, body, other)
			}
			keys[string(k)] = fmt.Sprintf("%q, %q", path, body)
		}
	}
}

func TestCacheIsBounded(t *testing.T) {
	c := &decisionCache{cur: map[string]Decision{}}
	for i := range 3*cacheGeneration + 7 {
		c.put([]byte(fmt.Sprint(i)), Decision{Reason: fmt.Sprint(i)})
	}
	if n := len(c.cur) + len(c.old); n > 2*cacheGeneration {
		t.Fatalf("%d decisions held", n)
	}
	last := fmt.Sprint(3*cacheGeneration + 6)
	if d, ok := c.get([]byte(last)); !ok || d.Reason != last {
		t.Fatal("the newest decision was dropped")
	}
	if _, ok := c.get([]byte("0")); ok {
		t.Fatal("the oldest decision was kept")
	}
}

func TestLongKeysAreNotCached(t *testing.T) {
	e := engine(t, "package broker\n\ndecision := {\"allow\": input.request.path != \"\"}\n")
	in := req()
	for _, n := range []int{10, maxCacheKey + 1} {
		in.Path = "/" + string(make([]byte, n))
		if _, err := e.Decide(context.Background(), in); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(cacheOf(e).cur); n != 1 {
		t.Fatalf("%d cached decisions, want 1 (the short path)", n)
	}
}

// TestShippedPoliciesAreCacheable guards the shipped policies against reading the whole input
// (object.get(input, ...), say), which would make every decision an evaluation.
func TestShippedPoliciesAreCacheable(t *testing.T) {
	e, err := New(context.Background(), policies.FS)
	if err != nil {
		t.Fatal(err)
	}
	c := cacheOf(e)
	if c == nil {
		t.Fatal("the shipped policies cannot be cached")
	}
	for _, p := range c.paths {
		if p.Equal(ast.MustParseRef("input.request.headers")) || p.Equal(ast.MustParseRef("input.request.body")) {
			t.Errorf("the shipped policies read %v: every request would be evaluated", p)
		}
	}
}

func TestBodyAndHeadersAreReadOnlyForPoliciesThatSeeThem(t *testing.T) {
	cases := map[string]struct {
		rego              string
		body, headers     bool // read
		allowsWhatItReads bool
	}{
		"reads the model":         {`decision := {"allow": input.request.body.model == "m"}`, true, false, true},
		"reads the size":          {`decision := {"allow": input.request.body_size < 10}`, true, false, true},
		"reads a header":          {`decision := {"allow": input.request.headers["x-team"] == "a"}`, false, true, true},
		"reads the whole request": {`decision := {"allow": count(input.request) > 0}`, true, true, true},
		"reads the path only":     {`decision := {"allow": input.request.path == "/x"}`, false, false, false},
		"not cacheable":           {`decision := {"allow": time.now_ns() > 0}`, true, true, true},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			e := engine(t, "package broker\n\n"+c.rego+"\n")
			bodyReads, headerReads := 0, 0
			in := req()
			in.ReadBody = func() ([]byte, int64) { bodyReads++; return []byte(`{"model": "m"}`), 5 }
			in.Headers = nil
			in.ReadHeaders = func() map[string]string { headerReads++; return map[string]string{"x-team": "a"} }
			d, err := e.Decide(context.Background(), in)
			if err != nil {
				t.Fatal(err)
			}
			want := map[bool]int{true: 1, false: 0}
			if bodyReads != want[c.body] || headerReads != want[c.headers] {
				t.Fatalf("ReadBody called %d times, ReadHeaders %d; want %d, %d", bodyReads, headerReads, want[c.body], want[c.headers])
			}
			if c.allowsWhatItReads && !d.Allow {
				t.Fatalf("the policy did not see what it reads: %+v", d)
			}
		})
	}
}

// TestCompactNamesAreThePathsNames: the names the cache keeps are those of its paths, term by
// term, for the shipped policies' paths and for paths with terms that are not strings.
func TestCompactNamesAreThePathsNames(t *testing.T) {
	paths := append([]ast.Ref{ast.MustParseRef("input.credentials[0]"), ast.MustParseRef(`input.request.body["a b"][1].c`)},
		shippedPaths(t)...)
	got := compactNames(paths)
	if len(got) != len(paths) {
		t.Fatalf("%d paths, %d names", len(paths), len(got))
	}
	for i, p := range paths {
		if want := namesOf(p); !slices.Equal(got[i], want) {
			t.Errorf("%v: names %v, want %v", p, got[i], want)
		}
	}
}

func shippedPaths(t *testing.T) []ast.Ref {
	t.Helper()
	e, err := New(context.Background(), policies.FS)
	if err != nil {
		t.Fatal(err)
	}
	return cacheOf(e).paths
}
