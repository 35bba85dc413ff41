package main

import (
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// preciseSleeper locks the calling goroutine to its OS thread and returns a sleep that blocks
// that thread in nanosleep with a timer slack of 1 ns, and a function undoing both. The
// runtime's own timers (time.Sleep) wake through epoll_wait, whose timeout is in whole
// milliseconds: a sleep under a millisecond wakes a millisecond later unless something else
// wakes the process first, so that an open-loop sender at 1,000 requests/s sends each request
// up to a millisecond late, by as much as the other traffic of the process lets it (see
// sendAt).
func preciseSleeper() (sleep func(time.Duration), done func()) {
	runtime.LockOSThread()
	slack, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err == nil {
		_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	}
	sleep = func(d time.Duration) {
		ts := unix.NsecToTimespec(int64(d))
		for unix.Nanosleep(&ts, &ts) == unix.EINTR {
		}
	}
	return sleep, func() {
		if err == nil {
			_ = unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(slack), 0, 0, 0)
		}
		runtime.UnlockOSThread()
	}
}

// threadCPU is the CPU time of the calling thread: for a measurement on a goroutine locked to
// it, the work done, without the time other processes of a busy machine took the core. It is
// the thread's CPU clock, to the nanosecond. getrusage's RUSAGE_THREAD, which it was, splits
// that time by the scheduler's ticks and on this VM read 0.02 to 2.8 ms for 3 ms of work: the
// many-keys rounds, 4 to 12 ms each, were read as one, two or three ticks.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
