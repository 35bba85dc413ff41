package integration

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// TestH2StalledAgent: an agent that asks for a large response over HTTP/2 and never opens
// its flow-control window leaves the stream's handler waiting, not the broker: another agent
// is served meanwhile, and when the stalled agent goes away its request upstream ends (the
// handler, and the upstream response it was copying, are let go).
func TestH2StalledAgent(t *testing.T) {
	upstreamDone := make(chan struct{}, 1)
	h := startH2specBroker(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/big" {
			_, _ = io.WriteString(w, h2specBody)
			return
		}
		defer func() { upstreamDone <- struct{}{} }()
		chunk := strings.Repeat("x", 32<<10)
		for {
			if _, err := io.WriteString(w, chunk); err != nil {
				return // the broker let go of the response
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			default:
			}
		}
	}))
	r := startRawH2(t, h.h2Tunnel(t, h2specAgent))
	// A window of nothing: the broker may send the response's head, and no DATA.
	if err := r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}); err != nil {
		t.Fatal(err)
	}
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: r.headerBlock(h, "/big"), EndStream: true, EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	if err := r.fr.WritePing(false, [8]byte{'s', 't', 'a', 'l', 'l'}); err != nil {
		t.Fatal(err)
	}
	if err := r.bw.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.pingAck: // the connection's reader is not held up by the stalled stream
	case <-r.done:
		t.Fatalf("the broker ended the stalled agent's connection: %v", r.readErr)
	case <-time.After(waitTimeout):
		t.Fatal("no answer to the PING")
	}
	h.servesBystander(t)
	r.conn.Close()
	<-r.done
	select {
	case <-upstreamDone:
	case <-time.After(waitTimeout):
		t.Fatal("the stalled agent went away and its request upstream went on")
	}
}
