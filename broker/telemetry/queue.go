package telemetry

import (
	"context"
	"sync"
	"time"

	sdklog "go.opentelemetry.io/otel/sdk/log"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// queue holds what waits to be exported, bounded: put never blocks. What finds it full is
// dropped and counted; a batch whose export fails (the collector down, slow past
// export_timeout, or refusing) is dropped and counted too. One goroutine exports, in batches
// of up to batch items, at most wait after the first item of a batch arrived.
type queue[T any] struct {
	items   chan T
	batch   int
	wait    time.Duration
	timeout time.Duration
	export  func(context.Context, []T) error
	dropped func(reason string, n int)

	flush chan chan struct{}
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
}

// Drop reasons (the reason label of capbroker_telemetry_dropped_total).
const (
	dropQueueFull    = "queue_full"
	dropExportFailed = "export_failed"
)

func newQueue[T any](size, batch int, wait, timeout time.Duration, export func(context.Context, []T) error, dropped func(string, int)) *queue[T] {
	q := &queue[T]{
		items: make(chan T, size), batch: batch, wait: wait, timeout: timeout,
		export: export, dropped: dropped,
		flush: make(chan chan struct{}), stop: make(chan struct{}), done: make(chan struct{}),
	}
	go q.run()
	return q
}

// put queues v, or drops it when the queue is full or closed.
func (q *queue[T]) put(v T) {
	select {
	case <-q.stop:
		q.dropped(dropQueueFull, 1)
		return
	default:
	}
	select {
	case q.items <- v:
	default:
		q.dropped(dropQueueFull, 1)
	}
}

func (q *queue[T]) run() {
	defer close(q.done)
	buf := make([]T, 0, q.batch)
	timer := time.NewTimer(q.wait)
	timer.Stop()
	send := func() {
		if len(buf) == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), q.timeout)
		if err := q.export(ctx, buf); err != nil {
			q.dropped(dropExportFailed, len(buf))
		}
		cancel()
		clear(buf)
		buf = buf[:0]
	}
	for {
		select {
		case v := <-q.items:
			if len(buf) == 0 {
				timer.Reset(q.wait)
			}
			buf = append(buf, v)
			if len(buf) >= q.batch {
				timer.Stop()
				send()
			}
		case <-timer.C:
			send()
		case ack := <-q.flush:
			timer.Stop()
			q.drain(&buf, send)
			close(ack)
		case <-q.stop:
			timer.Stop()
			q.drain(&buf, send)
			return
		}
	}
}

// drain exports everything queued now.
func (q *queue[T]) drain(buf *[]T, send func()) {
	for {
		select {
		case v := <-q.items:
			*buf = append(*buf, v)
			if len(*buf) >= q.batch {
				send()
			}
		default:
			send()
			return
		}
	}
}

// Flush exports what is queued, waiting at most until ctx ends.
func (q *queue[T]) Flush(ctx context.Context) error {
	ack := make(chan struct{})
	select {
	case q.flush <- ack:
	case <-q.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-ack:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close exports what is queued and stops, waiting at most until ctx ends.
func (q *queue[T]) Close(ctx context.Context) error {
	q.once.Do(func() { close(q.stop) })
	select {
	case <-q.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// spanQueue is the SDK's span processor over a queue: ended spans are queued, never waited for.
type spanQueue struct{ q *queue[sdktrace.ReadOnlySpan] }

var _ sdktrace.SpanProcessor = spanQueue{}

func (spanQueue) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (s spanQueue) OnEnd(span sdktrace.ReadOnlySpan)              { s.q.put(span) }
func (s spanQueue) Shutdown(ctx context.Context) error            { return s.q.Close(ctx) }
func (s spanQueue) ForceFlush(ctx context.Context) error          { return s.q.Flush(ctx) }

// logQueue is the SDK's log processor over a queue: each record is copied and queued.
type logQueue struct{ q *queue[sdklog.Record] }

var _ sdklog.Processor = logQueue{}

func (l logQueue) OnEmit(_ context.Context, r *sdklog.Record) error {
	l.q.put(r.Clone())
	return nil
}
func (logQueue) Enabled(context.Context, sdklog.EnabledParameters) bool { return true }
func (l logQueue) Shutdown(ctx context.Context) error                   { return l.q.Close(ctx) }
func (l logQueue) ForceFlush(ctx context.Context) error                 { return l.q.Flush(ctx) }
