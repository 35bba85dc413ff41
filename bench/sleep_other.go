//go:build !linux

package main

import "time"

// preciseSleeper is time.Sleep where Linux's nanosleep is not at hand.
func preciseSleeper() (sleep func(time.Duration), done func()) {
	return time.Sleep, func() {}
}
