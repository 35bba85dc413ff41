package broker

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestSourceIP: the agent's address as the audit event and the policy see it is the address
// netip prints (unmapped), whatever RemoteAddr looks like; in the common case, a part of
// RemoteAddr, without an allocation.
func TestSourceIP(t *testing.T) {
	for remote, want := range map[string]string{
		"127.0.0.1:5":           "127.0.0.1",
		"[::1]:5":               "::1",
		"[::ffff:10.0.0.1]:443": "10.0.0.1",
		"[2001:DB8:0::1]:1":     "2001:db8::1",
		"[fe80::1%eth0]:1":      "fe80::1%eth0",
		"10.0.0.1":              "invalid IP",
		"":                      "invalid IP",
	} {
		if got := sourceIP(&http.Request{RemoteAddr: remote}); got != want {
			t.Errorf("RemoteAddr %q: source %q, want %q", remote, got, want)
		}
	}
	r := &http.Request{RemoteAddr: "192.168.10.20:50000"}
	if n := testing.AllocsPerRun(100, func() { _ = sourceIP(r) }); n != 0 {
		t.Errorf("%v allocations per request", n)
	}
}

// writeCounter counts the writes that reach it.
type writeCounter struct{ n int }

func (w *writeCounter) Write(p []byte) (int, error) { w.n++; return len(p), nil }

// TestSmallBodyOneWrite: a small request body read whole (readSmallBody) is one that
// Request.Write sends in the same write as the headers, as the upstream client's own writer
// does: a body it does not know to be in memory has its headers flushed on their own first,
// one more TLS record and system call per request.
func TestSmallBodyOneWrite(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "https://api.example.com/v1", strings.NewReader(`{"a":1}`))
	r.Body = io.NopCloser(r.Body) // as a server's body: not known to be in memory
	if small, err := readSmallBody(r); err != nil || small == nil {
		t.Fatalf("readSmallBody: %q, %v", small, err)
	}
	r.RequestURI = ""
	var w writeCounter
	bw := bufio.NewWriter(&w)
	if err := r.Write(bw); err != nil {
		t.Fatal(err)
	}
	bw.Flush()
	if w.n != 1 {
		t.Errorf("the request went out in %d writes, want 1", w.n)
	}
}
