package learn

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Recorder keeps the decision events of every broker of a fleet in one Redis stream
// (PREFIX learn), so that `broker policy learn --from fleet` drafts from all of them rather
// than from one replica's audit log. Events are sent in the background, a batch every
// RecordInterval, never on a request's path; a batch Redis does not take is kept (up to
// RecordBuffer events, then the oldest are dropped and counted): each replica's audit log
// still has every one.
type Recorder struct {
	Client *redis.Client
	Key    string // PREFIX learn
	// Background marks the recorder's contexts (for counting round trips); nil: none.
	Background func(context.Context) context.Context

	mu      sync.Mutex
	pending [][]byte
	Dropped atomic.Int64
}

// Recorder bounds.
const (
	RecordInterval = 100 * time.Millisecond
	RecordBuffer   = 10000
	// RecordMax is about how many events the stream keeps (XADD MAXLEN ~).
	RecordMax = 200000
)

var decisionMsg = []byte(`"msg":"decision"`)

// Tap takes an audit line (audit.Tap): decision events carrying their input are kept.
func (r *Recorder) Tap(line []byte) {
	if !bytes.Contains(line, decisionMsg) || !bytes.Contains(line, []byte(`"input":`)) {
		return
	}
	line = bytes.TrimRight(line, "\n")
	r.mu.Lock()
	if len(r.pending) >= RecordBuffer {
		r.pending = r.pending[1:]
		r.Dropped.Add(1)
	}
	r.pending = append(r.pending, bytes.Clone(line))
	r.mu.Unlock()
}

// Run sends the events every RecordInterval until ctx ends, then once more.
func (r *Recorder) Run(ctx context.Context) {
	t := time.NewTicker(RecordInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			r.flush(context.Background())
			return
		case <-t.C:
			r.flush(ctx)
		}
	}
}

func (r *Recorder) flush(ctx context.Context) {
	r.mu.Lock()
	batch := r.pending
	r.pending = nil
	r.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	if r.Background != nil {
		ctx = r.Background(ctx)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := r.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, line := range batch {
			p.XAdd(ctx, &redis.XAddArgs{Stream: r.Key, MaxLen: RecordMax, Approx: true, Values: []any{"e", line}})
		}
		return nil
	})
	if err != nil {
		r.mu.Lock()
		r.pending = append(batch, r.pending...)
		if over := len(r.pending) - RecordBuffer; over > 0 {
			r.pending = r.pending[over:]
			r.Dropped.Add(int64(over))
		}
		r.mu.Unlock()
	}
}

// ReadShared returns the fleet's recorded events as JSON lines, for Read.
func ReadShared(ctx context.Context, c *redis.Client, key string) (io.Reader, error) {
	var b strings.Builder
	start := "-"
	for {
		msgs, err := c.XRangeN(ctx, key, start, "+", 1000).Result()
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if e, ok := m.Values["e"].(string); ok {
				b.WriteString(e)
				b.WriteByte('\n')
			}
		}
		if len(msgs) < 1000 {
			return strings.NewReader(b.String()), nil
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
}
