package llm

import "bytes"

// maxEvent is the most of one server-sent event's data held to be read whole. A larger event's
// data is read as it passes (skeleton), for its usage only.
const maxEvent = 1 << 20

// sse splits a stream of server-sent events (WHATWG HTML §9.2.6: lines end with CRLF, LF or
// CR; an empty line ends an event; data lines are joined with LF) as its bytes come, in any
// pieces. It keeps only the current line, when split across pieces, and the current event's
// data: at most maxEvent bytes each.
type sse struct {
	line     []byte
	lineOver bool
	data     []byte
	dataOver bool
	// cr: the last piece ended with CR, so a LF at the start of the next one ends no line.
	cr bool
	// skipped: an event over maxEvent could not be read.
	skipped bool
	// event is given each event's data, and says whether the event is passed on.
	event func(data []byte) (keep bool)
	// big is given the skeleton of an event over maxEvent (nil: such an event is skipped).
	big func(skel []byte)
	// skel reads the current event's data once it is over maxEvent; lineData: the current
	// line, over maxEvent, is a data line whose bytes go to skel as they come.
	skel     *skeleton
	lineData bool
}

// feed reads b, calling cut after each event that ends in it with the offset in b just past
// the event's last byte, and whether it is kept.
func (s *sse) feed(b []byte, cut func(i int, keep bool)) {
	pos := 0
	if s.cr && len(b) > 0 && b[0] == '\n' {
		pos = 1
	}
	s.cr = false
	for pos < len(b) {
		j := lineEnd(b[pos:])
		if j < 0 {
			s.appendLine(b[pos:])
			return
		}
		end := pos + j
		var line []byte
		if len(s.line) == 0 && !s.lineOver {
			line = b[pos:end] // the whole line is in b: no copy
		} else {
			s.appendLine(b[pos:end])
			line = s.line
		}
		next := end + 1
		if b[end] == '\r' {
			if next < len(b) {
				if b[next] == '\n' {
					next++
				}
			} else {
				s.cr = true
			}
		}
		over := s.lineOver
		s.line, s.lineOver = s.line[:0], false
		if keep, ended := s.processLine(line, over); ended && cut != nil {
			cut(next, keep)
		}
		pos = next
	}
}

// end reads an event the stream ended in without its empty line.
func (s *sse) end() {
	if len(s.line) > 0 || s.lineOver {
		over := s.lineOver
		line := s.line
		s.line, s.lineOver = nil, false
		s.processLine(line, over)
	}
	if len(s.data) > 0 || s.dataOver {
		s.processLine(nil, false)
	}
}

func (s *sse) appendLine(b []byte) {
	if s.lineOver {
		if s.lineData {
			s.skel.feed(b)
		}
		return
	}
	if len(s.line)+len(b) > maxEvent {
		if v, ok := dataValue(s.line); ok && s.big != nil && !s.dataOver {
			s.toSkeleton()
			s.skel.feed(v)
			s.skel.feed(b)
			s.lineData = true
		}
		s.line, s.lineOver = s.line[:0], true
		return
	}
	s.line = append(s.line, b...)
}

// dataValue is a data line's value (after "data:" and one space).
func dataValue(line []byte) ([]byte, bool) {
	v, ok := bytes.CutPrefix(line, []byte("data"))
	if !ok || (len(v) > 0 && v[0] != ':') {
		return nil, false
	}
	v = v[min(1, len(v)):]
	v, _ = bytes.CutPrefix(v, []byte(" "))
	return v, true
}

// toSkeleton moves the current event's data to a skeleton, when it is not there yet.
func (s *sse) toSkeleton() {
	if s.skel != nil {
		s.skel.feed([]byte("\n"))
		return
	}
	s.skel = &skeleton{root: s.big}
	s.skel.feed(s.data)
	if len(s.data) > 0 {
		s.skel.feed([]byte("\n"))
	}
	s.data, s.dataOver = s.data[:0], true
}

// processLine takes one line; an empty one ends the event (ended), which is kept or not.
func (s *sse) processLine(line []byte, over bool) (keep, ended bool) {
	if over {
		if !s.lineData {
			s.dataOver = true // a line over maxEvent that is no data line, or no skeleton
		}
		s.lineData = false
		return false, false
	}
	if len(line) == 0 {
		keep = true
		switch {
		case s.skel != nil:
			if !s.skel.end() {
				s.skipped = true
			}
			s.skel = nil
		case s.dataOver:
			s.skipped = true
		case len(s.data) > 0:
			keep = s.event(s.data)
		}
		s.data, s.dataOver = s.data[:0], false
		return keep, true
	}
	v, ok := dataValue(line)
	if !ok {
		return false, false // another field (event, id, retry) or a comment
	}
	if s.skel != nil {
		s.skel.feed([]byte("\n"))
		s.skel.feed(v)
		return false, false
	}
	if s.dataOver {
		return false, false
	}
	if len(s.data)+len(v)+1 > maxEvent {
		if s.big == nil {
			s.data, s.dataOver = s.data[:0], true
			return false, false
		}
		s.toSkeleton()
		s.skel.feed(v)
		return false, false
	}
	if len(s.data) > 0 {
		s.data = append(s.data, '\n')
	}
	s.data = append(s.data, v...)
	return false, false
}

// lineEnd is the index of the first CR or LF in b, or -1: two vectorised searches, the one for
// CR (rare) only up to the first LF.
func lineEnd(b []byte) int {
	lf := bytes.IndexByte(b, '\n')
	upTo := b
	if lf >= 0 {
		upTo = b[:lf]
	}
	if cr := bytes.IndexByte(upTo, '\r'); cr >= 0 {
		return cr
	}
	return lf
}
