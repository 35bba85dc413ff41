package telemetry

import (
	"encoding/hex"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/scrub"
)

// Field numbers of opentelemetry/proto (logs/v1).
const (
	fSLRecords      = 2 // ScopeLogs
	fLRTime         = 1 // LogRecord
	fLRSeverity     = 2
	fLRSeverityText = 3
	fLRBody         = 5
	fLRAttributes   = 6
	fLRFlags        = 8
	fLRTraceID      = 9
	fLRSpanID       = 10
	fLRObserved     = 11
	fLREventName    = 12
	severityInfo    = 9
)

// encodeRecord appends the audit event's log record, written as line, to b as a ScopeLogs
// log_record field: the line without its newline as the body, and, for a decision (e not
// nil: nil is an approval event), the agent, request id and decision as attributes and the
// request's trace and span when it was traced. Every string is scrubbed by r.
func encodeRecord(b []byte, r *scrub.Replacer, e *audit.Event, line []byte) []byte {
	for len(line) > 0 && line[len(line)-1] == '\n' {
		line = line[:len(line)-1]
	}
	w := wire{b: b, r: r, attrs: fLRAttributes}
	now := uint64(time.Now().UnixNano())
	lr := w.open(fSLRecords)
	w.fixed64(fLRTime, now)
	w.fixed64(fLRObserved, now)
	w.varint(fLRSeverity, severityInfo)
	w.string(fLRSeverityText, "INFO")
	body := r.Bytes(line) // line itself when it holds no secret
	w.tag(fLRBody, protowire.BytesType)
	w.uvarint(uint64(protowire.SizeTag(fString) + protowire.SizeBytes(len(body))))
	w.bytes(fString, body)
	event := "capbroker.approval"
	if e != nil {
		event = "capbroker.decision"
		w.str("capbroker.agent", e.Agent)
		w.str("capbroker.request_id", e.RequestID)
		w.str("capbroker.decision", e.Decision)
		var traceID [16]byte
		var spanID [8]byte
		if len(e.TraceID) == 32 && len(e.SpanID) == 16 {
			_, err1 := hex.Decode(traceID[:], []byte(e.TraceID))
			_, err2 := hex.Decode(spanID[:], []byte(e.SpanID))
			if err1 == nil && err2 == nil && traceID != [16]byte{} && spanID != [8]byte{} {
				w.fixed32(fLRFlags, 1) // sampled
				w.bytes(fLRTraceID, traceID[:])
				w.bytes(fLRSpanID, spanID[:])
			}
		}
	}
	w.string(fLREventName, event)
	w.close(lr)
	return w.b
}
