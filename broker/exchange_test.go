package broker

import (
	"net/http"
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
