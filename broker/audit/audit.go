// Package audit writes one JSON line per decision (CONTRACT §6). An Event carries names,
// never values: no secret, token, credential-bearing header, query value or body reaches it,
// except in the policy input at the level audit.include_input names (Level).
package audit

import (
	"io"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// Decisions.
const (
	Allow = "allow"
	Deny  = "deny"
	// Challenge is the 407 asking for proxy credentials a request did not send: the client
	// is expected to repeat the request with them. Neither an allow nor a deny.
	Challenge = "challenge"
)

// Event is one audit record.
type Event struct {
	RequestID      string
	Agent          string
	SourceIP       string
	Phase          string
	Method         string
	Scheme         string
	Host           string
	Port           int
	Path           string
	Decision       string
	Reason         string
	Credentials    []string
	Status         int
	BytesIn        int64
	BytesOut       int64
	Start          time.Time
	PolicyRevision string
	DecisionID     string
	// Mode is which way the connection came (CONTRACT §8): ModeExplicit (the agent asked the
	// proxy) or ModeTransparent (its connection was redirected to the broker).
	Mode string
	// PolicyMode is policy.mode, "enforce" or "monitor" (then WouldDeny marks a denial not
	// enforced).
	PolicyMode string
	WouldDeny  bool
	// Error is the internal cause of a failure, for operators; never shown to the agent.
	Error string
	// Input is the policy input, written as much as InputLevel says (audit.include_input of
	// the config the exchange was served with: it can change on reload).
	Input      map[string]any
	InputLevel Level
	// AWS names the AWS service and operation of a request to AWS (CONTRACT §8), when known.
	AWS *AWSCall
	// GraphQL names the first operation of a GraphQL request (CONTRACT §8), when the policy
	// read it.
	GraphQL *GraphQLCall
	// MCP names the method and tool of the first message of a request to an MCP server
	// (CONTRACT §8), and of every message of a batch, when the policy read input.mcp.
	MCP *MCPCall
	// JSONRPC names the method of the first message of a request to a JSON-RPC endpoint, and
	// of every message of a batch, when the policy read input.jsonrpc.
	JSONRPC *JSONRPCCall
	// LLM is the model and usage of a metered LLM call (CONTRACT §8), or nil.
	LLM *LLMCall
	// Approval is how a held request (decision "ask") was decided, or nil.
	Approval *Approval
	// Budget names the budget that refused the request (429 budget_exceeded, or 503 when its
	// shared store failed and it fails closed), or "".
	Budget string
	// Via is the upstream proxy the request or tunnel went through ("direct": none), when
	// upstream proxies are configured or the policy chose one; TLSInspected marks a request
	// whose origin certificate was trusted through upstream.proxy.tls_inspection_ca.
	Via          string
	TLSInspected bool
	// Postgres is a Postgres connection's or statement's object (CONTRACT §8b), or nil.
	Postgres *PostgresCall
}

// The ways a connection reaches the broker: the audit event's mode, the policy's
// input.source.mode (CONTRACT §8).
const (
	ModeExplicit    = "explicit"
	ModeTransparent = "transparent"
)

// AWSCall is the audit event's "aws" object.
type AWSCall struct {
	Service, Operation string
}

// GraphQLCall is the audit event's "graphql" object: the type (query, mutation, subscription,
// persisted) and name of a GraphQL request's first operation.
type GraphQLCall struct {
	Type, Name string
}

// MCPCall is the audit event's "mcp" object: the first message's method and tool and, for a
// batch of more than one message, "batch": each message's {method, tool} in order.
type MCPCall struct {
	Method, Tool string
	Batch        []MCPCall
}

// JSONRPCCall is the audit event's "jsonrpc" object: the first message's method (a response
// the agent sends: "") and, for a batch of more than one message, "batch": each message's
// {method} in order.
type JSONRPCCall struct {
	Method string
	Batch  []string
}

// LLMCall is the audit event's "llm" object. Reported false: the response carried no usage
// that could be read (tokens 0, usage_reported false).
type LLMCall struct {
	Provider, Model     string
	TokensIn, TokensOut int64
	TokensCached        int64
	Cost                float64
	Reported            bool
	Estimated           bool // a stream cut at a hard budget: tokens let through, output estimated
}

// Logger writes events. Safe for concurrent use.
type Logger struct {
	zl  zerolog.Logger
	out *batchWriter
	now func() time.Time
	tap atomic.Pointer[Tap]
}

// New writes events to w, one JSON object per line. The lines are written by a goroutine of
// the Logger's, in batches under load (see batchWriter); Close writes what is pending.
func New(w io.Writer) *Logger {
	out := newBatchWriter(w)
	l := &Logger{out: out, now: time.Now}
	l.zl = zerolog.New(tapWriter{out, &l.tap}).With().Timestamp().Logger()
	return l
}

// Close writes every event not yet written. Events written after Close are written at once.
func (l *Logger) Close() { l.out.Close() }

// Lost is the number of events whose write failed (each was also reported on stderr).
func (l *Logger) Lost() int64 { return l.out.lost.Load() }

// Write records one decision.
func (l *Logger) Write(e *Event) {
	ev := l.zl.Info().
		Str("request_id", e.RequestID).
		Str("agent", e.Agent).
		Str("source_ip", e.SourceIP).
		Str("phase", e.Phase).
		Str("method", e.Method).
		Str("scheme", e.Scheme).
		Str("host", e.Host).
		Int("port", e.Port).
		Str("path", e.Path).
		Str("decision", e.Decision).
		Str("reason", e.Reason).
		Strs("credentials", nonNil(e.Credentials)).
		Int("status", e.Status).
		Int64("bytes_in", e.BytesIn).
		Int64("bytes_out", e.BytesOut).
		Float64("duration_ms", float64(l.now().Sub(e.Start).Microseconds())/1000).
		Str("policy_revision", e.PolicyRevision).
		Str("decision_id", e.DecisionID).
		Str("mode", e.Mode).
		Str("policy_mode", e.PolicyMode)
	if e.WouldDeny {
		ev = ev.Bool("would_deny", true)
	}
	if e.Error != "" {
		ev = ev.Str("error", e.Error)
	}
	if a := e.AWS; a != nil {
		ev = ev.Dict("aws", zerolog.Dict().Str("service", a.Service).Str("operation", a.Operation))
	}
	if g := e.GraphQL; g != nil {
		ev = ev.Dict("graphql", zerolog.Dict().Str("type", g.Type).Str("name", g.Name))
	}
	if m := e.MCP; m != nil {
		d := zerolog.Dict().Str("method", m.Method).Str("tool", m.Tool)
		if len(m.Batch) > 1 {
			a := zerolog.Arr()
			for _, c := range m.Batch {
				a = a.Dict(zerolog.Dict().Str("method", c.Method).Str("tool", c.Tool))
			}
			d = d.Array("batch", a)
		}
		ev = ev.Dict("mcp", d)
	}
	if j := e.JSONRPC; j != nil {
		d := zerolog.Dict().Str("method", j.Method)
		if len(j.Batch) > 1 {
			a := zerolog.Arr()
			for _, m := range j.Batch {
				a = a.Dict(zerolog.Dict().Str("method", m))
			}
			d = d.Array("batch", a)
		}
		ev = ev.Dict("jsonrpc", d)
	}
	if l := e.LLM; l != nil {
		d := zerolog.Dict().Str("provider", l.Provider).Str("model", l.Model).
			Int64("tokens_in", l.TokensIn).Int64("tokens_out", l.TokensOut).Int64("tokens_cached", l.TokensCached).Float64("cost", l.Cost).
			Bool("usage_reported", l.Reported)
		if l.Estimated {
			d = d.Bool("usage_estimated", true)
		}
		ev = ev.Dict("llm", d)
	}
	if e.Approval != nil {
		ev = ev.Object("approval", e.Approval)
	}
	if e.Budget != "" {
		ev = ev.Str("budget", e.Budget)
	}
	if e.Via != "" {
		ev = ev.Str("via", e.Via)
		if e.TLSInspected {
			ev = ev.Bool("tls_inspected", true)
		}
	}
	if e.Postgres != nil {
		ev = ev.Object("postgres", e.Postgres)
	}
	if lv := e.InputLevel; lv.Logs() && e.Input != nil {
		ev = ev.Str("input_level", string(lv)).Interface("input", lv.reduce(e.Input))
	}
	ev.Str("msg", "decision").Send()
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
