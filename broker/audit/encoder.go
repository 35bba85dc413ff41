package audit

import (
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Encoder writes events in one format of the audit log (audit.format): JSON, the broker's own
// line (CONTRACT §6), or another schema built from the same Event (package ocsf). An event is
// encoded once, when it is written.
type Encoder interface {
	// Decision appends to dst the lines of a decision event, each ending in a newline.
	Decision(dst []byte, e *Event, m Meta) []byte
	// Approval appends to dst the lines of an approval event.
	Approval(dst []byte, a *ApprovalEvent, m Meta) []byte
}

// Meta is what the Logger adds to an event as it writes it.
type Meta struct {
	Time     time.Time     // when the event was written
	Duration time.Duration // of a decision: since Event.Start
	Instance string        // the broker replica ("" when not named)
}

// JSON is the broker's own encoding: one JSON object per event, as CONTRACT §6 describes.
var JSON Encoder = &jsonEncoder{}

type jsonEncoder struct {
	lines sync.Pool // *jsonLine
}

// jsonLine is a zerolog logger whose one write appends to dst: zerolog builds the line, dst
// receives it.
type jsonLine struct {
	zl  zerolog.Logger
	dst []byte
}

func (j *jsonLine) Write(p []byte) (int, error) {
	j.dst = append(j.dst, p...)
	return len(p), nil
}

func (c *jsonEncoder) line(dst []byte, write func(zerolog.Logger)) []byte {
	j, _ := c.lines.Get().(*jsonLine)
	if j == nil {
		j = new(jsonLine)
		j.zl = zerolog.New(j).With().Timestamp().Logger()
	}
	j.dst = dst
	write(j.zl)
	dst, j.dst = j.dst, nil
	c.lines.Put(j)
	return dst
}

func (c *jsonEncoder) Decision(dst []byte, e *Event, m Meta) []byte {
	return c.line(dst, func(zl zerolog.Logger) { writeDecision(zl, e, m) })
}

func (c *jsonEncoder) Approval(dst []byte, a *ApprovalEvent, m Meta) []byte {
	return c.line(dst, func(zl zerolog.Logger) { writeApproval(zl, a, m) })
}

func writeDecision(zl zerolog.Logger, e *Event, m Meta) {
	ev := zl.Info().
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
		Float64("duration_ms", float64(m.Duration.Microseconds())/1000).
		Str("policy_revision", e.PolicyRevision).
		Str("decision_id", e.DecisionID).
		Str("mode", e.Mode).
		Str("policy_mode", e.PolicyMode)
	if m.Instance != "" {
		ev = ev.Str("instance", m.Instance)
	}
	if e.TraceID != "" {
		ev = ev.Str("trace_id", e.TraceID)
	}
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
	if e.Redacted > 0 {
		ev = ev.Int("redacted", e.Redacted)
	}
	if e.Via != "" {
		ev = ev.Str("via", e.Via)
		if e.TLSInspected {
			ev = ev.Bool("tls_inspected", true)
		}
	}
	if x := e.SSH; x != nil {
		refs := zerolog.Arr()
		for _, r := range x.Refs {
			refs = refs.Dict(zerolog.Dict().Str("name", r.Name).Str("old", r.Old).Str("new", r.New))
		}
		ev = ev.Dict("ssh", zerolog.Dict().Str("host", x.Host).Int("port", x.Port).Str("user", x.User).
			Str("service", x.Service).Str("repository", x.Repository).Array("refs", refs))
	}
	if e.Postgres != nil {
		ev = ev.Object("postgres", e.Postgres)
	}
	if lv := e.InputLevel; lv.Logs() && e.Input != nil {
		ev = ev.Str("input_level", string(lv)).Interface("input", lv.reduce(e.Input))
	}
	ev.Str("msg", "decision").Send()
}

func writeApproval(zl zerolog.Logger, a *ApprovalEvent, m Meta) {
	ev := zl.Info().
		Str("action", a.Action).
		Str("id", a.ID).
		Str("by", a.By).
		Str("scope", a.Scope).
		Str("agent", a.Agent).
		Str("host", a.Host).
		Str("method", a.Method).
		Str("path_prefix", a.PathPrefix).
		Str("comment", a.Comment)
	if a.RequestID != "" {
		ev = ev.Str("request_id", a.RequestID)
	}
	if a.Scheme != "" {
		ev = ev.Str("scheme", a.Scheme)
	}
	if a.Port != 0 {
		ev = ev.Int("port", a.Port)
	}
	if !a.Expires.IsZero() {
		ev = ev.Time("expires", a.Expires.UTC())
	}
	if m.Instance != "" {
		ev = ev.Str("instance", m.Instance)
	}
	ev.Str("msg", "approval").Send()
}
