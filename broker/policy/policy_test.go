package policy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
)

func engine(t *testing.T, rego string) *Engine {
	t.Helper()
	e, err := New(context.Background(), fstest.MapFS{"p.rego": {Data: []byte(rego)}})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func req() *Input {
	return &Input{Phase: PhaseRequest, AgentID: "a", Method: "GET", Scheme: "https", Host: "api.example.com", Port: 443, Path: "/x"}
}

func TestDecisionParsing(t *testing.T) {
	cases := map[string]struct {
		rego        string
		allow       bool
		reason      string
		creds       []string
		noIntercept bool
	}{
		"allow with credentials": {rego: `decision := {"allow": true, "credentials": ["gh"]}`, allow: true, creds: []string{"gh"}},
		"deny with reason":       {rego: `decision := {"allow": false, "reason": "no"}`, reason: "no"},
		"undefined":              {rego: `decision := {"allow": true} if false`, reason: ReasonUndefined},
		"allow missing":          {rego: `decision := {"credentials": ["gh"]}`, reason: ReasonNoAllow},
		"allow not a boolean":    {rego: `decision := {"allow": "yes"}`, reason: ReasonMalformed + ": allow is not a boolean"},
		"not an object":          {rego: `decision := true`, reason: ReasonMalformed + ": not an object"},
		"credentials not a list": {rego: `decision := {"allow": true, "credentials": "gh"}`, reason: ReasonMalformed + ": credentials is not a list"},
		"credential not a name":  {rego: `decision := {"allow": true, "credentials": [1]}`, reason: ReasonMalformed + ": credentials must be names or {name, scope} objects"},
		"scoped grant":           {rego: `decision := {"allow": true, "credentials": ["gh", {"name": "app", "scope": {"repositories": ["r1"]}}]}`, allow: true, creds: []string{"gh", "app"}},
		"scoped grant, no name":  {rego: `decision := {"allow": true, "credentials": [{"scope": {}}]}`, reason: ReasonMalformed + ": a credentials item without a name"},
		"scope not an object":    {rego: `decision := {"allow": true, "credentials": [{"name": "app", "scope": ["r1"]}]}`, reason: ReasonMalformed + `: the scope of credential "app" is not an object`},
		"grant with unknown key": {rego: `decision := {"allow": true, "credentials": [{"name": "app", "scopes": {}}]}`, reason: ReasonMalformed + `: credentials item "app" has an unknown key "scopes"`},
		"granted twice":          {rego: `decision := {"allow": true, "credentials": ["app", {"name": "app"}]}`, reason: ReasonMalformed + `: credential "app" is granted twice`},
		"intercept false":        {rego: `decision := {"allow": true, "intercept": false}`, allow: true, noIntercept: true},
		"intercept not boolean":  {rego: `decision := {"allow": true, "intercept": "no"}`, reason: ReasonMalformed + ": intercept is not a boolean"},
		"deny drops credentials": {rego: `decision := {"allow": false, "credentials": ["gh"]}`, reason: ReasonNoAllow},
		"uses the input":         {rego: `decision := {"allow": input.request.host == "api.example.com"}`, allow: true},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			d, err := engine(t, "package broker\n\n"+c.rego+"\n").Decide(context.Background(), req())
			if err != nil {
				t.Fatal(err)
			}
			if d.Allow != c.allow || d.Reason != c.reason || strings.Join(d.Credentials, ",") != strings.Join(c.creds, ",") || (d.Allow && d.Intercept == c.noIntercept) {
				t.Fatalf("got %+v", d)
			}
			if d.Revision == "" {
				t.Fatal("no revision")
			}
			if name == "scoped grant" {
				if sc := d.Scopes["app"]; len(d.Scopes) != 1 || fmt.Sprint(sc["repositories"]) != "[r1]" {
					t.Fatalf("scopes: %v", d.Scopes)
				}
			}
		})
	}
}

func TestEvaluationErrorsFailClosed(t *testing.T) {
	cases := map[string]string{
		"conflicting decisions": `decision := {"allow": true}
decision := {"allow": false}`,
		"builtin error": `decision := {"allow": to_number("x") > 0}`,
	}
	for name, rego := range cases {
		t.Run(name, func(t *testing.T) {
			d, err := engine(t, "package broker\n\n"+rego+"\n").Decide(context.Background(), req())
			if !errors.Is(err, ErrEvaluation) || d.Allow {
				t.Fatalf("got %+v, %v; want ErrEvaluation and no allow", d, err)
			}
		})
	}
}

func TestForbiddenBuiltinsDoNotCompile(t *testing.T) {
	for _, call := range []string{`http.send({"method": "GET", "url": "http://127.0.0.1:1"})`, `net.lookup_ip_addr("localhost")`, `opa.runtime()`} {
		_, err := New(context.Background(), fstest.MapFS{"p.rego": {Data: []byte("package broker\n\ndecision := {\"allow\": true, \"x\": " + call + "}\n")}})
		if err == nil || !strings.Contains(err.Error(), "p.rego:3") {
			t.Errorf("%s: want a compile error with file:line, got %v", call, err)
		}
	}
}

func TestTestFilesAreNotLoaded(t *testing.T) {
	e := engine(t, "package broker\n\ndecision := {\"allow\": true}\n")
	fsys := fstest.MapFS{
		"p.rego":      {Data: []byte("package broker\n\ndecision := {\"allow\": true}\n")},
		"p_test.rego": {Data: []byte("package broker\n\ndecision := {\"allow\": false}\n")}, // would conflict
	}
	if err := e.Load(context.Background(), fsys); err != nil {
		t.Fatal(err)
	}
	if d, err := e.Decide(context.Background(), req()); err != nil || !d.Allow {
		t.Fatalf("%+v %v", d, err)
	}
}

func TestLoadKeepsLastGoodPolicy(t *testing.T) {
	e := engine(t, "package broker\n\ndecision := {\"allow\": true}\n")
	rev := e.Revision()
	err := e.Load(context.Background(), fstest.MapFS{"p.rego": {Data: []byte("package broker\n\ndecision := {\n")}})
	if err == nil {
		t.Fatal("broken policy compiled")
	}
	if e.Revision() != rev {
		t.Fatal("revision changed after a failed load")
	}
	if d, _ := e.Decide(context.Background(), req()); !d.Allow {
		t.Fatal("last good policy lost")
	}
}

func TestWatchReloads(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) {
		if err := os.WriteFile(filepath.Join(dir, "p.rego"), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("package broker\n\ndecision := {\"allow\": false}\n")
	e, err := New(context.Background(), os.DirFS(dir))
	if err != nil {
		t.Fatal(err)
	}
	reloads := watch(t, e, dir)
	write("package broker\n\ndecision := {\"allow\": true}\n")
	if err := <-reloads; err != nil {
		t.Fatal(err)
	}
	if d, _ := e.Decide(context.Background(), req()); !d.Allow {
		t.Fatal("reload did not take effect")
	}
}

// watch starts watching dir (registered before it returns, so no later write is missed) and
// returns the reload results. The watcher stops when the test ends.
func watch(t *testing.T, e *Engine, dir string) <-chan error {
	t.Helper()
	run, err := e.WatchDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	reloads := make(chan error, 10)
	go func() { _ = run(ctx, func(_ string, err error) { reloads <- err }) }()
	return reloads
}
