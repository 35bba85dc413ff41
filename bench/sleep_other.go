//go:build !linux

package main

import "time"

// preciseSleeper is time.Sleep where Linux's nanosleep is not at hand.
func preciseSleeper() (sleep func(time.Duration), done func()) {
	return time.Sleep, func() {}
}

// threadCPU is 0 where the thread's CPU time is not read: scrubRound falls back to wall time.
func threadCPU() time.Duration { return 0 }
