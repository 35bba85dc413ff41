package telemetry

import (
	"math"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/capbroker/capbroker/broker/scrub"
)

// A Trace's spans are written in protobuf wire format directly (encoded.go says when and
// where): building the OTLP messages and encoding them by reflection cost about 10 µs and 47
// allocations per request traced, as much as a third of the request itself.

// Field numbers of opentelemetry/proto (trace/v1, common/v1, resource/v1).
const (
	fSSSpans       = 2 // ScopeSpans
	fTraceID       = 1 // Span
	fSpanID        = 2
	fParentSpanID  = 4
	fName          = 5
	fKind          = 6
	fStart         = 7
	fEnd           = 8
	fAttributes    = 9
	fStatus        = 15
	fFlags         = 16
	fStatusMessage = 2 // Status
	fStatusCode    = 3
	fKey           = 1 // KeyValue
	fValue         = 2
	fString        = 1 // AnyValue
	fBool          = 2
	fInt           = 3
	fDouble        = 4
	fArray         = 5
	fArrayValues   = 1 // ArrayValue

	kindInternal = 1
	kindServer   = 2
	kindClient   = 3
	statusError  = 2
	// sampled, and whether the parent is remote is known (SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE)
	flagsLocal  = 0x01 | 0x100
	flagsRemote = flagsLocal | 0x200 // the root under the agent's span
)

// wire appends protobuf fields to b, its strings scrubbed by r.
type wire struct {
	b     []byte
	r     *scrub.Replacer
	attrs protowire.Number // the attributes' field: a Span's or a LogRecord's
}

// uvarint appends v as a varint. Nearly every tag and length written here is under 128, a
// byte: that case is inline, where protowire.AppendVarint, a call, was a third of the time
// spent writing a trace (BenchmarkTraceExport).
func (w *wire) uvarint(v uint64) {
	if v < 0x80 {
		w.b = append(w.b, byte(v))
		return
	}
	w.b = protowire.AppendVarint(w.b, v)
}

func (w *wire) tag(f protowire.Number, t protowire.Type) { w.uvarint(uint64(f)<<3 | uint64(t)) }

// open starts a length-delimited field; close ends it.
func (w *wire) open(f protowire.Number) int {
	w.tag(f, protowire.BytesType)
	return len(w.b)
}

func (w *wire) close(start int) {
	if n := len(w.b) - start; n < 0x80 {
		w.b = slices.Insert(w.b, start, byte(n))
		return
	}
	var l [10]byte
	w.b = slices.Insert(w.b, start, protowire.AppendVarint(l[:0], uint64(len(w.b)-start))...)
}

func (w *wire) bytes(f protowire.Number, v []byte) {
	w.tag(f, protowire.BytesType)
	w.uvarint(uint64(len(v)))
	w.b = append(w.b, v...)
}

func (w *wire) string(f protowire.Number, v string) {
	w.tag(f, protowire.BytesType)
	w.uvarint(uint64(len(v)))
	w.b = append(w.b, v...)
}

func (w *wire) varint(f protowire.Number, v uint64) {
	w.tag(f, protowire.VarintType)
	w.uvarint(v)
}

func (w *wire) fixed64(f protowire.Number, v uint64) {
	w.tag(f, protowire.Fixed64Type)
	w.b = protowire.AppendFixed64(w.b, v)
}

func (w *wire) fixed32(f protowire.Number, v uint32) {
	w.tag(f, protowire.Fixed32Type)
	w.b = protowire.AppendFixed32(w.b, v)
}

// str is a string attribute, its value scrubbed; an empty value is left out.
func (w *wire) str(k, v string) {
	if v != "" {
		w.strScrubbed(k, w.r.String(v))
	}
}

// The attributes of a known size are written forward, each length computed, not inserted
// (close moves what follows its start).

func (w *wire) strScrubbed(k, v string) {
	w.keyValue(k, fString, protowire.BytesType, protowire.SizeBytes(len(v)))
	w.uvarint(uint64(len(v)))
	w.b = append(w.b, v...)
}

func (w *wire) int(k string, v int64) {
	w.keyValue(k, fInt, protowire.VarintType, protowire.SizeVarint(uint64(v)))
	w.uvarint(uint64(v))
}

func (w *wire) bool(k string, v bool) {
	w.keyValue(k, fBool, protowire.VarintType, 1)
	w.uvarint(protowire.EncodeBool(v))
}

func (w *wire) double(k string, v float64) {
	w.keyValue(k, fDouble, protowire.Fixed64Type, 8)
	w.b = protowire.AppendFixed64(w.b, math.Float64bits(v))
}

// keyValue writes an attribute's KeyValue up to its value's payload (n bytes, written next),
// which is the AnyValue's field f of type t.
func (w *wire) keyValue(k string, f protowire.Number, t protowire.Type, n int) {
	any := protowire.SizeTag(f) + n
	kv := protowire.SizeTag(fKey) + protowire.SizeBytes(len(k)) + protowire.SizeTag(fValue) + protowire.SizeBytes(any)
	w.tag(w.attrs, protowire.BytesType)
	w.uvarint(uint64(kv))
	w.string(fKey, k)
	w.tag(fValue, protowire.BytesType)
	w.uvarint(uint64(any))
	w.tag(f, t)
}

func (w *wire) strs(k string, vs []string) {
	kv := w.open(w.attrs)
	w.string(fKey, k)
	av := w.open(fValue)
	arr := w.open(fArray)
	for _, v := range vs {
		e := w.open(fArrayValues)
		w.string(fString, w.r.String(v))
		w.close(e)
	}
	w.close(arr)
	w.close(av)
	w.close(kv)
}

// span writes a span's fields but its attributes and status, and returns where the span's
// field began, for close once they are written.
func (w *wire) span(tr *Trace, s *Span, parent []byte, kind uint64, flags uint32) int {
	start := w.open(fSSSpans)
	w.bytes(fTraceID, tr.TraceID[:])
	w.bytes(fSpanID, s.ID[:])
	if parent != nil {
		w.bytes(fParentSpanID, parent)
	}
	if name := s.Name; brokerName(name) {
		w.string(fName, name)
	} else {
		w.string(fName, w.r.String(name)) // "chat " and a model's name, say
	}
	w.varint(fKind, kind)
	w.fixed64(fStart, uint64(s.Start.UnixNano()))
	w.fixed64(fEnd, uint64(s.End.UnixNano()))
	w.fixed32(fFlags, flags)
	return start
}

// brokerName reports whether a span's name is one of the broker's own constants, which
// holds no secret and is written without a scrub.
func brokerName(name string) bool {
	switch name {
	case "capbroker.request", "capbroker.connect", "identity", "policy", "approval", "credentials", "upstream", "scrub":
		return true
	}
	return false
}

// encodeTrace appends tr's spans to b, as ScopeSpans span fields, every string scrubbed by r.
func encodeTrace(b []byte, r *scrub.Replacer, tr *Trace) []byte {
	w := wire{b: b, r: r, attrs: fAttributes}
	w.trace(tr)
	return w.b
}

// trace writes tr's spans, every string scrubbed.
func (w *wire) trace(tr *Trace) {
	ev := &tr.Event
	var parent []byte
	flags := uint32(flagsLocal)
	if tr.Parent != [8]byte{} {
		parent, flags = tr.Parent[:], flagsRemote
	}
	root := w.span(tr, &tr.Root, parent, kindServer, flags)
	// The request's attributes are on the root alone, those without a value left out.
	w.str("capbroker.request_id", ev.RequestID)
	w.str("capbroker.agent", ev.Agent)
	w.str("capbroker.phase", ev.Phase)
	w.str("capbroker.decision", ev.Decision)
	w.str("capbroker.reason", ev.Reason)
	if len(ev.Credentials) > 0 {
		w.strs("capbroker.credentials", ev.Credentials)
	}
	w.str("capbroker.policy_revision", ev.PolicyRevision)
	w.str("capbroker.decision_id", ev.DecisionID)
	w.str("capbroker.mode", ev.Mode)
	w.str("http.request.method", ev.Method)
	w.str("server.address", ev.Host)
	if ev.Port != 0 {
		w.int("server.port", int64(ev.Port))
	}
	w.str("url.path", ev.Path)
	if ev.Status != 0 {
		w.int("http.response.status_code", int64(ev.Status))
	}
	if ev.WouldDeny {
		w.bool("capbroker.would_deny", true)
	}
	if tr.Status != "" {
		st := w.open(fStatus)
		w.string(fStatusMessage, w.r.String(tr.Status))
		w.varint(fStatusCode, statusError)
		w.close(st)
	}
	w.close(root)
	rid := tr.Root.ID[:]
	for i := range tr.NSteps {
		w.close(w.span(tr, &tr.Steps[i], rid, kindInternal, flagsLocal))
	}
	if s := &tr.Upstream; !s.Start.IsZero() {
		up := w.span(tr, s, rid, kindClient, flagsLocal)
		if l := ev.LLM; l != nil {
			// OpenTelemetry's GenAI semantic conventions, for the call to the model.
			w.str("gen_ai.operation.name", "chat")
			w.str("gen_ai.provider.name", l.Provider)
			w.str("gen_ai.request.model", l.Model)
			w.int("gen_ai.usage.input_tokens", l.TokensIn)
			w.int("gen_ai.usage.output_tokens", l.TokensOut)
			w.double("capbroker.llm.cost", l.Cost)
			w.bool("capbroker.llm.usage_reported", l.Reported)
		}
		w.close(up)
	}
	if s := &tr.Scrub; !s.Start.IsZero() {
		w.close(w.span(tr, s, rid, kindInternal, flagsLocal))
	}
}
