package policy

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
)

// TestBodyMembers: a cache miss evaluates a body of the members the policy reads only when
// every path into the body is a chain of names below it.
func TestBodyMembers(t *testing.T) {
	for paths, want := range map[string]string{
		"input.request.body.model input.request.path":               "[model]",
		"input.request.body.a.b input.request.body.a.c":             "[a.b a.c]",
		"input.request.body":                                        "nil",
		"input.request input.request.body.model":                    "nil",
		"input.request.body.messages[0]":                            "nil",
		"input.request.path input.request.body_size input.agent.id": "[]",
	} {
		var refs []ast.Ref
		for _, p := range splitFields(paths) {
			refs = append(refs, ast.MustParseRef(p))
		}
		got := "nil"
		if m := bodyMembers(minimalPrefixes(refs)); m != nil {
			got = "["
			for i, r := range m {
				if i > 0 {
					got += " "
				}
				for j, t := range r {
					if j > 0 {
						got += "."
					}
					got += string(t.Value.(ast.String))
				}
			}
			got += "]"
		}
		if got != want {
			t.Errorf("%s: got %s, want %s", paths, got, want)
		}
	}
}

func splitFields(s string) []string {
	var out []string
	start := -1
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ' ' {
			if start >= 0 {
				out = append(out, s[start:i])
			}
			start = -1
		} else if start < 0 {
			start = i
		}
	}
	return out
}

// TestPrunedBodyDecidesAsWhole: evaluating with a body of the members the policy reads
// decides exactly as with the whole body parsed, whatever the body.
func TestPrunedBodyDecidesAsWhole(t *testing.T) {
	e := engine(t, `package broker

default model := "<undefined>"

model := input.request.body.model

default ab := "<undefined>"

ab := input.request.body.a.b

default ac := "<undefined>"

ac := input.request.body.a.c

decision := {"allow": true, "reason": sprintf("%v|%v|%v", [model, ab, ac])}
`)
	p := e.cur.Load()
	if p.cache == nil || len(p.cache.bodyMembers) != 3 {
		t.Fatalf("body members: %v", p.cache)
	}
	ctx := context.Background()
	for _, body := range []string{
		`{"model":"m","a":{"b":1,"c":[true]},"messages":["long"]}`,
		` {"a":{"b":{"x":"y"}}} `,
		`{"model":"first","model":"last","a":{"b":1},"a":{"c":2}}`,
		`{"model":"esc\u00e9\"q","a":"not an object"}`,
		`{"a":null,"model":null}`,
		`{"model":{"deep":[1,2,{"k":"v"}]}}`,
		`["model"]`,
		`"model"`,
		`12`,
		`null`,
		`{}`,
		`{"model":`,
		`not json`,
	} {
		decide := func(pruned bool) string {
			in := req()
			in.ReadBody = func() ([]byte, int64) { return []byte(body), int64(len(body)) }
			in.loadBody()
			if pruned {
				in.bodyMembers = p.cache.bodyMembers
			}
			d, err := evaluateInput(ctx, p, in)
			if err != nil {
				t.Fatalf("%s: %v", body, err)
			}
			if pruned && in.bodyText == nil && strings.HasPrefix(strings.TrimSpace(body), "{") && json.Valid([]byte(body)) {
				t.Fatalf("%s: the body was parsed whole", body)
			}
			return d.Reason
		}
		if got, want := decide(true), decide(false); got != want {
			t.Errorf("%s: pruned body decides %q, whole body %q", body, got, want)
		}
	}
}

// TestDocumentWithoutBody: the audit's document without the body neither reads nor parses it.
func TestDocumentWithoutBody(t *testing.T) {
	in := req()
	read := 0
	in.ReadBody = func() ([]byte, int64) { read++; return []byte(`{"model":"m"}`), 13 }
	doc := in.Document(false)
	if read != 0 || doc["request"].(map[string]any)["body"] != nil {
		t.Fatalf("read %d times: %v", read, doc)
	}
	in.loadBody() // as Decide does for a policy that reads the body
	if doc = in.Document(false); doc["request"].(map[string]any)["body"] != nil || in.bodyText == nil || in.Body != nil {
		t.Fatalf("the body was parsed for a document without it: %v", doc)
	}
	body, _ := in.Document(true)["request"].(map[string]any)["body"].(map[string]any)
	if read != 1 || body["model"] != "m" {
		t.Fatalf("with the body: read %d times, body %v", read, body)
	}
}

// TestBodyWithOutOfRangeNumber: a number no float64 holds does not leave the body null for a
// policy that reads it whole (a deny-list rule on another member would not see it), and a
// large integer keeps its digits.
func TestBodyWithOutOfRangeNumber(t *testing.T) {
	e := engine(t, `package broker

default decision := {"allow": true}

decision := {"allow": false, "reason": sprintf("purge %v", [n])} if {
	some k, v in input.request.body
	k == "action"
	v == "purge"
	n := input.request.body.n
}
`)
	body := `{"action":"purge","n":1e400,"id":12345678901234567890}`
	in := req()
	in.ReadBody = func() ([]byte, int64) { return []byte(body), int64(len(body)) }
	d, err := e.Decide(context.Background(), in)
	if err != nil || d.Allow || d.Reason != "purge 1e400" {
		t.Errorf("decision %+v, %v: want the purge denied", d, err)
	}
}
