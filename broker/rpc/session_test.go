package rpc

import (
	"fmt"
	"testing"
)

func TestSessions(t *testing.T) {
	s := NewSessions(3)
	s.Issued("h", "s1", "a")
	s.Issued("h", "s1", "b") // issued twice: stays a's
	s.Issued("other", "s1", "b")
	if o, ok := s.Owner("h", "s1"); !ok || o != "a" {
		t.Errorf("Owner(h, s1) = %q, %v", o, ok)
	}
	if o, ok := s.Owner("other", "s1"); !ok || o != "b" {
		t.Errorf("Owner(other, s1) = %q, %v", o, ok)
	}
	if _, ok := s.Owner("h", "s2"); ok {
		t.Error("an id never issued has an owner")
	}
	// Bounded: the least recently used go first.
	s.Issued("h", "s2", "a")
	s.Owner("h", "s1")
	s.Issued("h", "s3", "a")
	if _, ok := s.Owner("other", "s1"); ok {
		t.Error("the least recently used session was kept past the bound")
	}
	if _, ok := s.Owner("h", "s1"); !ok {
		t.Error("a recently used session was forgotten")
	}
	for i := range 100 {
		s.Issued("h", fmt.Sprint(i), "a")
	}
	if n := len(s.byKey); n != 3 || s.lru.Len() != 3 {
		t.Errorf("holding %d sessions (%d in the list), bound 3", n, s.lru.Len())
	}
}
