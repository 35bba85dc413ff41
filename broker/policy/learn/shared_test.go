package learn

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/capbroker/capbroker/broker/budget/redistest"
)

// TestRecorderShared: two brokers' recorders send their decision events with input to one
// stream, and ReadShared gives every one of them back; other lines are not sent; with the
// store gone a batch is kept, within the bound.
func TestRecorderShared(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	ctx := context.Background()
	a, b := &Recorder{Client: c, Key: "l:learn"}, &Recorder{Client: c, Key: "l:learn"}
	a.Tap([]byte(`{"msg":"decision","agent":"x","input":{"phase":"connect"}}` + "\n"))
	a.Tap([]byte(`{"msg":"decision","agent":"x"}` + "\n")) // no input: not useful to learn
	a.Tap([]byte(`{"msg":"approval","input":{}}` + "\n"))
	b.Tap([]byte(`{"msg":"decision","agent":"y","input":{"phase":"request"}}` + "\n"))
	a.flush(ctx)
	b.flush(ctx)
	r, err := ReadShared(ctx, c, "l:learn")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(r)
	lines := strings.Split(strings.TrimSpace(string(got)), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"agent":"x"`) || !strings.Contains(lines[1], `"agent":"y"`) {
		t.Fatalf("read back %q", got)
	}
	srv.Stop()
	for range RecordBuffer + 5 {
		a.Tap([]byte(`{"msg":"decision","input":{}}`))
	}
	a.flush(ctx)
	a.mu.Lock()
	kept := len(a.pending)
	a.mu.Unlock()
	if kept != RecordBuffer || a.Dropped.Load() != 5 {
		t.Fatalf("store down: %d kept, %d dropped", kept, a.Dropped.Load())
	}
}
