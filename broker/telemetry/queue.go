package telemetry

import (
	"context"
	"sync"
	"time"
)

// queue holds what waits to be exported, bounded: put never blocks. What finds it full is
// dropped and counted; a batch whose export fails (the collector down, slow past
// export_timeout, or refusing) is dropped and counted too. One goroutine exports, in batches
// of up to batch items, at most wait after an item arrived.
type queue[T any] struct {
	items   chan T
	batch   int
	wait    time.Duration
	timeout time.Duration
	export  func(context.Context, []T) error
	dropped func(reason string, n int)
	// count is how many of the signal's items v holds (nil: one), for the drop counts.
	count func(v T) int

	full  chan struct{} // a batch is queued (wake items: a batch, or the whole queue)
	wake  int
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
		full: make(chan struct{}, 1), wake: max(min(batch, size), 1),
		flush: make(chan chan struct{}), stop: make(chan struct{}), done: make(chan struct{}),
	}
	go q.run()
	return q
}

// put queues v, or drops it when the queue is full or closed. It wakes the export goroutine
// only when a batch is full: the goroutine otherwise sleeps until its tick, so that a request
// does not pay for waking it (a put was a hand-over to a goroutine waiting on the channel).
func (q *queue[T]) put(v T) {
	select {
	case <-q.stop:
		q.dropped(dropQueueFull, q.n(v))
		return
	default:
	}
	select {
	case q.items <- v:
		if len(q.items) >= q.wake {
			select {
			case q.full <- struct{}{}:
			default: // already told
			}
		}
	default:
		q.dropped(dropQueueFull, q.n(v))
	}
}

func (q *queue[T]) n(v T) int {
	if q.count == nil {
		return 1
	}
	return q.count(v)
}

// run exports what is queued when a batch is full, and at every tick of wait what is there:
// nothing waits longer than wait to be exported.
func (q *queue[T]) run() {
	defer close(q.done)
	buf := make([]T, 0, q.batch)
	tick := time.NewTicker(q.wait)
	defer tick.Stop()
	send := func() {
		if len(buf) == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), q.timeout)
		if err := q.export(ctx, buf); err != nil {
			n := 0
			for _, v := range buf {
				n += q.n(v)
			}
			q.dropped(dropExportFailed, n)
		}
		cancel()
		clear(buf)
		buf = buf[:0]
	}
	for {
		select {
		case <-q.full:
		case <-tick.C:
		case ack := <-q.flush:
			q.drain(&buf, send)
			close(ack)
			continue
		case <-q.stop:
			q.drain(&buf, send)
			return
		}
		q.drain(&buf, send)
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
