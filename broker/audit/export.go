package audit

import (
	"github.com/rs/zerolog"
)

// Export is given every event with its line as written (the encoded event with its
// newline), after the line is queued for the audit destination: broker/telemetry makes an
// OpenTelemetry log record of it. e is nil for an approval event. It must not keep e or
// line, nor block.
type Export func(e *Event, line []byte)

// SetExport sets the function every event is given (nil for none). With none, writing an
// event costs one atomic load more.
func (l *Logger) SetExport(f Export) {
	if f == nil {
		l.export.Store(nil)
		return
	}
	l.export.Store(&f)
}

// logger is the zerolog.Logger an event is written with: l.zl, or, with an export set, one
// whose writer also gives the line and e to it.
func (l *Logger) logger(e *Event) *zerolog.Logger {
	f := l.export.Load()
	if f == nil {
		return &l.zl
	}
	zl := l.zl.Output(exportWriter{tapWriter{l.out, &l.tap}, e, *f})
	return &zl
}

// exportWriter writes a line, then gives it to the export.
type exportWriter struct {
	w      tapWriter
	e      *Event
	export Export
}

func (x exportWriter) Write(p []byte) (int, error) {
	n, err := x.w.Write(p)
	x.export(x.e, p)
	return n, err
}
