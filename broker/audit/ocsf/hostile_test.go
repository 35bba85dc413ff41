package ocsf

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/broker/audit"
)

// TestHostileText: what an agent, a sandbox's DNS query or an upstream controls (a path, a
// name with bytes that are not UTF-8, quotes and newlines, a float that is not a number)
// never costs the event or splits its line: each decision is still its class, on lines of
// their own, valid against the schema.
func TestHostileText(t *testing.T) {
	s := loadSchema(t)
	enc := New(Options{})
	for name, e := range map[string]audit.Event{
		"dns name not UTF-8": {RequestID: "h1", Agent: "a", SourceIP: "10.0.0.5", Phase: "dns", Method: "A", Host: "x\xff\xfe.example\n{\"class_uid\":1}",
			Decision: audit.Deny, Reason: "refused"},
		"path with a line of its own": {RequestID: "h2", Agent: "a", SourceIP: "10.0.0.5", Phase: "request", Method: "GET", Scheme: "https",
			Host: "api.example.com", Port: 443, Path: "/x\n{\"class_uid\":2004}\"\\\xc3", Decision: audit.Deny, Reason: "no \xff"},
		"cost not a number": {RequestID: "h3", Agent: "a", SourceIP: "10.0.0.5", Phase: "request", Method: "POST", Scheme: "https",
			Host: "api.openai.com", Port: 443, Path: "/v1/chat/completions", Decision: audit.Allow, Status: 200,
			LLM: &audit.LLMCall{Provider: "openai", Model: "m\xff", Cost: math.NaN(), Reported: true}},
		"input not UTF-8": {RequestID: "h4", Agent: "a", SourceIP: "10.0.0.5", Phase: "request", Method: "GET", Scheme: "https",
			Host: "api.example.com", Port: 443, Path: "/", Decision: audit.Allow, InputLevel: audit.InputFull,
			Input: map[string]any{"request": map[string]any{"body": "\xff\xfe", "inf": math.Inf(1)}}},
		"ssh ref and repository": {RequestID: "h5", Agent: "a", SourceIP: "10.0.0.5", Phase: "ssh", Scheme: "ssh", Host: "git.test",
			Port: 22, Decision: audit.Deny, Reason: "no",
			SSH: &audit.SSHSession{Host: "git.test", Port: 22, User: "git\n", Service: "push", Repository: "o/r\n{\"class_uid\":2004}\xff",
				Refs: []audit.SSHRef{{Name: "refs/heads/\xc3\n\"", Old: "0", New: "1"}}}},
		"postgres names and statement": {RequestID: "h6", Agent: "a", SourceIP: "10.0.0.5", Phase: "postgres", Method: "SELECT\n\"",
			Scheme: "postgres", Host: "db.test", Port: 5432, Path: "/d", Decision: audit.Deny, Reason: "no \xff",
			Postgres: &audit.PostgresCall{Database: "d\n{\"class_uid\":2004}\xff", Upstream: "u\"", User: "\xc3",
				ApplicationName: "psql\n{\"class_uid\":1}", Statement: &audit.PostgresStatement{Kind: "read\x00", Command: "SELECT\n\"",
					Tables: []string{"t\xff\n"}, Functions: []string{"f\"\\"}, Text: "SELECT '\n{\"class_uid\":2004}\xff'"}}},
		"postgres connection without a database": {RequestID: "h7", Phase: "postgres", Method: "CONNECT", Scheme: "postgres",
			Decision: audit.Deny, Reason: "no", Postgres: &audit.PostgresCall{}},
	} {
		t.Run(name, func(t *testing.T) {
			out := enc.Decision(nil, &e, meta)
			if n := bytes.Count(out, []byte("\n")); n != len(findingsOf(&e))+1 {
				t.Fatalf("%d lines: %s", n, out)
			}
			raw, evs := lines(t, out)
			for i := range raw {
				for _, p := range s.Validate(raw[i]) {
					t.Errorf("line %d: %s", i, p)
				}
				want(t, evs[i], "metadata.correlation_uid", e.RequestID)
			}
			if c, _, _ := classOf(&e); evs[0]["class_uid"] != float64(c) {
				t.Errorf("class %v, want %d", evs[0]["class_uid"], c)
			}
			if !json.Valid(out[:bytes.IndexByte(out, '\n')]) || strings.Contains(string(out), "encoding failed") {
				t.Errorf("event lost: %s", out)
			}
		})
	}
}

// TestPostgresStatementText: a statement's text, which can carry what the agent put in its
// literals, is only in unmapped.postgres.statement.text, as the Postgres front door gave it
// (literals replaced unless include_input is full): never in the message, the api, the
// resources or a finding's description.
func TestPostgresStatementText(t *testing.T) {
	const canary = "CANARY-pg-literal-3f9a"
	e := audit.Event{RequestID: "pg-1", Agent: "a", SourceIP: "10.0.0.5", Phase: "postgres", Method: "UPDATE", Scheme: "postgres",
		Host: "db.test", Port: 5432, Path: "/app", Decision: audit.Deny, Reason: "no updates", WouldDeny: false,
		Postgres: &audit.PostgresCall{Database: "app", Upstream: "app-db", Role: "writer", LeaseID: "database/creds/writer/x1",
			Statement: &audit.PostgresStatement{Kind: "write", Command: "UPDATE", Tables: []string{"users"},
				Text: "UPDATE users SET token = '" + canary + "'"}}}
	raw, evs := lines(t, New(Options{}).Decision(nil, &e, meta))
	for i, r := range raw {
		if n := strings.Count(string(r), canary); n != 1 {
			t.Errorf("line %d carries the text %d times: %s", i, n, r)
		}
		want(t, evs[i], "unmapped.postgres.statement.text", e.Postgres.Statement.Text)
		for _, k := range []string{"message", "status_detail", "api", "resources", "finding_info", "evidences"} {
			if b, _ := json.Marshal(evs[i][k]); strings.Contains(string(b), canary) {
				t.Errorf("line %d: %s carries the statement text: %s", i, k, b)
			}
		}
	}
}
