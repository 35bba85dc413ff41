package http1

import (
	"sync"
	"time"
)

// The watch: a request's context ends when its agent goes away, as with net/http's server.
// Only reading the connection tells, and a read beside the handler costs a goroutine and its
// wake-up, so it is started only for a request still being handled after watchDelay (its
// body read, if it had one). One ticker, for every connection being served, finds those: a
// timer per request would cost a timer set and stopped per request, and on a quiet machine a
// wake-up of the network poller with each (the timer being the earliest).

// watchDelay is how long a request is handled before the connection is read to learn whether
// its agent went away. Most responses are done sooner, and no read happens for them at all.
const watchDelay = 5 * time.Millisecond

// watched holds the connections being served (not parked), for the ticker.
var watched = &watchList{conns: map[*Conn]int{}}

type watchList struct {
	mu sync.Mutex
	// conns counts each connection's Serve calls under way. There can be two: a parked
	// connection is served again by its park's goroutine, which may add it before the Serve
	// that parked it has removed it. A set would then lose the connection while it serves,
	// and no request of it would be watched again.
	conns   map[*Conn]int
	ticking bool
	due     []*Conn
}

func (l *watchList) add(c *Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.conns[c]++
	if !l.ticking {
		l.ticking = true
		go l.tick()
	}
}

func (l *watchList) remove(c *Conn) {
	l.mu.Lock()
	if l.conns[c]--; l.conns[c] <= 0 {
		delete(l.conns, c)
	}
	l.mu.Unlock()
}

// tick starts the watch of each request handled for watchDelay, until no connection is
// served.
func (l *watchList) tick() {
	t := time.NewTicker(watchDelay)
	defer t.Stop()
	for range t.C {
		now := nanotime()
		l.mu.Lock()
		if len(l.conns) == 0 {
			l.ticking = false
			l.mu.Unlock()
			return
		}
		due := l.due[:0]
		for c := range l.conns {
			if from := c.watchFrom.Load(); from != 0 && now-from >= int64(watchDelay) {
				due = append(due, c)
			}
		}
		l.due = due[:0]
		l.mu.Unlock()
		for _, c := range due {
			c.startWatch()
		}
	}
}

// epoch makes nanotime's zero mean "not set".
var epoch = time.Now().Add(-time.Second)

func nanotime() int64 { return int64(time.Since(epoch)) }

// watchable says the request being handled may be watched from now on: it has been read
// whole.
func (c *Conn) watchable() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.hijacked {
		c.watchFrom.Store(nanotime())
	}
}

// startWatch reads the connection beside the handler (watchAgent), once per request.
func (c *Conn) startWatch() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.watchFrom.Load() == 0 || c.watchOn {
		return
	}
	c.watchOn = true
	go c.watchFn() // (c.watchAgent made once: a go statement's wrapper would be allocated for each)
}

// watchAgent reads the connection while a request is handled: a byte read is the next
// request's, put back for it; the connection failing (the agent went away) ends the request's
// context; an abort (stopWatch) ends the read without either.
func (c *Conn) watchAgent() {
	c.mu.Lock()
	if c.abortWatch {
		c.mu.Unlock()
		c.watchEnded <- struct{}{}
		return
	}
	c.watchRead = true
	c.src.want, c.src.applied = time.Time{}, time.Time{}
	_ = c.raw.SetReadDeadline(time.Time{})
	c.mu.Unlock()
	if c.s.onWatch != nil {
		c.s.onWatch()
	}
	var b [1]byte
	n, err := c.raw.Read(b[:])
	c.mu.Lock()
	c.watchRead = false
	aborted := c.abortWatch
	cancel := c.cancel
	c.mu.Unlock()
	switch {
	case n == 1:
		c.src.unread(b[0])
	case err != nil && !(aborted && isTimeout(err)):
		cancel()
	}
	c.watchEnded <- struct{}{}
}

// stopWatch ends the request's watch before the connection is read or written again for the
// next request; a request that was never watched costs a lock and an atomic store.
func (c *Conn) stopWatch() {
	c.mu.Lock()
	c.watchFrom.Store(0)
	on := c.watchOn
	c.watchOn = false
	if !on {
		c.mu.Unlock()
		return
	}
	c.abortWatch = true
	if c.watchRead {
		_ = c.raw.SetReadDeadline(aLongTimeAgo)
	}
	c.mu.Unlock()
	<-c.watchEnded
	c.mu.Lock()
	c.abortWatch = false
	c.mu.Unlock()
	c.src.applied = aLongTimeAgo // the next read sets its own deadline
}
