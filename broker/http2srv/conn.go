// Package http2srv serves HTTP/2 on one connection the broker has intercepted (an agent that
// negotiated h2 in ALPN), for the same http.Handler as broker/http1, with what a tunnel needs
// of net/http's HTTP/2 server and no more.
//
// net/http's HTTP/2 server moves every frame between goroutines: a reading goroutine hands
// each frame to the connection's serving goroutine over a channel, which starts the handler's
// goroutine, and every frame the handler writes goes back to the serving goroutine over
// another channel, to be written by a third goroutine (its write scheduler, a select per
// frame). Here the frames are read and acted on by the connection's one goroutine (Serve),
// which starts a goroutine only for a request's handler; a handler writes its response frames
// itself, under the connection's write lock, into a buffer that one goroutine at a time
// writes to the connection without the lock held: responses that end while a write is under
// way leave together with its next one (see flushLocked). The framing is
// golang.org/x/net/http2's Framer and hpack: the Framer checks each frame's layout and the
// CONTINUATION sequence; header blocks are decoded here with the Framer's own checks of
// field names and values, pseudo-header fields and sizes (headerBlock, into state kept for
// the connection); the rest of RFC 9113's rules for a server are here:
//
//   - stream states: a stream's id odd and above the last one, frames on idle or closed
//     streams refused as the RFC says (PROTOCOL_ERROR or STREAM_CLOSED), RST_STREAM both ways;
//   - flow control both ways: a receive window per stream and for the connection (1 MiB each,
//     returned as the handler reads the body), the agent's windows honoured for every DATA
//     frame written, SETTINGS_INITIAL_WINDOW_SIZE applied to open streams;
//   - limits: SETTINGS_MAX_CONCURRENT_STREAMS (REFUSED_STREAM beyond it), the header list
//     size (a 431 beyond it), frames of at most 16 KiB, the idle timeout (no stream for that
//     long: GOAWAY), a PING when the agent has been silent that long (closed when unanswered);
//   - requests checked as net/http checks them: the pseudo-header fields (:method, :scheme,
//     :path, or :authority alone for CONNECT), no connection-specific field (Connection,
//     Keep-Alive, Proxy-Connection, Transfer-Encoding, Upgrade; TE other than "trailers"), one
//     valid authority, a body no longer or shorter than its Content-Length;
//   - a request's context ends when its stream is reset and when the connection ends; a
//     stream that ended whole leaves it, live, to a later stream (as broker/http1 keeps its
//     connection's context between requests: see streamContext); Shutdown sends GOAWAY and
//     lets the open streams finish.
package http2srv

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/capbroker/capbroker/internal/deadline"
)

// Server holds the settings of the connections it serves.
type Server struct {
	Handler              http.Handler
	ReadHeaderTimeout    time.Duration // for the client's connection preface
	IdleTimeout          time.Duration // with no stream open; and the silence after which a PING is sent
	PingTimeout          time.Duration // how long a PING waits for its answer
	MaxHeaderBytes       int           // SETTINGS_MAX_HEADER_LIST_SIZE
	MaxConcurrentStreams uint32
	// BaseContext, when set, is the parent of the requests' contexts.
	BaseContext context.Context
}

const (
	// recvWindow is the receive window of each stream and of the connection.
	recvWindow = 1 << 20
	// maxFrame is the largest frame read (SETTINGS_MAX_FRAME_SIZE's default, not raised).
	maxFrame = 16 << 10
	// maxWindow is the largest a flow-control window may be.
	maxWindow = 1<<31 - 1
	// writeSize is the connection's write buffer: a TLS record's plaintext.
	writeSize = 16 << 10
)

// Conn is one connection served by a Server.
type Conn struct {
	s       *Server
	raw     net.Conn
	end     func()
	remote  string
	tlsConn *tls.ConnectionState
	ctx     context.Context
	cancel  context.CancelFunc

	br  *bufio.Reader
	fr  *http2.Framer // frames are read by Serve alone, written under wmu
	hdr *headerBlock  // decodes header blocks (Serve's)

	// wmu guards the writing side: out, the framer's writes, the hpack encoder. Frames are
	// written into out, and out to the connection by one goroutine at a time, the flusher,
	// without wmu held (see flushLocked).
	wmu      sync.Mutex
	out      writeBuf // frames not yet written to the connection
	spare    []byte   // the flusher's other buffer
	flushing bool     // a flusher is writing
	// openStreams is len(streams), for a flusher that holds wmu alone.
	openStreams atomic.Int32
	flushed     sync.Cond
	henc        *hpack.Encoder
	hbuf        writeBuf
	werr        error // the first write's error: nothing is written after it
	// flushAll asks the flusher under way to write all of out, not its whole records alone.
	flushAll bool
	// held is len(out) when a flush of whole records left the rest for the next frames: out
	// is that tail alone while len(out) is still held (frames only add to out, and a write
	// that takes from it sets held again). tail sends it when nothing came by its deadline
	// (see holdTailLocked).
	held    int
	tail    deadline.Timer
	started bool // the server's SETTINGS were written: a GOAWAY may follow

	// mu guards the streams and the flow-control windows; flow is signalled when a send
	// window grows, or a stream or the connection ends.
	mu         sync.Mutex
	flow       sync.Cond
	streams    map[uint32]*stream
	lastID     uint32 // the highest stream id the agent opened
	sendWindow int64  // the connection's, for DATA we send
	initWindow int64  // the agent's SETTINGS_INITIAL_WINDOW_SIZE
	maxWrite   int    // the agent's SETTINGS_MAX_FRAME_SIZE
	recvAvail  int64  // the connection's receive window left
	recvUnsent int64  // bytes read by handlers and not yet returned to the connection's window
	// pendingUpdates are WINDOW_UPDATEs to send, the next time the reader would wait.
	pendingUpdates []windowUpdate
	resetIDs       [16]uint32 // the streams the server reset last (see wasReset)
	resetNext      uint32
	freeCtxs       []streamCtx // contexts of streams that ended whole (see streamContext)
	running        int         // handlers running
	queued         []task      // streams waiting for a handler (running at its limit)
	deferred       []task      // streams whose handlers wait for the body (the reader's alone)
	goingAway      bool        // GOAWAY sent or received: no new stream
	closed         bool
	shutdown       bool // Shutdown was called
	idleSince      time.Time
	pingSent       bool
	pingData       [8]byte

	closeOnce sync.Once
	done      chan struct{}
}

// NewConn returns c served by s once Serve is called; end is called once, when it has ended.
// A *tls.Conn's state is each request's TLS.
func (s *Server) NewConn(c net.Conn, end func()) *Conn {
	conn := &Conn{s: s, raw: c, end: end, done: make(chan struct{})}
	if tc, ok := c.(*tls.Conn); ok {
		st := tc.ConnectionState()
		conn.tlsConn = &st
	}
	parent := s.BaseContext
	if parent == nil {
		parent = context.Background()
	}
	conn.ctx, conn.cancel = context.WithCancel(parent)
	conn.flow.L = &conn.mu
	conn.streams = map[uint32]*stream{}
	conn.sendWindow = 65535
	conn.initWindow = 65535
	conn.recvAvail = recvWindow
	conn.maxWrite = maxFrame
	conn.br = readers.Get().(*bufio.Reader)
	conn.br.Reset(c)
	conn.flushed.L = &conn.wmu
	conn.fr = http2.NewFramer(&conn.out, conn.br)
	conn.fr.SetReuseFrames()
	conn.hdr = newHeaderBlock(uint32(s.MaxHeaderBytes))
	conn.fr.SetMaxReadFrameSize(maxFrame)
	conn.henc = hpack.NewEncoder(&conn.hbuf)
	return conn
}

// connError is a connection error: GOAWAY with its code, then the connection ends.
type connError http2.ErrCode

func (e connError) Error() string { return "http2: connection error: " + http2.ErrCode(e).String() }

// streamError is a stream error: RST_STREAM with its code.
type streamError struct {
	id   uint32
	code http2.ErrCode
}

func (e streamError) Error() string { return "http2: stream error: " + e.code.String() }

var clientPreface = []byte(http2.ClientPreface)

// readers are connections' read buffers, pooled: Serve alone reads from one, and gives it
// back when it returns.
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4<<10) }}

// Serve reads and acts on the agent's frames until the connection ends.
func (c *Conn) Serve() {
	defer func() {
		c.dispatchDeferred(true) // their streams end with the connection, as they run
		c.close()
		// Nothing reads from br after this: the Framer reads only here (handlers still
		// running write with it, which does not touch br).
		c.br.Reset(nil)
		readers.Put(c.br)
		c.br = nil
	}()
	applied := time.Now().Add(c.s.ReadHeaderTimeout) // the read deadline the connection has
	_ = c.raw.SetReadDeadline(applied)
	var preface [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(c.br, preface[:]); err != nil || string(preface[:]) != http2.ClientPreface {
		return
	}
	c.wmu.Lock()
	if c.shutdownLocked() {
		c.wmu.Unlock()
		return
	}
	c.started = true
	c.writeErr(c.fr.WriteSettings(
		http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: c.s.MaxConcurrentStreams},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: recvWindow},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: uint32(c.s.MaxHeaderBytes)},
	))
	c.writeErr(c.fr.WriteWindowUpdate(0, recvWindow-65535))
	// Not written yet: the loop below writes what is pending before it waits for the agent,
	// so the agent's SETTINGS, sent with its preface, are acknowledged in the same write.
	c.wmu.Unlock()

	c.mu.Lock()
	c.idleSince = time.Now()
	c.mu.Unlock()
	first := true
	for {
		if c.br.Buffered() == 0 {
			c.dispatchDeferred(true)
			c.flushIfDirty()
			// The read deadline is moved only when it is less than half a period away: a
			// busy connection sets one every half period, not one per frame.
			now := time.Now()
			want := c.deadline(now)
			if want.Before(applied) || applied.Sub(now) < c.period()/2 {
				_ = c.raw.SetReadDeadline(want)
				applied = want
			}
		}
		f, err := c.readFrame()
		if err != nil {
			if isTimeout(err) {
				applied = time.Time{}
				if c.timedOut() {
					return
				}
				continue
			}
			var se http2.StreamError
			switch {
			case errors.As(err, &se):
				c.resetStream(se.StreamID, se.Code)
				continue
			case errors.Is(err, http2.ErrFrameTooLarge):
				c.goAwayAndClose(http2.ErrCodeFrameSize)
				return
			}
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				c.goAwayAndClose(http2.ErrCode(ce))
			}
			return
		}
		if first {
			if _, ok := f.(*http2.SettingsFrame); !ok {
				c.goAwayAndClose(http2.ErrCodeProtocol)
				return
			}
			first = false
		}
		if err := c.process(f); err != nil {
			var se streamError
			var ce connError
			switch {
			case errors.As(err, &se):
				c.resetStream(se.id, se.code)
			case errors.As(err, &ce):
				c.goAwayAndClose(http2.ErrCode(ce))
				return
			default:
				return
			}
		}
		if len(c.deferred) > 0 {
			c.dispatchDeferred(false)
		}
		if c.finished() {
			return
		}
	}
}

// readFrame reads the next frame, a header block with its CONTINUATION frames as one.
func (c *Conn) readFrame() (http2.Frame, error) {
	f, err := c.fr.ReadFrame()
	if hf, ok := f.(*http2.HeadersFrame); ok && err == nil {
		return c.hdr.read(c.fr, hf)
	}
	return f, err
}

// period is the read deadline's: the idle timeout, or the ping's.
func (c *Conn) period() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pingSent {
		return c.s.PingTimeout
	}
	return c.s.IdleTimeout
}

// deadline is when the next read times out: the idle timeout after the last stream ended
// (or after the agent's last frame, to send a PING), or the PING's answer.
func (c *Conn) deadline(now time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.pingSent:
		return now.Add(c.s.PingTimeout)
	case len(c.streams) == 0 && !c.idleSince.IsZero():
		return c.idleSince.Add(c.s.IdleTimeout)
	}
	return now.Add(c.s.IdleTimeout)
}

// timedOut acts on a read that timed out; it reports whether the connection ends.
func (c *Conn) timedOut() bool {
	now := time.Now()
	c.mu.Lock()
	idle := len(c.streams) == 0
	pinged := c.pingSent
	expired := idle && !c.idleSince.IsZero() && !now.Before(c.idleSince.Add(c.s.IdleTimeout))
	c.mu.Unlock()
	switch {
	case expired:
		c.goAwayAndClose(http2.ErrCodeNo)
		return true
	case pinged: // unanswered
		return true
	case idle:
		return false // not yet (the deadline was an older one)
	}
	c.mu.Lock()
	c.pingSent = true
	c.pingData = [8]byte{'c', 'a', 'p', 'b', 'r', 'o', 'k', 'r'}
	data := c.pingData
	c.mu.Unlock()
	c.wmu.Lock()
	c.writeErr(c.fr.WritePing(false, data))
	c.flushLocked(false)
	c.wmu.Unlock()
	return false
}

// finished reports whether a GOAWAY has been sent or received and no stream is left.
func (c *Conn) finished() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.goingAway && len(c.streams) == 0
}

// process acts on one frame.
func (c *Conn) process(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.SettingsFrame:
		return c.processSettings(f)
	case *http2.MetaHeadersFrame:
		return c.processHeaders(f)
	case *http2.DataFrame:
		return c.processData(f)
	case *http2.WindowUpdateFrame:
		return c.processWindowUpdate(f)
	case *http2.PingFrame:
		if f.StreamID != 0 {
			return connError(http2.ErrCodeProtocol)
		}
		if f.IsAck() {
			c.mu.Lock()
			if c.pingSent && f.Data == c.pingData {
				c.pingSent = false
			}
			c.mu.Unlock()
			return nil
		}
		c.wmu.Lock()
		c.wrote(c.fr.WritePing(true, f.Data))
		c.wmu.Unlock()
		return nil
	case *http2.RSTStreamFrame:
		c.mu.Lock()
		idle := c.isIdle(f.StreamID)
		st := c.streams[f.StreamID]
		c.mu.Unlock()
		if idle {
			return connError(http2.ErrCodeProtocol)
		}
		if st != nil {
			c.closeStream(st, errStreamReset)
		}
		return nil
	case *http2.PriorityFrame:
		if f.StreamID == f.StreamDep {
			return streamError{f.StreamID, http2.ErrCodeProtocol}
		}
		return nil
	case *http2.GoAwayFrame:
		c.mu.Lock()
		c.goingAway = true
		c.mu.Unlock()
		return nil
	case *http2.PushPromiseFrame:
		return connError(http2.ErrCodeProtocol)
	}
	return nil // unknown frames, and PRIORITY_UPDATE, are ignored
}

// wasReset reports whether id is among the streams the server reset last; c.mu is held.
func (c *Conn) wasReset(id uint32) bool {
	for _, r := range c.resetIDs {
		if r == id {
			return true
		}
	}
	return false
}

// isIdle reports whether id names a stream the agent has not opened yet; c.mu is held.
func (c *Conn) isIdle(id uint32) bool { return id > c.lastID }

func (c *Conn) processSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	if f.NumSettings() > 100 { // a parameter may repeat: the last value holds (RFC 9113, 6.5.3)
		return connError(http2.ErrCodeProtocol)
	}
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				return connError(ce)
			}
			return connError(http2.ErrCodeProtocol)
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			c.mu.Lock()
			delta := int64(s.Val) - c.initWindow
			c.initWindow = int64(s.Val)
			for _, st := range c.streams {
				st.sendWindow += delta
				if st.sendWindow > maxWindow {
					c.mu.Unlock()
					return connError(http2.ErrCodeFlowControl)
				}
			}
			c.flow.Broadcast()
			c.mu.Unlock()
		case http2.SettingMaxFrameSize:
			c.mu.Lock()
			c.maxWrite = int(s.Val)
			c.mu.Unlock()
		case http2.SettingHeaderTableSize:
			c.wmu.Lock()
			c.henc.SetMaxDynamicTableSizeLimit(s.Val)
			c.wmu.Unlock()
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.wmu.Lock()
	c.wrote(c.fr.WriteSettingsAck())
	c.wmu.Unlock()
	return nil
}

func (c *Conn) processWindowUpdate(f *http2.WindowUpdateFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.StreamID == 0 {
		c.sendWindow += int64(f.Increment)
		if c.sendWindow > maxWindow {
			return connError(http2.ErrCodeFlowControl)
		}
		c.flow.Broadcast()
		return nil
	}
	if c.isIdle(f.StreamID) {
		return connError(http2.ErrCodeProtocol)
	}
	st := c.streams[f.StreamID]
	if st == nil {
		return nil // a closed stream's: allowed for a while
	}
	st.sendWindow += int64(f.Increment)
	if st.sendWindow > maxWindow {
		return streamError{f.StreamID, http2.ErrCodeFlowControl}
	}
	c.flow.Broadcast()
	return nil
}

func (c *Conn) processData(f *http2.DataFrame) error {
	id := f.StreamID
	n := int64(f.Length) // padding included: all of it counts against the windows
	c.mu.Lock()
	if c.isIdle(id) {
		c.mu.Unlock()
		return connError(http2.ErrCodeProtocol)
	}
	if n > c.recvAvail {
		c.mu.Unlock()
		return connError(http2.ErrCodeFlowControl)
	}
	c.recvAvail -= n
	st := c.streams[id]
	if st == nil || st.remoteDone {
		// A closed stream's, or one the agent already ended: its bytes go back to the
		// connection's window at once.
		c.returnConn(n)
		c.mu.Unlock()
		return streamError{id, http2.ErrCodeStreamClosed}
	}
	if n > st.recvAvail {
		c.returnConn(n)
		c.mu.Unlock()
		return streamError{id, http2.ErrCodeFlowControl}
	}
	st.recvAvail -= n
	data := f.Data()
	st.bodyBytes += int64(len(data))
	if st.declared >= 0 && st.bodyBytes > st.declared {
		c.returnConn(n)
		c.mu.Unlock()
		return streamError{id, http2.ErrCodeProtocol}
	}
	if pad := n - int64(len(data)); pad > 0 {
		c.returnConn(pad)
	}
	if st.discard {
		c.returnConn(int64(len(data)))
	} else if len(data) > 0 {
		st.body.write(data)
		st.bodyCond.Signal()
	}
	if f.StreamEnded() {
		if st.declared >= 0 && st.bodyBytes != st.declared {
			c.mu.Unlock()
			return streamError{id, http2.ErrCodeProtocol}
		}
		c.endRemote(st)
	}
	c.mu.Unlock()
	return nil
}

// returnConn gives n bytes back to the connection's receive window, in WINDOW_UPDATEs of a
// quarter of it at least; c.mu is held.
func (c *Conn) returnConn(n int64) {
	c.recvUnsent += n
	if c.recvUnsent < recvWindow/4 {
		return
	}
	inc := c.recvUnsent
	c.recvUnsent = 0
	c.recvAvail += inc
	c.pendingUpdates = append(c.pendingUpdates, windowUpdate{0, uint32(inc)})
}

// endRemote marks st as ended by the agent (END_STREAM); c.mu is held.
func (c *Conn) endRemote(st *stream) {
	st.remoteDone = true
	st.bodyCond.Broadcast()
	if st.localDone {
		c.removeStream(st)
	}
}

// resetStream sends RST_STREAM for id and closes the stream.
func (c *Conn) resetStream(id uint32, code http2.ErrCode) {
	c.mu.Lock()
	if id > c.lastID && code != http2.ErrCodeRefusedStream {
		c.lastID = id // a stream refused as it opened is closed, not idle
	}
	st := c.streams[id]
	c.resetIDs[c.resetNext%uint32(len(c.resetIDs))] = id
	c.resetNext++
	c.mu.Unlock()
	c.wmu.Lock()
	c.wrote(c.fr.WriteRSTStream(id, code))
	c.wmu.Unlock()
	if st != nil {
		c.closeStream(st, errStreamReset)
	}
}

// goAwayAndClose sends GOAWAY with code and ends the connection, after reading what the
// agent sent meanwhile for a short while (closing with bytes unread would reset the
// connection, and the agent could lose the GOAWAY).
func (c *Conn) goAwayAndClose(code http2.ErrCode) {
	c.mu.Lock()
	last := c.lastID
	c.goingAway = true
	c.mu.Unlock()
	c.wmu.Lock()
	c.writeErr(c.fr.WriteGoAway(last, code, nil))
	c.flushLocked(true) // written before the write side is closed
	c.wmu.Unlock()
	if code == http2.ErrCodeNo {
		return
	}
	if cw, ok := c.raw.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = c.raw.SetReadDeadline(time.Now().Add(closeLinger))
	_, _ = io.Copy(io.Discard, io.LimitReader(c.br, 256<<10))
}

// closeLinger is how long a connection ended by an error is read before it is closed.
const closeLinger = 500 * time.Millisecond

// Shutdown sends GOAWAY and ends the connection once its open streams are done; it returns
// when the connection has ended, or with ctx's error.
func (c *Conn) Shutdown(ctx context.Context) error {
	c.mu.Lock()
	already := c.shutdown || c.closed
	c.shutdown = true
	c.goingAway = true
	last := c.lastID
	idle := len(c.streams) == 0
	c.mu.Unlock()
	if !already {
		c.wmu.Lock()
		if c.started {
			c.writeErr(c.fr.WriteGoAway(last, http2.ErrCodeNo, nil))
			c.flushLocked(true)
		} else {
			idle = true // before the server's SETTINGS: nothing to finish
		}
		c.wmu.Unlock()
	}
	if idle {
		c.close()
	}
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// shutdownLocked reports whether Shutdown was called; c.wmu is held.
func (c *Conn) shutdownLocked() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.shutdown
}

// close ends the connection and every stream in it; once. What a response left to the write
// under way is written first, for as long as closeLinger at most (an agent that reads
// nothing does not hold it).
func (c *Conn) close() {
	c.closeOnce.Do(func() {
		c.wmu.Lock()
		if c.flushing || len(c.out.b) > 0 {
			_ = c.raw.SetWriteDeadline(time.Now().Add(closeLinger))
			c.flushLocked(true)
		}
		c.tail.Stop()
		c.wmu.Unlock()
		_ = c.raw.Close()
		c.cancel()
		c.mu.Lock()
		c.closed = true
		for _, st := range c.streams {
			c.endStreamLocked(st, errConnClosed)
		}
		c.flow.Broadcast()
		c.mu.Unlock()
		c.end()
		close(c.done)
	})
}

var (
	errStreamReset = errors.New("http2: stream reset")
	errConnClosed  = errors.New("http2: connection closed")
)

// writeErr keeps a write's first error; c.wmu is held.
func (c *Conn) writeErr(err error) {
	if err != nil && c.werr == nil {
		c.werr = err
		_ = c.raw.Close() // the reader and every writer stop
	}
}

// wrote keeps the error of a frame's write and makes room for the next; c.wmu is held, and
// may be released: not between the frames of a header block.
func (c *Conn) wrote(err error) {
	c.writeErr(err)
	c.roomLocked()
}

// maxPending is how much a writer may add to out while the flusher writes before it waits.
const maxPending = 4 * writeSize

// flushLocked writes out to the connection; c.wmu is held, and released meanwhile. When
// another goroutine is writing already, out is left to it, which writes what was added
// meanwhile when its write returns: frames of streams that end together leave in one write
// (group commit), and no writer waits for the lock while another's write system call runs.
// With wait, flushLocked returns once out is written (or the connection failed).
//
// With other streams open, a flusher first yields the processor once: the goroutines ready
// to run then (handlers whose upstream answered in the same poll) add their frames before
// the write rather than make one each, about one write for every two or three responses
// where there was one per response. A yield finds nothing else to run quickly when there
// is none.
func (c *Conn) flushLocked(wait bool) {
	c.flushAll = true
	c.flushOut(wait)
}

// flushRecordsLocked writes out's whole TLS records' worth (writeSize each) and leaves the
// rest in out, unless a flush of all of it was asked meanwhile; c.wmu is held. A DATA frame
// of 16 KiB is 9 bytes more than a record: written whole, each would be two records and two
// system calls, the second of 9 bytes.
func (c *Conn) flushRecordsLocked() { c.flushOut(false) }

// flushOut is flushLocked, of whole records alone unless c.flushAll.
func (c *Conn) flushOut(wait bool) {
	if c.flushing {
		for wait && c.flushing {
			c.flushed.Wait()
		}
		return
	}
	c.flushing = true
	if !wait && c.openStreams.Load() > 1 {
		c.wmu.Unlock()
		runtime.Gosched()
		c.wmu.Lock()
	}
	for c.werr == nil {
		n := len(c.out.b)
		if !c.flushAll {
			n -= n % writeSize
		}
		if n == 0 {
			break
		}
		b := c.out.b
		// out and spare never share an array; what is left of out moves to spare's, held.
		c.out.b = append(c.spare[:0], b[n:]...)
		c.spare, c.held = nil, len(c.out.b)
		if c.held == 0 {
			c.flushAll = false
		}
		c.wmu.Unlock()
		_, err := c.raw.Write(b[:n])
		c.wmu.Lock()
		if cap(b) <= 2*maxPending {
			c.spare = b[:0]
		}
		c.writeErr(err)
		c.flushed.Broadcast() // room in out
	}
	switch {
	case c.werr != nil:
		c.out.b = c.out.b[:0]
	case len(c.out.b) > 0:
		c.holdLocked()
	default:
		c.flushAll = false // nothing was left to write (the flush asked for found out empty)
	}
	c.flushing = false
	c.flushed.Broadcast()
}

// tailDelay bounds how long holdTailLocked holds a record's tail. A variable for tests.
var tailDelay = time.Millisecond

// maxTail is the most holdTailLocked holds. Each 16 KiB DATA frame adds its 9 bytes of
// header to what is carried: 1 KiB is a flush, and a short record, in 113 frames.
const maxTail = 1 << 10

// holdTailLocked is a flush that may leave what is over out's whole records for the next
// frames: a body written about a record or more at a time (a download streamed as it
// arrives, 16 KiB per upstream record) fills whole records, and each frame's header leaves 9
// bytes over; flushed at once they would be a TLS record, and a write, of their own per
// frame. They go with the next frames, or after tailDelay when none came, or with any flush
// of all of out (a stream's end, the reader's frames, a writer waiting for the agent's
// window). c.wmu is held. As broker/http1 holds a chunked body's tail.
func (c *Conn) holdTailLocked() {
	c.flushRecordsLocked()
	if len(c.out.b) > maxTail {
		c.flushLocked(false)
	}
}

// holdLocked holds what a flush of whole records left in out (see held), and has the timer
// send it tailDelay after the last hold; c.wmu is held.
func (c *Conn) holdLocked() {
	c.held = len(c.out.b)
	c.tail.Set(tailDelay, c.sendTail)
}

// sendTail writes a tail holdTailLocked held, when nothing else has. A download holds a tail
// after every frame: a later hold moves the deadline, not the timer, and sendTail then waits
// for it (internal/deadline says why).
func (c *Conn) sendTail() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.tail.Due() {
		return
	}
	if c.werr == nil && (len(c.out.b) > 0 || c.flushing) {
		c.flushLocked(false)
	}
}

// roomLocked makes room in out after a frame was added: past a TLS record's worth it is
// written, or, when a flusher is writing and out has grown past maxPending, it waits for
// the flusher to take it; c.wmu is held.
func (c *Conn) roomLocked() {
	for len(c.out.b) >= writeSize && c.werr == nil {
		if !c.flushing {
			c.flushRecordsLocked()
			return
		}
		if len(c.out.b) < maxPending {
			return
		}
		c.flushed.Wait()
	}
}

// flushIfDirty sends the frames the reader wrote (acknowledgements, resets, window updates),
// and the windows returned since, before the reader waits for more: all of out, unless it
// holds a held tail alone (see holdTailLocked), which waits for the next frames.
func (c *Conn) flushIfDirty() { c.flushPending(false) }

// flushPending is flushIfDirty, a held tail sent too when held: for a writer about to wait
// for the agent's window, which the agent returns only for frames it has whole.
func (c *Conn) flushPending(held bool) {
	c.mu.Lock()
	ups := c.takeUpdates()
	c.mu.Unlock()
	c.wmu.Lock()
	for _, u := range ups {
		c.wrote(c.fr.WriteWindowUpdate(u.id, u.inc))
	}
	if len(c.out.b) > 0 && (held || len(c.out.b) != c.held) {
		c.flushLocked(false)
	}
	c.wmu.Unlock()
}

// windowUpdate is a WINDOW_UPDATE to send.
type windowUpdate struct {
	id  uint32
	inc uint32
}

// takeUpdates returns the window updates waiting to be sent; c.mu is held.
func (c *Conn) takeUpdates() []windowUpdate {
	if len(c.pendingUpdates) == 0 {
		return nil
	}
	ups := c.pendingUpdates
	c.pendingUpdates = nil
	return ups
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// writeBuf is the hpack encoder's output.
type writeBuf struct{ b []byte }

func (w *writeBuf) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }
