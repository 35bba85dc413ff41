// Package testkit holds small helpers the tests of several packages share.
package testkit

import (
	"bytes"
	"sync"
)

// Buffer is a log or audit destination a test can read while other goroutines write to it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
