package policy

import (
	"context"
	"strings"
	"testing"
	"testing/fstest"
)

func TestCheckDecisionShape(t *testing.T) {
	cases := map[string]struct {
		rego string
		want []string // one line per problem; empty: no problem
	}{
		"good": {rego: `default decision := {"allow": false, "reason": "no"}

decision := {"allow": true, "credentials": [c], "intercept": true} if {
	c := data.creds[input.request.host]
}`},
		"unknown types are not problems": {rego: `decision := {"allow": input.ok, "reason": input.why}`},
		"allow not a boolean":            {rego: `decision := {"allow": "yes"}`, want: []string{`p.rego:3: decision: allow must be a boolean, not string`}},
		"each wrong key on its own line": {rego: `decision := {
	"allow": true,
	"reason": 5,
	"credentials": "github",
	"intercept": "no",
}`, want: []string{
			"p.rego:5: decision: reason must be a string, not number",
			"p.rego:6: decision: credentials must be an array of credential names (strings) or {name, scope} objects, not string",
			"p.rego:7: decision: intercept must be a boolean, not string",
		}},
		"credentials of numbers": {rego: `decision := {"allow": true, "credentials": [1]}`, want: []string{"p.rego:3: decision: credentials must be an array of credential names (strings) or {name, scope} objects, not array<number>"}},
		"a builtin's result":     {rego: `decision := {"allow": true, "reason": count([1])}`, want: []string{"p.rego:3: decision: reason must be a string, not number"}},
		"through a variable": {rego: `decision := d if {
	d := {"allow": 1}
}`, want: []string{"p.rego:4: decision: allow must be a boolean, not number"}},
		"through another rule": {rego: `decision := helper

helper := {"allow": true, "intercept": "no"}`, want: []string{"p.rego:3: decision: intercept must be a boolean, not string"}},
		"else branch": {rego: `decision := {"allow": true} if {
	input.x
} else := {"allow": "no"}`, want: []string{"p.rego:5: decision: allow must be a boolean, not string"}},
		"not an object":     {rego: `decision := true`, want: []string{"p.rego:3: decision: must be an object, not boolean"}},
		"a set":             {rego: `decision contains "allow"`, want: []string{"p.rego:3: decision: must be one object (decision := {...}), not a set (decision contains ...)"}},
		"a function":        {rego: `decision(x) := {"allow": x}`, want: []string{"p.rego:3: decision: must be a value, not a function"}},
		"built key by key":  {rego: "decision.allow := \"yes\"\n\ndecision.reason := \"r\"", want: []string{"p.rego:3: decision: allow must be a boolean, not string"}},
		"no decision":       {rego: `x := 1`, want: []string{"policies: no rule defines data.broker.decision"}},
		"forbidden builtin": {rego: `decision := {"allow": true, "r": http.send({})}`, want: []string{"p.rego:3: rego_type_error: undefined function http.send"}},
		"syntax error":      {rego: `decision := {`, want: []string{"p.rego:4: rego_parse_error", "p.rego:4: rego_parse_error"}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			fsys := fstest.MapFS{"p.rego": {Data: []byte("package broker\n\n" + c.rego + "\n")}}
			got := Check(context.Background(), fsys, "policies")
			if len(got) != len(c.want) {
				t.Fatalf("got %d problems, want %d: %v", len(got), len(c.want), got)
			}
			for i, w := range c.want {
				g := strings.TrimPrefix(got[i].Error(), "policies/")
				if !strings.HasPrefix(g, w) && !strings.HasPrefix(got[i].Error(), w) {
					t.Errorf("problem %d: got %q, want %q", i, got[i], w)
				}
			}
		})
	}
}

func TestCheckNamesFilesUnderTheDirectory(t *testing.T) {
	fsys := fstest.MapFS{
		"broker.rego":  {Data: []byte("package broker\n\ndecision := {\"allow\": lib.x}\n\nimport data.lib\n")},
		"lib/lib.rego": {Data: []byte("package lib\n\nx := \"yes\"\n")},
		"bad.json":     {Data: []byte("{\n\n  nope\n}")},
	}
	got := Check(context.Background(), fsys, "/etc/broker/policies")
	if len(got) != 1 || !strings.HasPrefix(got[0].Error(), "/etc/broker/policies/bad.json:3: invalid JSON") {
		t.Fatalf("got %v", got)
	}
	delete(fsys, "bad.json")
	got = Check(context.Background(), fsys, "/etc/broker/policies")
	if len(got) != 1 || got[0].Error() != "/etc/broker/policies/broker.rego:3: decision: allow must be a boolean, not string" {
		t.Fatalf("got %v", got)
	}
}

func TestEffective(t *testing.T) {
	request := map[string]any{"phase": "request", "request": map[string]any{"scheme": "https", "host": "api.example.com"}, "credentials": []any{"gh"}}
	plain := map[string]any{"phase": "request", "request": map[string]any{"scheme": "http", "host": "api.example.com"}, "credentials": []any{"gh"}}
	connect := map[string]any{"phase": "connect", "request": map[string]any{"host": "api.example.com"}, "credentials": []any{"gh"}}
	cases := map[string]struct {
		input  map[string]any
		d      Decision
		allow  bool
		reason string
	}{
		"bound credential":                     {input: request, d: Decision{Allow: true, Credentials: []string{"gh"}}, allow: true},
		"unbound credential":                   {input: request, d: Decision{Allow: true, Credentials: []string{"aws"}}, reason: ReasonCredentialNotBound},
		"no credentials in input":              {input: map[string]any{"phase": "request", "request": map[string]any{"scheme": "https"}}, d: Decision{Allow: true, Credentials: []string{"gh"}}, reason: ReasonCredentialNotBound},
		"credential over http":                 {input: plain, d: Decision{Allow: true, Credentials: []string{"gh"}}, reason: ReasonCredentialsNeedHTTPS},
		"http without credentials":             {input: plain, d: Decision{Allow: true}, allow: true},
		"opaque tunnel with credentials":       {input: connect, d: Decision{Allow: true, Credentials: []string{"gh"}}, reason: ReasonOpaqueTunnelCredentials},
		"intercepted connect with credentials": {input: connect, d: Decision{Allow: true, Intercept: true, Credentials: []string{"gh"}}, allow: true},
		"connect":                              {input: connect, d: Decision{Allow: true, Intercept: true}, allow: true},
		"deny stays":                           {input: request, d: Decision{Reason: "no"}, reason: "no"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			got := Effective(c.input, c.d)
			if got.Allow != c.allow || got.Reason != c.reason || (!got.Allow && got.Credentials != nil) {
				t.Fatalf("got %+v", got)
			}
		})
	}
}

func TestRunTestsWithData(t *testing.T) {
	fsys := fstest.MapFS{
		"p.rego":      {Data: []byte(dataPolicy)},
		"data.yaml":   {Data: []byte("hosts: {allowed: [api.example.com]}\nteam: {name: t}\n")},
		"p_test.rego": {Data: []byte("package broker_test\n\nimport data.broker\n\ntest_allowed if broker.decision.allow with input as {\"request\": {\"host\": \"api.example.com\"}}\n\ntest_fails if broker.decision.allow with input as {\"request\": {\"host\": \"x\"}}\n\ntest_no_network if http.send({\"method\": \"GET\", \"url\": \"http://127.0.0.1:1\"})\n")},
	}
	if _, err := RunTests(context.Background(), fsys, "", TestOptions{}); err == nil || !strings.Contains(err.Error(), "p_test.rego:9") {
		t.Fatalf("a test using http.send compiled: %v", err)
	}
	fsys["p_test.rego"].Data = []byte(strings.Split(string(fsys["p_test.rego"].Data), "\ntest_no_network")[0])
	ch, err := RunTests(context.Background(), fsys, "", TestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	results := map[string]bool{}
	for r := range ch {
		results[r.Name] = r.Pass()
	}
	if len(results) != 2 || !results["test_allowed"] || results["test_fails"] {
		t.Fatalf("results: %v", results)
	}
	if _, err := RunTests(context.Background(), fstest.MapFS{"p.rego": {Data: []byte(dataPolicy)}}, "", TestOptions{}); err == nil {
		t.Fatal("no tests is not an error")
	}
}
