package policy

import (
	"context"
	"strings"
	"testing"
	"testing/fstest"
	"time"
)

func TestAskParsing(t *testing.T) {
	cases := map[string]struct {
		rego    string
		ask     bool
		reason  string
		timeout time.Duration
		scopes  string
		creds   string
	}{
		"ask":                {rego: `decision := {"ask": {"reason": "push to main", "timeout": "90s", "scopes": ["once"]}, "credentials": ["gh"]}`, ask: true, reason: "push to main", timeout: 90 * time.Second, scopes: "once", creds: "gh"},
		"ask defaults":       {rego: `decision := {"ask": {}}`, ask: true, scopes: "once,agent,always"},
		"decision reason":    {rego: `decision := {"ask": {"reason": "a"}, "reason": "b"}`, ask: true, reason: "b", scopes: "once,agent,always"},
		"capped timeout":     {rego: `decision := {"ask": {"timeout": "5h"}}`, ask: true, timeout: MaxAskTimeout, scopes: "once,agent,always"},
		"allow true and ask": {rego: `decision := {"allow": true, "ask": {}}`, reason: ReasonMalformed + ": allow is true together with ask"},
		"allow false wins":   {rego: `decision := {"allow": false, "ask": {}, "reason": "no"}`, reason: "no"},
		"ask not object":     {rego: `decision := {"ask": true}`, reason: ReasonMalformed + ": ask is not an object"},
		"bad timeout":        {rego: `decision := {"ask": {"timeout": "soon"}}`, reason: ReasonMalformed + `: ask.timeout is not a positive duration such as "2m"`},
		"negative timeout":   {rego: `decision := {"ask": {"timeout": "-1m"}}`, reason: ReasonMalformed + `: ask.timeout is not a positive duration such as "2m"`},
		"bad scope":          {rego: `decision := {"ask": {"scopes": ["forever"]}}`, reason: ReasonMalformed + `: ask.scopes may hold only "once", "agent" and "always"`},
		"empty scopes":       {rego: `decision := {"ask": {"scopes": []}}`, reason: ReasonMalformed + `: ask.scopes is not a non-empty list`},
		"unknown key":        {rego: `decision := {"ask": {"why": "x"}}`, reason: ReasonMalformed + `: ask has an unknown key "why"`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			d, err := engine(t, "package broker\n\n"+c.rego+"\n").Decide(context.Background(), req())
			if err != nil {
				t.Fatal(err)
			}
			if d.Allow || (d.Ask != nil) != c.ask || d.Reason != c.reason || strings.Join(d.Credentials, ",") != c.creds {
				t.Fatalf("got %+v", d)
			}
			if c.ask && (d.Ask.Timeout != c.timeout || strings.Join(d.Ask.Scopes, ",") != c.scopes) {
				t.Fatalf("ask: %+v", d.Ask)
			}
		})
	}
}

func TestEffectiveChecksAnAsk(t *testing.T) {
	in := map[string]any{"phase": PhaseRequest, "request": map[string]any{"scheme": "https"}, "credentials": []any{"gh"}}
	d := Effective(in, Decision{Ask: &Ask{}, Credentials: []string{"other"}})
	if d.Ask != nil || d.Reason != ReasonCredentialNotBound {
		t.Fatalf("an ask for a credential not bound: %+v", d)
	}
	d = Effective(in, Decision{Ask: &Ask{}, Credentials: []string{"gh"}})
	if d.Ask == nil {
		t.Fatalf("a sound ask: %+v", d)
	}
}

func TestCheckAcceptsAsk(t *testing.T) {
	fsys := fstest.MapFS{"p.rego": {Data: []byte("package broker\n\ndecision := {\"ask\": {\"reason\": \"x\"}}\n")}}
	if errs := Check(context.Background(), fsys, "p"); len(errs) != 0 {
		t.Fatal(errs)
	}
	fsys = fstest.MapFS{"p.rego": {Data: []byte("package broker\n\ndecision := {\"ask\": \"x\"}\n")}}
	errs := Check(context.Background(), fsys, "p")
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "ask must be an object") {
		t.Fatal(errs)
	}
}
