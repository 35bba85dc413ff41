package http2srv

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/capbroker/capbroker/internal/tcppair"
)

// benchClient is an agent that speaks HTTP/2 with a bare Framer: the cheapest client, so that
// the process's CPU per request is mostly the server's.
type benchClient struct {
	fr       *http2.Framer
	bw       *bufio.Writer
	enc      *hpack.Encoder
	block    bytes.Buffer
	next     uint32
	consumed uint32 // DATA bytes not yet returned to the server's connection window
}

// newBenchClient is an agent on conn that has written the preface and its SETTINGS (not yet
// flushed).
func newBenchClient(conn net.Conn) *benchClient {
	bc := &benchClient{bw: bufio.NewWriter(conn), next: 1}
	bc.fr = http2.NewFramer(bc.bw, bufio.NewReader(conn))
	bc.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	bc.enc = hpack.NewEncoder(&bc.block)
	io.WriteString(bc.bw, http2.ClientPreface)
	bc.fr.WriteSettings()
	return bc
}

// benchConn serves a handler like broker/http1's BenchmarkRequest's (a two-byte body with
// its Content-Length) on a loopback TCP connection, with a Server like the broker's, and
// returns the agent's end, past the preface and the SETTINGS exchange.
func benchConn(b *testing.B) (*benchClient, *countingConn) {
	agent, tcp := tcppair.New(b)
	raw := &countingConn{Conn: tcp}
	s := &Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "2")
		io.WriteString(w, "ok")
	}), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute, PingTimeout: 5 * time.Second,
		MaxHeaderBytes: 64 << 10, MaxConcurrentStreams: 100}
	c := s.NewConn(raw, func() {})
	go c.Serve()
	b.Cleanup(func() { _ = c.Shutdown(b.Context()) })
	bc := newBenchClient(agent)
	bc.fr.WriteWindowUpdate(0, 1<<30)
	bc.bw.Flush()
	return bc, raw
}

// countingConn counts the server's writes, each a system call.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// send opens a stream with a GET, as Go's Transport sends one; it is flushed by flush.
func (bc *benchClient) send(b *testing.B) {
	bc.block.Reset()
	for _, f := range [...]hpack.HeaderField{
		{Name: ":authority", Value: "api.example.test"}, {Name: ":method", Value: "GET"},
		{Name: ":path", Value: "/v1/models"}, {Name: ":scheme", Value: "https"},
		{Name: "authorization", Value: "Bearer agent-token"}, {Name: "accept-encoding", Value: "gzip"},
		{Name: "user-agent", Value: "Go-http-client/2.0"},
	} {
		bc.enc.WriteField(f)
	}
	if err := bc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: bc.next, BlockFragment: bc.block.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
		b.Fatal(err)
	}
	bc.next += 2
}

func (bc *benchClient) flush(b *testing.B) {
	if err := bc.bw.Flush(); err != nil {
		b.Fatal(err)
	}
}

// wait reads frames until a stream's response has ended, and returns that stream's id.
func (bc *benchClient) wait(b *testing.B) uint32 {
	for {
		f, err := bc.fr.ReadFrame()
		if err != nil {
			b.Fatal(err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				bc.fr.WriteSettingsAck()
				bc.flush(b)
			}
		case *http2.MetaHeadersFrame:
			if f.PseudoValue("status") != "200" {
				b.Fatalf("status %q", f.PseudoValue("status"))
			}
			if f.StreamEnded() {
				return f.StreamID
			}
		case *http2.DataFrame:
			if bc.consumed += f.Length; bc.consumed > 1<<20 {
				bc.fr.WriteWindowUpdate(0, bc.consumed)
				bc.consumed = 0
			}
			if f.StreamEnded() {
				return f.StreamID
			}
		case *http2.RSTStreamFrame, *http2.GoAwayFrame:
			b.Fatalf("%v", f)
		}
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRequest times one request and its response on a connection over loopback TCP (no
// TLS, no pipeline: a handler that answers at once, as broker/http1's BenchmarkRequest), one
// stream at a time and with 32 in flight (the bench's h2 client), and reports the process's
// CPU time per request: what serving HTTP/2 on a tunnel costs.
func BenchmarkRequest(b *testing.B) {
	for _, inFlight := range []int{1, 32} {
		b.Run("streams="+strconv.Itoa(inFlight), func(b *testing.B) {
			bc, raw := benchConn(b)
			b.ReportAllocs()
			c0, w0 := processCPU(), raw.writes.Load()
			open := 0
			for b.Loop() {
				for open < inFlight {
					bc.send(b)
					open++
				}
				bc.flush(b)
				bc.wait(b)
				open--
			}
			for ; open > 0; open-- {
				bc.wait(b)
			}
			b.ReportMetric(float64((processCPU()-c0).Nanoseconds())/float64(b.N)/1000, "cpu-µs/op")
			b.ReportMetric(float64(raw.writes.Load()-w0)/float64(b.N), "writes/op")
		})
	}
}

// BenchmarkConnection times a connection that carries one request, as a client that makes a
// connection per command: the preface, both SETTINGS and their acknowledgements, the request
// and its response, and the close, over loopback TCP (no TLS). The CPU per connection is the
// process's (client included); the writes are the server's.
func BenchmarkConnection(b *testing.B) {
	s := &Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "2")
		io.WriteString(w, "ok")
	}), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute, PingTimeout: 5 * time.Second,
		MaxHeaderBytes: 64 << 10, MaxConcurrentStreams: 100}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	var writes atomic.Int64
	ended := make(chan struct{}, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			raw := &countingConn{Conn: c}
			go func() {
				s.NewConn(raw, func() {}).Serve()
				writes.Add(raw.writes.Load())
				ended <- struct{}{}
			}()
		}
	}()
	b.ReportAllocs()
	c0 := processCPU()
	for b.Loop() {
		agent, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		bc := newBenchClient(agent)
		bc.send(b)
		bc.flush(b)
		bc.wait(b)
		agent.Close()
		<-ended
	}
	b.ReportMetric(float64((processCPU()-c0).Nanoseconds())/float64(b.N)/1000, "cpu-µs/op")
	b.ReportMetric(float64(writes.Load())/float64(b.N), "writes/op")
}
