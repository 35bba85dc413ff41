package credentials

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// TestStoreReportsStaleValues: the moment a value is served past its refresh because the
// source fails (or hangs), the store logs it once, with the name and age and never the value,
// and Status gives the age; it logs again when the credential is fresh again and when it has
// no usable value any more.
func TestStoreReportsStaleValues(t *testing.T) {
	const secret = "canary-stale-7f3a"
	var logs bytes.Buffer
	src := &scripted{val: NewSecret(secret)}
	s, clk := newTestStore(src, StoreOptions{Refresh: time.Minute, MaxStale: 10 * time.Minute, Log: zerolog.New(&logs)})
	mustGet(t, s)
	if st := s.Status()["c"]; st.StaleAge != 0 || logs.Len() != 0 {
		t.Fatalf("fresh: stale age %v, logs %q", st.StaleAge, logs.String())
	}

	// The source fails: the cached value is served, stale, and that is logged once.
	src.set(Secret{}, errors.New("vault: connection refused"))
	clk.add(90 * time.Second)
	for range 3 {
		if got := mustGet(t, s); got != secret {
			t.Fatalf("during the outage: %q", got)
		}
	}
	if st := s.Status()["c"]; st.StaleAge != 90*time.Second || !st.Ready {
		t.Fatalf("stale: status %+v, want age 90s and ready", st)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], `"credential":"c"`) || !strings.Contains(lines[0], "served stale") ||
		!strings.Contains(lines[0], `"age":90000`) || !strings.Contains(lines[0], "connection refused") {
		t.Fatalf("want one stale line with name, age and reason; got %q", logs.String())
	}

	// Recovery: logged once, and the age is 0 again.
	src.set(NewSecret(secret), nil)
	clk.add(time.Minute) // past the backoff
	mustGet(t, s)
	mustGet(t, s)
	if st := s.Status()["c"]; st.StaleAge != 0 || st.Error != "" {
		t.Fatalf("recovered: %+v", st)
	}
	if n := strings.Count(logs.String(), "credential fresh again"); n != 1 {
		t.Fatalf("recovery logged %d times: %q", n, logs.String())
	}

	// Past max_stale: unavailable, logged, and no longer counted as stale.
	src.set(Secret{}, errors.New("vault: connection refused"))
	clk.add(11 * time.Minute)
	if _, err := s.Get(context.Background(), "c"); err == nil {
		t.Fatal("past max_stale the value was served")
	}
	if st := s.Status()["c"]; st.Ready || st.StaleAge != 0 {
		t.Fatalf("unavailable: %+v", st)
	}
	if !strings.Contains(logs.String(), "credential unavailable") {
		t.Fatalf("unavailability not logged: %q", logs.String())
	}
	if strings.Contains(logs.String(), secret) {
		t.Fatal("a log line holds the value")
	}
}

// TestStoreReportsHungSource: a re-read that hangs makes the value stale after staleGrace,
// though the source has not failed yet; requests served meanwhile report it.
func TestStoreReportsHungSource(t *testing.T) {
	var logs bytes.Buffer
	src := &scripted{val: NewSecret("v1")}
	s, clk := newTestStore(src, StoreOptions{Refresh: time.Minute, Log: zerolog.New(&logs)})
	mustGet(t, s)

	gate := make(chan struct{})
	src.mu.Lock()
	src.gate = gate
	src.mu.Unlock()
	clk.add(time.Minute + 2*staleGrace)
	done := make(chan struct{})
	go func() { _, _ = s.Get(context.Background(), "c"); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for src.count() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the refresh never started")
		}
		time.Sleep(time.Millisecond)
	}
	mustGet(t, s) // served the cached value while the re-read hangs
	if st := s.Status()["c"]; st.StaleAge != time.Minute+2*staleGrace {
		t.Fatalf("hung source: stale age %v", st.StaleAge)
	}
	if !strings.Contains(logs.String(), "served stale") || !strings.Contains(logs.String(), "re-read under way") {
		t.Fatalf("hung source not logged: %q", logs.String())
	}
	close(gate)
	<-done
}
