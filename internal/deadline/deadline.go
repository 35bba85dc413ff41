// Package deadline is a timer whose deadline may move often without the timer being moved.
package deadline

import "time"

// Timer calls its function once its deadline has passed. Moving the deadline does not touch
// the Go timer while it is armed: resetting a timer that sleeps in the runtime's heap wakes
// the runtime's poller, and a download moves the deadline after every 16 KiB it writes. When
// the timer fires before the deadline, Due arms it again for the rest.
//
// A Timer is guarded by its user's lock: Set and Armed are called with it held, and the
// function takes it and calls Due before anything else. The zero Timer is ready to use.
type Timer struct {
	t     *time.Timer
	at    time.Time
	armed bool
}

// Set moves the deadline to d from now, and arms the timer to call f when it is not armed.
// f must be the same function at every call.
func (t *Timer) Set(d time.Duration, f func()) {
	t.at = time.Now().Add(d)
	switch {
	case t.t == nil:
		t.t = time.AfterFunc(d, f)
	case !t.armed:
		t.t.Reset(d)
	}
	t.armed = true
}

// Due reports, from the timer's function, whether the deadline has come; when it has not,
// the timer is armed again for the rest.
func (t *Timer) Due() bool {
	if wait := time.Until(t.at); wait > 0 {
		t.t.Reset(wait)
		return false
	}
	t.armed = false
	return true
}

// Armed reports whether the function will be called.
func (t *Timer) Armed() bool { return t.armed }

// Stop disarms the timer.
func (t *Timer) Stop() {
	if t.t != nil {
		t.t.Stop()
	}
	t.armed = false
}
