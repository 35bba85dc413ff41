package ocsf

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/audit/ocsf/ocsfschema"
)

func loadSchema(t testing.TB) *ocsfschema.Schema {
	t.Helper()
	s, err := ocsfschema.Load(ocsfschema.Dir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var (
	t0   = time.Date(2026, 12, 5, 22, 0, 0, 0, time.UTC)
	meta = audit.Meta{Time: t0.Add(1500 * time.Millisecond), Duration: 1500 * time.Millisecond, Instance: "broker-a"}
)

// cases are decisions of every kind, each with the classes its lines must have, in order.
var cases = map[string]struct {
	ev      audit.Event
	classes []int
	check   func(t *testing.T, evs []map[string]any)
}{
	"http allowed": {
		ev: audit.Event{RequestID: "r1", Agent: "coder-1", SourceIP: "10.0.0.5", Phase: "request", Method: "GET", Scheme: "https",
			Host: "api.example.com", Port: 443, Path: "/repos/o/r", Decision: audit.Allow, Credentials: []string{"github"},
			Status: 200, BytesIn: 10, BytesOut: 2000, Start: t0, PolicyRevision: "rev1", DecisionID: "d1", Mode: "explicit",
			PolicyMode: "enforce", TraceID: "4bf92f3577b34da6a3ce929d0e0e4736"},
		classes: []int{classHTTPActivity},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "activity_id", 3.0)
			want(t, evs[0], "http_request.url.url_string", "https://api.example.com/repos/o/r")
			want(t, evs[0], "http_response.code", 200.0)
			want(t, evs[0], "actor.user.name", "coder-1")
			want(t, evs[0], "src_endpoint.ip", "10.0.0.5")
			want(t, evs[0], "dst_endpoint.hostname", "api.example.com")
			want(t, evs[0], "trace.uid", "4bf92f3577b34da6a3ce929d0e0e4736")
			want(t, evs[0], "disposition_id", 1.0)
			want(t, evs[0], "time", float64(meta.Time.UnixMilli()))
			want(t, evs[0], "duration", 1500.0)
			want(t, evs[0], "unmapped.credentials", []any{"github"})
			want(t, evs[0], "metadata.reporter.name", "broker-a")
			want(t, evs[0], "unmapped.policy_revision", "rev1")
			want(t, evs[0], "metadata.correlation_uid", "r1")
		},
	},
	"http denied": {
		ev: audit.Event{RequestID: "r2", Agent: "coder-1", SourceIP: "10.0.0.5", Phase: "request", Method: "DELETE", Scheme: "https",
			Host: "api.example.com", Port: 443, Path: "/repos/o/r", Decision: audit.Deny, Reason: "deletes are not allowed",
			Status: 403, Start: t0, DecisionID: "d2", Mode: "explicit", PolicyMode: "enforce"},
		classes: []int{classHTTPActivity, classDetectionFinding},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "action_id", 2.0)
			want(t, evs[0], "disposition_id", 2.0)
			want(t, evs[0], "status_detail", "deletes are not allowed")
			want(t, evs[1], "finding_info.types", []any{"denied"})
			want(t, evs[1], "finding_info.analytic.uid", "d2")
			want(t, evs[1], "finding_info.desc", "deletes are not allowed")
			want(t, evs[1], "evidences.0.http_request.http_method", "DELETE")
			want(t, evs[1], "metadata.correlation_uid", "r2")
			want(t, evs[1], "actor.user.uid", "coder-1")
		},
	},
	"monitor would deny": {
		ev: audit.Event{RequestID: "r3", Agent: "a", SourceIP: "10.0.0.5", Phase: "request", Method: "PURGE", Scheme: "http",
			Host: "10.1.2.3", Port: 8080, Path: "/", Decision: audit.Allow, WouldDeny: true, Status: 200, Start: t0, PolicyMode: "monitor"},
		classes: []int{classHTTPActivity, classDetectionFinding},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "activity_id", 99.0)
			want(t, evs[0], "dst_endpoint.ip", "10.1.2.3")
			want(t, evs[0], "http_request.url.url_string", "http://10.1.2.3:8080/")
			want(t, evs[1], "finding_info.types", []any{"would_deny"})
			want(t, evs[1], "disposition_id", 15.0)
		},
	},
	"connect allowed": {
		ev: audit.Event{RequestID: "r4", Agent: "a", SourceIP: "10.0.0.5", Phase: "connect", Method: "CONNECT", Host: "api.example.com",
			Port: 443, Decision: audit.Allow, Status: 200, BytesIn: 5, BytesOut: 6, Start: t0, TraceID: "t"},
		classes: []int{classNetworkActivity},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "activity_id", 1.0)
			want(t, evs[0], "connection_info.direction_id", 2.0)
			want(t, evs[0], "traffic.bytes_out", 6.0)
			want(t, evs[0], "unmapped.trace_id", "t")
		},
	},
	"refused flow": {
		ev: audit.Event{RequestID: "r5", SourceIP: "10.0.0.9", Phase: "connect", Method: "UDP", Scheme: "udp", Host: "8.8.8.8",
			Port: 443, Decision: audit.Deny, Reason: "UDP is not forwarded", Start: t0, Mode: "transparent"},
		classes: []int{classNetworkActivity, classDetectionFinding},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "activity_id", 5.0)
			want(t, evs[0], "connection_info.protocol_name", "udp")
			want(t, evs[0], "actor", nil)
			want(t, evs[1], "evidences.0.dst_endpoint.ip", "8.8.8.8")
		},
	},
	"dns refused": {
		ev: audit.Event{RequestID: "r6", Agent: "a", SourceIP: "10.0.0.5", Phase: "dns", Method: "AAAA", Scheme: "dns",
			Host: "exfil.example.net", Port: 53, Decision: audit.Deny, Reason: "not allowed", Start: t0},
		classes: []int{classDNSActivity, classDetectionFinding},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "query.hostname", "exfil.example.net")
			want(t, evs[0], "query.type", "AAAA")
			want(t, evs[0], "rcode_id", 5.0)
			want(t, evs[1], "evidences.0.query.hostname", "exfil.example.net")
		},
	},
	"dns answered": {
		ev: audit.Event{RequestID: "r7", Agent: "a", SourceIP: "10.0.0.5", Phase: "dns", Method: "A", Scheme: "dns",
			Host: "api.example.com", Port: 53, Decision: audit.Allow, Start: t0},
		classes: []int{classDNSActivity},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "rcode_id", 0.0)
			want(t, evs[0], "rcode", "NoError")
		},
	},
	"llm call": {
		ev: audit.Event{RequestID: "r8", Agent: "a", SourceIP: "10.0.0.5", Phase: "request", Method: "POST", Scheme: "https",
			Host: "api.openai.com", Port: 443, Path: "/v1/chat/completions", Decision: audit.Allow, Status: 200, Start: t0,
			LLM:     &audit.LLMCall{Provider: "openai", Model: "gpt-4o", TokensIn: 100, TokensOut: 20, TokensCached: 5, Cost: 0.0125, Reported: true},
			TraceID: "abc"},
		classes: []int{classAPIActivity},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "ai_model.name", "gpt-4o")
			want(t, evs[0], "ai_model.ai_provider", "openai")
			want(t, evs[0], "message_context.prompt_tokens", 100.0)
			want(t, evs[0], "message_context.completion_tokens", 20.0)
			want(t, evs[0], "message_context.total_tokens", 120.0)
			want(t, evs[0], "unmapped.llm.cost", 0.0125)
			want(t, evs[0], "api.operation", "POST /v1/chat/completions")
			want(t, evs[0], "trace.uid", "abc")
		},
	},
	"llm over budget": {
		ev: audit.Event{RequestID: "r9", Agent: "a", SourceIP: "10.0.0.5", Phase: "request", Method: "POST", Scheme: "https",
			Host: "api.anthropic.com", Port: 443, Path: "/v1/messages", Decision: audit.Deny, Reason: "budget daily exceeded",
			Status: 429, Start: t0, Budget: "daily", LLM: &audit.LLMCall{Provider: "anthropic", Model: "claude"}},
		classes: []int{classAPIActivity, classDetectionFinding},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "message_context.prompt_tokens", nil) // usage not reported
			want(t, evs[1], "finding_info.types", []any{"budget_exceeded"})
			want(t, evs[1], "finding_info.analytic.name", "capbroker budget daily")
			want(t, evs[1], "unmapped.budget", "daily")
		},
	},
	"mcp tool": {
		ev: audit.Event{RequestID: "r10", Agent: "a", SourceIP: "10.0.0.5", Phase: "request", Method: "POST", Scheme: "https",
			Host: "mcp.example.com", Port: 443, Path: "/mcp", Decision: audit.Allow, Status: 200, Start: t0,
			MCP: &audit.MCPCall{Method: "tools/call", Tool: "search", Batch: []audit.MCPCall{{Method: "tools/call", Tool: "search"}, {Method: "tools/list"}}}},
		classes: []int{classAPIActivity},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "api.operation", "tools/call")
			want(t, evs[0], "resources.0.name", "search")
			want(t, evs[0], "unmapped.mcp.batch.1.method", "tools/list")
		},
	},
	"jsonrpc unidentified": {
		ev: audit.Event{RequestID: "r11", Phase: "request", Method: "POST", Scheme: "https", Host: "rpc.example.com", Port: 443,
			Path: "/", Decision: audit.Challenge, Status: 407, Start: t0, JSONRPC: &audit.JSONRPCCall{Method: "eth_call"}},
		classes: []int{classAPIActivity},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "api.operation", "eth_call")
			want(t, evs[0], "actor.user.name", "unidentified")
			want(t, evs[0], "disposition_id", 23.0)
		},
	},
	"secret redacted": {
		ev: audit.Event{RequestID: "r12", Agent: "a", SourceIP: "10.0.0.5", Phase: "request", Method: "GET", Scheme: "https",
			Host: "echo.example.com", Port: 443, Path: "/echo", Decision: audit.Allow, Status: 200, Start: t0, Redacted: 2,
			Credentials: []string{"echo"}},
		classes: []int{classHTTPActivity, classDetectionFinding},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[1], "finding_info.types", []any{"secret_redacted"})
			want(t, evs[1], "severity_id", 4.0)
			want(t, evs[1], "is_alert", true)
			want(t, evs[1], "unmapped.redacted", 2.0)
		},
	},
	"upstream failure": {
		ev: audit.Event{RequestID: "r14", Agent: "a", SourceIP: "10.0.0.5", Phase: "request", Method: "GET", Scheme: "https",
			Host: "api.example.com", Port: 443, Path: "/", Decision: audit.Deny, Reason: "the upstream could not be reached",
			Error: "dial tcp: connection refused", Status: 502, Start: t0},
		classes: []int{classHTTPActivity}, // no finding: nothing was refused
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "disposition", "Error")
			want(t, evs[0], "action_id", nil)
			want(t, evs[0], "status", "Failure")
			want(t, evs[0], "unmapped.error", "dial tcp: connection refused")
		},
	},
	"ssh push allowed": {
		ev: audit.Event{RequestID: "r15", Agent: "coder-1", SourceIP: "10.0.0.5", Phase: "ssh", Scheme: "ssh", Host: "github.com",
			Port: 22, Decision: audit.Allow, BytesIn: 4096, BytesOut: 512, Start: t0, Mode: "transparent", TraceID: "t1",
			SSH: &audit.SSHSession{Host: "github.com", Port: 22, User: "git", Service: "push", Repository: "org/repo.git",
				Refs: []audit.SSHRef{{Name: "refs/heads/agent/x", Old: "0000", New: "abcd"}}}},
		classes: []int{classAPIActivity},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "activity_id", 3.0)
			want(t, evs[0], "activity_name", "Update")
			want(t, evs[0], "api.operation", "push")
			want(t, evs[0], "api.service.name", "github.com")
			want(t, evs[0], "resources.0.name", "org/repo.git")
			want(t, evs[0], "resources.0.type", "git_repository")
			want(t, evs[0], "dst_endpoint.hostname", "github.com")
			want(t, evs[0], "dst_endpoint.port", 22.0)
			want(t, evs[0], "http_request", nil)
			want(t, evs[0], "duration", 1500.0)
			want(t, evs[0], "trace.uid", "t1")
			want(t, evs[0], "unmapped.ssh.refs.0.name", "refs/heads/agent/x")
			want(t, evs[0], "unmapped.ssh.refs.0.new", "abcd")
			want(t, evs[0], "unmapped.ssh.user", "git")
			want(t, evs[0], "unmapped.bytes_in", 4096.0)
			want(t, evs[0], "unmapped.bytes_out", 512.0)
			want(t, evs[0], "message", "coder-1: allow push ssh://github.com:22/org/repo.git")
		},
	},
	"ssh fetch denied": {
		ev: audit.Event{RequestID: "r16", Agent: "coder-1", SourceIP: "10.0.0.5", Phase: "ssh", Scheme: "ssh", Host: "github.com",
			Port: 22, Decision: audit.Deny, Reason: "not your repository", Start: t0, DecisionID: "d16",
			SSH: &audit.SSHSession{Host: "github.com", Port: 22, User: "git", Service: "fetch", Repository: "other/secret.git"}},
		classes: []int{classAPIActivity, classDetectionFinding},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "activity_name", "Read")
			want(t, evs[0], "api.operation", "fetch")
			want(t, evs[0], "unmapped.ssh.refs", []any{})
			want(t, evs[0], "unmapped.bytes_in", nil)
			want(t, evs[1], "evidences.0.api.operation", "fetch")
			want(t, evs[1], "evidences.0.dst_endpoint.hostname", "github.com")
		},
	},
	"ssh shell refused": {
		ev: audit.Event{RequestID: "r17", Agent: "coder-1", SourceIP: "10.0.0.5", Phase: "ssh", Scheme: "ssh", Host: "github.com",
			Port: 22, Decision: audit.Deny, Reason: "an interactive shell is not allowed", Start: t0,
			SSH: &audit.SSHSession{Host: "github.com", Port: 22, User: "git"}},
		classes: []int{classAPIActivity, classDetectionFinding},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "activity_id", 99.0)
			want(t, evs[0], "api.operation", "none")
			want(t, evs[0], "resources", nil)
		},
	},
	"ssh channel refused": { // no git command: the connection, as a refused flow
		ev: audit.Event{RequestID: "r18", Agent: "coder-1", SourceIP: "10.0.0.5", Phase: "ssh", Scheme: "ssh", Host: "evil.example",
			Port: 22, Decision: audit.Deny, Reason: "not a git host the broker serves", Start: t0},
		classes: []int{classNetworkActivity, classDetectionFinding},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "activity_id", 5.0)
			want(t, evs[0], "message", "coder-1: deny ssh evil.example:22")
			want(t, evs[0], "unmapped.phase", "ssh")
		},
	},
	"postgres connection allowed": {
		ev: audit.Event{RequestID: "pg-0000002a", Agent: "coder-1", SourceIP: "10.0.0.5", Phase: "postgres", Method: "CONNECT",
			Scheme: "postgres", Host: "127.0.0.1", Port: 5432, Path: "/app", Decision: audit.Allow, BytesIn: 300, BytesOut: 9000,
			Start: t0, Mode: "explicit", PolicyMode: "enforce",
			Postgres: &audit.PostgresCall{Database: "app", Upstream: "app-db", User: "agent", ApplicationName: "psql", TLS: true,
				Role: "readonly", LeaseID: "database/creds/readonly/AbC123",
				Statements: map[string]int64{"read": 7, "write": 2, "other": 1}}},
		classes: []int{classAPIActivity},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "activity_id", 99.0)
			want(t, evs[0], "activity_name", "Connect")
			want(t, evs[0], "api.operation", "CONNECT")
			want(t, evs[0], "api.service.name", "app-db")
			want(t, evs[0], "api.request.uid", "pg-0000002a")
			want(t, evs[0], "dst_endpoint.ip", "127.0.0.1")
			want(t, evs[0], "dst_endpoint.port", 5432.0)
			want(t, evs[0], "resources", []any{map[string]any{"name": "app", "type": "database"}})
			want(t, evs[0], "http_request", nil)
			want(t, evs[0], "duration", 1500.0)
			want(t, evs[0], "message", "coder-1: allow CONNECT postgres://127.0.0.1:5432/app")
			want(t, evs[0], "unmapped.postgres", map[string]any{"database": "app", "upstream": "app-db", "user": "agent",
				"application_name": "psql", "tls": true, "role": "readonly", "lease_id": "database/creds/readonly/AbC123",
				"statements": map[string]any{"read": 7, "write": 2, "ddl": 0, "other": 1}})
			want(t, evs[0], "unmapped.bytes_in", 300.0)
			want(t, evs[0], "unmapped.bytes_out", 9000.0)
		},
	},
	"postgres statement denied": {
		ev: audit.Event{RequestID: "pg-0000002b", Agent: "coder-1", SourceIP: "10.0.0.5", Phase: "postgres", Method: "DELETE",
			Scheme: "postgres", Host: "db.internal", Port: 5432, Path: "/app", Decision: audit.Deny, Reason: "no deletes",
			Start: t0, DecisionID: "d20", PolicyRevision: "rev2",
			Postgres: &audit.PostgresCall{Database: "app", Upstream: "app-db", User: "agent", Role: "writer", LeaseID: "l-1",
				Statement: &audit.PostgresStatement{Kind: "write", Command: "DELETE", Tables: []string{"public.users"},
					Text: "DELETE FROM users WHERE id = ?"}}},
		classes: []int{classAPIActivity, classDetectionFinding},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "activity_id", 4.0)
			want(t, evs[0], "activity_name", "Delete")
			want(t, evs[0], "api.operation", "DELETE")
			want(t, evs[0], "dst_endpoint.hostname", "db.internal")
			want(t, evs[0], "status_detail", "no deletes")
			want(t, evs[0], "message", "coder-1: deny DELETE postgres://db.internal:5432/app")
			want(t, evs[0], "unmapped.postgres.statements", nil)
			want(t, evs[0], "unmapped.postgres.statement", map[string]any{"kind": "write", "command": "DELETE",
				"tables": []any{"public.users"}, "functions": []any{}, "text": "DELETE FROM users WHERE id = ?"})
			want(t, evs[0], "unmapped.bytes_in", nil)
			want(t, evs[1], "evidences.0.api.operation", "DELETE")
			want(t, evs[1], "evidences.0.api.service.name", "app-db")
			want(t, evs[1], "unmapped.postgres.statement.command", "DELETE")
			want(t, evs[1], "resources", []any{map[string]any{"name": "db.internal", "type": "host"},
				map[string]any{"name": "app", "type": "database"}})
		},
	},
	"postgres read monitored": {
		ev: audit.Event{RequestID: "pg-0000002c", Agent: "coder-1", SourceIP: "10.0.0.5", Phase: "postgres", Method: "SELECT",
			Scheme: "postgres", Host: "db.internal", Port: 5432, Path: "/app", Decision: audit.Allow, WouldDeny: true, Start: t0,
			Postgres: &audit.PostgresCall{Database: "app", Upstream: "app-db", Statement: &audit.PostgresStatement{Kind: "read",
				Command: "SELECT", Functions: []string{"pg_read_file"}, Text: "SELECT pg_read_file(?)"}}},
		classes: []int{classAPIActivity, classDetectionFinding},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "activity_id", 2.0)
			want(t, evs[0], "unmapped.postgres.statement.tables", []any{})
			want(t, evs[0], "unmapped.would_deny", true)
		},
	},
	"postgres insert and ddl": {
		ev: audit.Event{RequestID: "pg-0000002d", Agent: "coder-1", Phase: "postgres", Method: "INSERT", Scheme: "postgres",
			Host: "db.internal", Port: 5432, Path: "/app", Decision: audit.Deny, Reason: "no",
			Postgres: &audit.PostgresCall{Database: "app", Upstream: "app-db", Statement: &audit.PostgresStatement{Kind: "write",
				Command: "INSERT"}}},
		classes: []int{classAPIActivity, classDetectionFinding},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "activity_name", "Create")
			want(t, evs[0], "src_endpoint.name", "unknown") // required of API Activity
			ddl := audit.Event{Phase: "postgres", Method: "DROP TABLE", Postgres: &audit.PostgresCall{
				Statement: &audit.PostgresStatement{Kind: "ddl", Command: "DROP TABLE"}}}
			if _, id, name := classOf(&ddl); id != 99 || name != "Other" {
				t.Errorf("ddl: %d %s", id, name)
			}
			up := audit.Event{Phase: "postgres", Method: "UPDATE", Postgres: &audit.PostgresCall{
				Statement: &audit.PostgresStatement{Kind: "write", Command: "UPDATE"}}}
			if _, id, _ := classOf(&up); id != 3 {
				t.Errorf("update: %d", id)
			}
		},
	},
	"postgres no upstream": { // a database no upstream serves: refused before any upstream
		ev: audit.Event{RequestID: "pg-0000002e", Agent: "coder-1", SourceIP: "10.0.0.5", Phase: "postgres", Method: "CONNECT",
			Scheme: "postgres", Path: "/nope", Decision: audit.Deny, Reason: "no upstream database \"nope\" is configured", Start: t0,
			Postgres: &audit.PostgresCall{Database: "nope", User: "agent"}},
		classes: []int{classAPIActivity, classDetectionFinding},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "api.service", nil)
			want(t, evs[0], "dst_endpoint", nil)
			want(t, evs[0], "resources.0.name", "nope")
			want(t, evs[0], "unmapped.postgres.upstream", "")
			want(t, evs[0], "unmapped.postgres.role", nil)
			want(t, evs[0], "unmapped.postgres.lease_id", nil)
			want(t, evs[1], "resources", []any{map[string]any{"name": "nope", "type": "database"}})
		},
	},
	"aws graphql approval input": {
		ev: audit.Event{RequestID: "r13", Agent: "a", SourceIP: "10.0.0.5", Phase: "request", Method: "PATCH", Scheme: "https",
			Host: "s3.amazonaws.com", Port: 443, Path: "/b/k", Decision: audit.Allow, Status: 200, Start: t0,
			AWS: &audit.AWSCall{Service: "s3", Operation: "PutObject"}, GraphQL: &audit.GraphQLCall{Type: "query", Name: "Q"},
			Approval: &audit.Approval{ID: "ap-1", Outcome: "approved", By: "alice", Scope: "once"},
			Input:    map[string]any{"phase": "request"}, InputLevel: audit.InputFull, Via: "corp", TLSInspected: true},
		classes: []int{classHTTPActivity},
		check: func(t *testing.T, evs []map[string]any) {
			want(t, evs[0], "activity_id", 9.0)
			want(t, evs[0], "unmapped.aws.operation", "PutObject")
			want(t, evs[0], "unmapped.graphql.name", "Q")
			want(t, evs[0], "unmapped.approval.by", "alice")
			want(t, evs[0], "unmapped.input.phase", "request")
			want(t, evs[0], "unmapped.input_level", "full")
			want(t, evs[0], "unmapped.via", "corp")
		},
	},
}

var approvalCases = map[string]struct {
	ev       audit.ApprovalEvent
	activity float64
	check    func(t *testing.T, ev map[string]any)
}{
	"approve": {
		ev: audit.ApprovalEvent{Action: audit.ActionApprove, ID: "ap-1", RequestID: "r1", By: "alice", Scope: "once", Agent: "coder-1",
			Scheme: "https", Host: "api.example.com", Port: 443, Method: "POST", PathPrefix: "/repos", Comment: "ok"},
		activity: 1,
		check: func(t *testing.T, ev map[string]any) {
			want(t, ev, "user.name", "coder-1")
			want(t, ev, "actor.user.name", "alice")
			want(t, ev, "privileges", []any{"once POST https://api.example.com:443/repos"})
			want(t, ev, "metadata.correlation_uid", "r1")
			want(t, ev, "unmapped.comment", "ok")
			want(t, ev, "status_id", 1.0)
		},
	},
	"deny": {
		ev:       audit.ApprovalEvent{Action: audit.ActionDeny, ID: "ap-2", By: "bob", Scope: "once", Agent: "coder-1", Host: "x.example.com"},
		activity: 99,
		check: func(t *testing.T, ev map[string]any) {
			want(t, ev, "activity_name", "Deny")
			want(t, ev, "status_id", 2.0)
		},
	},
	"timeout": {
		ev:       audit.ApprovalEvent{Action: audit.ActionTimeout, ID: "ap-3", Agent: "coder-1", Host: "x.example.com"},
		activity: 99,
		check:    func(t *testing.T, ev map[string]any) { want(t, ev, "actor", nil) },
	},
	"grant for every agent": {
		ev: audit.ApprovalEvent{Action: audit.ActionGrant, ID: "g-1", By: "alice", Scope: "host", Host: "api.example.com",
			Expires: t0.Add(time.Hour)},
		activity: 1,
		check: func(t *testing.T, ev map[string]any) {
			want(t, ev, "user.name", "*")
			want(t, ev, "unmapped.expires", "2026-12-05T23:00:00Z")
		},
	},
	"revoke": {
		ev:       audit.ApprovalEvent{Action: audit.ActionRevoke, ID: "g-1", By: "alice", Scope: "host", Agent: "a", Host: "api.example.com"},
		activity: 2,
	},
}

// lines splits encoded output into its events, each a JSON object.
func lines(t *testing.T, b []byte) (raw [][]byte, evs []map[string]any) {
	t.Helper()
	if len(b) == 0 || b[len(b)-1] != '\n' {
		t.Fatalf("output does not end in a newline: %q", b)
	}
	for _, l := range bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n")) {
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatalf("not a JSON object: %s", l)
		}
		raw, evs = append(raw, l), append(evs, m)
	}
	return raw, evs
}

// want checks the value at a dotted path ("a.0.b" indexes arrays); nil wants it absent.
func want(t *testing.T, ev map[string]any, path string, v any) {
	t.Helper()
	var cur any = ev
	for _, k := range strings.Split(path, ".") {
		switch c := cur.(type) {
		case map[string]any:
			cur = c[k]
		case []any:
			i := int(k[0] - '0')
			if i >= len(c) {
				cur = nil
				break
			}
			cur = c[i]
		default:
			cur = nil
		}
	}
	g, _ := json.Marshal(cur)
	w, _ := json.Marshal(v)
	if string(g) != string(w) {
		t.Errorf("%s = %s, want %s", path, g, w)
	}
}

func TestDecisionClasses(t *testing.T) {
	s := loadSchema(t)
	enc := New(Options{ProductVersion: "1.2.3"})
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			raw, evs := lines(t, enc.Decision(nil, &c.ev, meta))
			var got []int
			for i, ev := range evs {
				got = append(got, int(ev["class_uid"].(float64)))
				for _, p := range s.Validate(raw[i]) {
					t.Errorf("line %d (class %v): %s", i, ev["class_uid"], p)
				}
				want(t, ev, "metadata.version", Version)
				want(t, ev, "metadata.product.version", "1.2.3")
				want(t, ev, "unmapped.decision", c.ev.Decision)
			}
			if !slices.Equal(got, c.classes) {
				t.Fatalf("classes %v, want %v", got, c.classes)
			}
			if c.check != nil {
				c.check(t, evs)
			}
		})
	}
}

func TestApprovalClass(t *testing.T) {
	s := loadSchema(t)
	enc := New(Options{})
	for name, c := range approvalCases {
		t.Run(name, func(t *testing.T) {
			raw, evs := lines(t, enc.Approval(nil, &c.ev, meta))
			if len(evs) != 1 {
				t.Fatalf("%d lines", len(evs))
			}
			for _, p := range s.Validate(raw[0]) {
				t.Error(p)
			}
			want(t, evs[0], "class_uid", float64(classUserAccess))
			want(t, evs[0], "activity_id", c.activity)
			want(t, evs[0], "metadata.reporter.name", "broker-a")
			if c.check != nil {
				c.check(t, evs[0])
			}
		})
	}
}

// TestSchemaCatchesMistakes: the validator fails an event that lacks a required attribute,
// has one of the wrong type or outside its enum, or one its class does not have.
func TestSchemaCatchesMistakes(t *testing.T) {
	s := loadSchema(t)
	c := cases["http denied"]
	raw, _ := lines(t, New(Options{}).Decision(nil, &c.ev, meta))
	good := raw[1] // the Detection Finding
	if p := s.Validate(good); len(p) > 0 {
		t.Fatalf("the good event fails: %v", p)
	}
	for name, tc := range map[string]struct {
		edit func(m map[string]any)
		want string
	}{
		"missing finding_info":      {func(m map[string]any) { delete(m, "finding_info") }, "finding_info: required, missing"},
		"missing finding_info.uid":  {func(m map[string]any) { delete(m["finding_info"].(map[string]any), "uid") }, "finding_info.uid: required, missing"},
		"missing metadata.version":  {func(m map[string]any) { delete(m["metadata"].(map[string]any), "version") }, "metadata.version: required, missing"},
		"missing time":              {func(m map[string]any) { delete(m, "time") }, "time: required, missing"},
		"time a string":             {func(m map[string]any) { m["time"] = "now" }, "time: not an integer"},
		"severity outside its enum": {func(m map[string]any) { m["severity_id"] = 7 }, "severity_id: 7 not in its enum"},
		"unknown attribute":         {func(m map[string]any) { m["agent"] = "a" }, "agent: not an attribute"},
		"wrong type_uid":            {func(m map[string]any) { m["type_uid"] = 200499 }, "type_uid 200499, want 200401"},
		"profile not declared":      {func(m map[string]any) { m["metadata"].(map[string]any)["profiles"] = []string{"host"} }, "not in metadata.profiles"},
		"evidence with nothing":     {func(m map[string]any) { m["evidences"] = []any{map[string]any{}} }, "needs at least one of"},
	} {
		t.Run(name, func(t *testing.T) {
			var m map[string]any
			_ = json.Unmarshal(good, &m)
			tc.edit(m)
			b, _ := json.Marshal(m)
			p := s.Validate(b)
			if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Errorf("problems %q, want one with %q", p, tc.want)
			}
		})
	}
}

// TestSchemaTestdataUsed keeps ocsfschema/schema to the files the tests read (set
// OCSF_PRUNE=1 to delete the others after adding a class).
func TestSchemaTestdataUsed(t *testing.T) {
	s := loadSchema(t)
	enc := New(Options{})
	for _, c := range cases {
		raw, _ := lines(t, enc.Decision(nil, &c.ev, meta))
		for _, r := range raw {
			s.Validate(r)
		}
	}
	for _, c := range approvalCases {
		raw, _ := lines(t, enc.Approval(nil, &c.ev, meta))
		s.Validate(raw[0])
	}
	var unused []string
	dir, opened := ocsfschema.Dir(), s.Opened()
	_ = filepath.WalkDir(filepath.Join(dir, "objects"), func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, path)
			if !opened[rel] {
				unused = append(unused, rel)
			}
		}
		return nil
	})
	sort.Strings(unused)
	if os.Getenv("OCSF_PRUNE") == "1" {
		for _, u := range unused {
			_ = os.Remove(filepath.Join(dir, u))
		}
		return
	}
	if len(unused) > 0 {
		t.Errorf("ocsfschema/schema holds objects no test reads (OCSF_PRUNE=1 removes them): %v", unused)
	}
}

// TestNative: the native line read back from an activity event holds what replay and learn
// read, as the JSON encoder writes it; a finding and an approval event give none.
func TestNative(t *testing.T) {
	enc := New(Options{})
	fields := []string{"request_id", "agent", "phase", "method", "host", "path", "decision", "reason", "credentials", "would_deny", "error", "input"}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			e := c.ev
			e.Input, e.InputLevel = map[string]any{"phase": e.Phase, "n": 1.5}, audit.InputFull
			raw, _ := lines(t, enc.Decision(nil, &e, meta))
			native, ok := Native(raw[0])
			if !ok {
				t.Fatalf("no native line from %s", raw[0])
			}
			var got, want map[string]any
			_ = json.Unmarshal(native, &got)
			_ = json.Unmarshal(audit.JSON.Decision(nil, &e, meta), &want)
			if got["msg"] != "decision" {
				t.Errorf("msg %v", got["msg"])
			}
			for _, f := range fields {
				g, _ := json.Marshal(got[f])
				w, _ := json.Marshal(want[f])
				if f == "path" && want[f] == "" {
					w = []byte("null")
				}
				if e.Phase == "dns" && f == "method" || e.Phase == "connect" && f == "method" && e.Method != "CONNECT" {
					continue // a query's type; a refused flow's protocol: not kept
				}
				if string(g) != string(w) {
					t.Errorf("%s: %s, want %s", f, g, w)
				}
			}
			for _, r := range raw[1:] {
				if _, ok := Native(r); ok {
					t.Errorf("a native line from a finding: %s", r)
				}
			}
		})
	}
	a := approvalCases["approve"].ev
	raw, _ := lines(t, enc.Approval(nil, &a, meta))
	if _, ok := Native(raw[0]); ok {
		t.Error("a native line from an approval event")
	}
	if _, ok := Native(audit.JSON.Decision(nil, &audit.Event{RequestID: "r"}, meta)); ok {
		t.Error("a native line from the JSON line")
	}
}
