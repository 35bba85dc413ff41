// Package audit writes one JSON line per decision (CONTRACT §6). An Event carries names,
// never values: no secret, token, credential-bearing header, query value or body reaches it,
// except in the policy input at the level audit.include_input names (Level).
package audit

import (
	"io"
	"sync"
	"sync/atomic"
	"time"
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
	// Redacted is how many times the response's scrubber replaced a secret the broker knows
	// with [REDACTED] (the upstream echoed one), or 0.
	Redacted int
	// TraceID is the request's trace (CONTRACT §8b "trace_id"), when it was traced; SpanID its
	// span, not written in the line, for the exported log record (broker/telemetry).
	TraceID, SpanID string
	// SSH is what a git session over SSH did (phase "ssh", CONTRACT §8b), or nil.
	SSH *SSHSession
}

// SSHSession is the audit event's "ssh" object: the fields of input.ssh.
type SSHSession struct {
	Host, User, Service, Repository string
	Port                            int
	Refs                            []SSHRef
}

// SSHRef is one ref update of a push.
type SSHRef struct {
	Name, Old, New string
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

// Logger writes events, each encoded once by its Encoder (audit.format). Safe for concurrent
// use.
type Logger struct {
	enc      Encoder
	instance string
	out      *batchWriter
	now      func() time.Time
	tap      atomic.Pointer[Tap]
	export   atomic.Pointer[Export]
	bufs     sync.Pool // *[]byte: a line being encoded
}

// Options are a Logger's settings beside its writer.
type Options struct {
	// Encoder writes each event's lines (nil: JSON, the broker's own line).
	Encoder Encoder
	// Instance names the broker replica in every event ("instance"); "" leaves it out.
	Instance string
}

// New writes events to w, one JSON object per line. The lines are written by a goroutine of
// the Logger's, in batches under load (see batchWriter); Close writes what is pending.
func New(w io.Writer) *Logger { return NewWith(w, Options{}) }

// NewWith writes events to w as o says.
func NewWith(w io.Writer, o Options) *Logger {
	if o.Encoder == nil {
		o.Encoder = JSON
	}
	return &Logger{enc: o.Encoder, instance: o.Instance, out: newBatchWriter(w), now: time.Now}
}

// Close writes every event not yet written. Events written after Close are written at once.
func (l *Logger) Close() { l.out.Close() }

// Lost is the number of events whose write failed (each was also reported on stderr).
func (l *Logger) Lost() int64 { return l.out.lost.Load() }

// Write records one decision.
func (l *Logger) Write(e *Event) {
	m := Meta{Time: l.now(), Instance: l.instance}
	m.Duration = m.Time.Sub(e.Start)
	l.emit(e, func(enc Encoder, dst []byte) []byte { return enc.Decision(dst, e, m) })
}

// emit encodes an event with the Logger's encoder, gives the tap its native line, queues the
// encoded lines and gives them to the export with e (nil for an approval event).
func (l *Logger) emit(e *Event, encode func(Encoder, []byte) []byte) {
	bp, _ := l.bufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	line := encode(l.enc, (*bp)[:0])
	if f := l.tap.Load(); f != nil {
		if l.enc == JSON {
			(*f)(line)
		} else { // the tap reads the broker's own line, whatever the log holds
			both := encode(JSON, line) // appended: one buffer for both
			(*f)(both[len(line):])
			line = both[:len(line)]
		}
	}
	_, _ = l.out.Write(line) // the batch writer copies it; it counts a failed write
	if f := l.export.Load(); f != nil {
		(*f)(e, line)
	}
	if cap(line) <= 64<<10 {
		*bp = line[:0]
		l.bufs.Put(bp)
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
