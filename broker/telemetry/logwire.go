package telemetry

import (
	"context"
	"encoding/hex"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/scrub"
)

// An audit event's log record, as queued: the line and the few fields the record carries,
// by value (no SDK record, no attribute slice). The export goroutine writes a batch of them
// as one OTLP ExportLogsServiceRequest (spanwire.go's encoder), every string scrubbed.
type logRecord struct {
	time                       time.Time
	body                       string // the audit line without its newline
	event                      string // capbroker.decision or capbroker.approval
	agent, requestID, decision string
	traceID                    [16]byte
	spanID                     [8]byte // zero: not traced
}

// Field numbers of opentelemetry/proto (logs/v1).
const (
	fReqResourceLogs = 1 // ExportLogsServiceRequest
	fRLResource      = 1 // ResourceLogs
	fRLScopeLogs     = 2
	fSLScope         = 1 // ScopeLogs
	fSLRecords       = 2
	fLRTime          = 1 // LogRecord
	fLRSeverity      = 2
	fLRSeverityText  = 3
	fLRBody          = 5
	fLRAttributes    = 6
	fLRFlags         = 8
	fLRTraceID       = 9
	fLRSpanID        = 10
	fLRObserved      = 11
	fLREventName     = 12
	severityInfo     = 9
)

// newLogRecord is e's record (e nil: an approval event's).
func newLogRecord(e *audit.Event, line []byte) logRecord {
	for len(line) > 0 && line[len(line)-1] == '\n' {
		line = line[:len(line)-1]
	}
	r := logRecord{time: time.Now(), body: string(line), event: "capbroker.approval"}
	if e != nil {
		r.event, r.agent, r.requestID, r.decision = "capbroker.decision", e.Agent, e.RequestID, e.Decision
		if len(e.TraceID) == 32 && len(e.SpanID) == 16 {
			_, err1 := hex.Decode(r.traceID[:], []byte(e.TraceID))
			_, err2 := hex.Decode(r.spanID[:], []byte(e.SpanID))
			if err1 != nil || err2 != nil || r.traceID == [16]byte{} || r.spanID == [8]byte{} {
				r.traceID, r.spanID = [16]byte{}, [8]byte{}
			}
		}
	}
	return r
}

// logExporter writes batches of records as OTLP and sends them.
type logExporter struct {
	send     func(context.Context, []byte) error
	resource []byte // the ResourceLogs' resource field, encoded
	scope    []byte // the ScopeLogs' scope field, encoded
	w        wire
}

func (e *logExporter) export(ctx context.Context, r *scrub.Replacer, batch []logRecord) error {
	return e.send(ctx, e.encode(r, batch))
}

func (e *logExporter) encode(r *scrub.Replacer, batch []logRecord) []byte {
	w := &e.w
	w.attrs = fLRAttributes
	w.cache.use(r)
	w.b = w.b[:0]
	rl := w.open(fReqResourceLogs)
	w.b = append(w.b, e.resource...)
	sl := w.open(fRLScopeLogs)
	w.b = append(w.b, e.scope...)
	for i := range batch {
		rec := &batch[i]
		lr := w.open(fSLRecords)
		w.fixed64(fLRTime, uint64(rec.time.UnixNano()))
		w.fixed64(fLRObserved, uint64(rec.time.UnixNano()))
		w.varint(fLRSeverity, severityInfo)
		w.string(fLRSeverityText, "INFO")
		body := r.String(rec.body) // each line is new: not cached
		w.b = protowire.AppendTag(w.b, fLRBody, protowire.BytesType)
		w.b = protowire.AppendVarint(w.b, uint64(protowire.SizeTag(fString)+protowire.SizeBytes(len(body))))
		w.string(fString, body)
		if rec.event == "capbroker.decision" {
			w.str("capbroker.agent", rec.agent)
			w.unique("capbroker.request_id", rec.requestID)
			w.str("capbroker.decision", rec.decision)
		}
		if rec.spanID != [8]byte{} {
			w.b = protowire.AppendTag(w.b, fLRFlags, protowire.Fixed32Type)
			w.b = protowire.AppendFixed32(w.b, 1) // sampled
			w.bytes(fLRTraceID, rec.traceID[:])
			w.bytes(fLRSpanID, rec.spanID[:])
		}
		w.string(fLREventName, rec.event)
		w.close(lr)
	}
	w.close(sl)
	w.close(rl)
	return w.b
}
