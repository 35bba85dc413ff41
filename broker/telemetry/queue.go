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
//
// It is a ring under a mutex rather than a channel: every request puts one item in each
// signal's queue, from any goroutine, while the export goroutine takes them out; a channel
// locks once for each item taken as for each put, and a profile of the broker under load found
// the puts contending with the taking at about a fifth of the telemetry's CPU. The exporter
// takes a whole batch under one lock.
type queue[T any] struct {
	mu     sync.Mutex
	ring   []T // the items waiting, from head, n of them (guarded by mu)
	head   int
	n      int
	closed bool

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
	size, batch = max(size, 1), max(batch, 1)
	q := &queue[T]{
		ring: make([]T, size), batch: batch, wait: wait, timeout: timeout,
		export: export, dropped: dropped,
		full: make(chan struct{}, 1), wake: min(batch, size),
		flush: make(chan chan struct{}), stop: make(chan struct{}), done: make(chan struct{}),
	}
	go q.run()
	return q
}

// put queues v, or drops it when the queue is full or closed. It wakes the export goroutine
// only when a batch is full: the goroutine otherwise sleeps until its tick, so that a request
// does not pay for waking it.
func (q *queue[T]) put(v T) {
	q.mu.Lock()
	if q.closed || q.n == len(q.ring) {
		q.mu.Unlock()
		q.dropped(dropQueueFull, q.weight(v))
		return
	}
	q.ring[(q.head+q.n)%len(q.ring)] = v
	q.n++
	n := q.n
	q.mu.Unlock()
	if n >= q.wake {
		select {
		case q.full <- struct{}{}:
		default: // already told
		}
	}
}

// take moves up to a batch of the waiting items, oldest first, to buf, when at least least
// are waiting.
func (q *queue[T]) take(buf []T, least int) []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n < least {
		return buf
	}
	k := min(q.n, q.batch)
	for k > 0 {
		seg := q.ring[q.head:min(q.head+k, len(q.ring))]
		buf = append(buf, seg...)
		clear(seg) // the ring keeps no reference to what was taken
		q.head = (q.head + len(seg)) % len(q.ring)
		q.n -= len(seg)
		k -= len(seg)
	}
	return buf
}

// weight is how many of the signal's items v holds, for the drop counts.
func (q *queue[T]) weight(v T) int {
	if q.count == nil {
		return 1
	}
	return q.count(v)
}

// run exports whole batches when a batch is full, and at every tick of wait everything
// there: nothing waits longer than wait to be exported, and under load every export is a
// whole batch. (Exporting all there was after each batch sent, as it did, made the exports
// after the first as small as what arrived meanwhile: dozens a second more, each with its
// headers, system calls and flow control.)
func (q *queue[T]) run() {
	defer close(q.done)
	buf := make([]T, 0, q.batch)
	tick := time.NewTicker(q.wait)
	defer tick.Stop()
	for {
		select {
		case <-q.full:
			buf = q.drain(buf, q.wake)
		case <-tick.C:
			buf = q.drain(buf, 1)
		case ack := <-q.flush:
			buf = q.drain(buf, 1)
			close(ack)
		case <-q.stop:
			q.mu.Lock()
			q.closed = true // what comes later is dropped; what is queued is exported
			q.mu.Unlock()
			q.drain(buf, 1)
			return
		}
	}
}

// drain exports what is queued, a batch at a time, while at least least items wait.
func (q *queue[T]) drain(buf []T, least int) []T {
	for {
		buf = q.take(buf[:0], least)
		if len(buf) == 0 {
			return buf
		}
		ctx, cancel := context.WithTimeout(context.Background(), q.timeout)
		if err := q.export(ctx, buf); err != nil {
			n := 0
			for _, v := range buf {
				n += q.weight(v)
			}
			q.dropped(dropExportFailed, n)
		}
		cancel()
		clear(buf)
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
