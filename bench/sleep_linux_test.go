package main

import (
	"runtime"
	"testing"
	"time"
)

// TestThreadCPUFine: the thread's CPU time advances by the work done between two readings,
// not by the scheduler's ticks. getrusage's RUSAGE_THREAD, which it was read from, moved in
// steps of milliseconds on a VM, and the many-keys rounds measured in a few milliseconds each
// were read as one tick or two. A thread taken off its core does not advance its own clock,
// so the test does not depend on how busy the machine is.
func TestThreadCPUFine(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := threadCPU()
	if start <= 0 {
		t.Fatal("no thread CPU time")
	}
	last, step := start, time.Duration(0)
	for last-start < 20*time.Millisecond {
		now := threadCPU()
		if now < last {
			t.Fatalf("the thread's CPU time went back from %v to %v", last, now)
		}
		step = max(step, now-last)
		last = now
	}
	if step > time.Millisecond {
		t.Fatalf("the thread's CPU time moved in a step of %v: coarser than the rounds it times", step)
	}
}
