package audit

// Export is given every event with its lines as written (the encoded event, each line with its
// newline: with audit.format ocsf a decision may be two, its activity and its finding), after
// they are queued for the audit destination: an exporter (OpenTelemetry logs) makes a record
// of it. e is nil for an approval event. It must not keep e or lines, nor block.
type Export func(e *Event, lines []byte)

// SetExport sets the function every event is given (nil for none). With none, writing an
// event costs one atomic load more.
func (l *Logger) SetExport(f Export) {
	if f == nil {
		l.export.Store(nil)
		return
	}
	l.export.Store(&f)
}
