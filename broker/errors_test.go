package broker

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
)

// TestUpstreamFailureDropsParserText: an error that may quote the upstream's bytes is recorded
// as a fixed text; one the broker composed keeps its words, and its class for the agent.
func TestUpstreamFailureDropsParserText(t *testing.T) {
	const canary = "sk-canary-0123456789"
	_, parseErr := http.ReadResponse(bufio.NewReader(strings.NewReader("HTTP/1.1 200 OK\r\nX-Reflect "+canary+"\r\n\r\n")), nil)
	if parseErr == nil || !strings.Contains(parseErr.Error(), canary) {
		t.Fatalf("the parser no longer quotes the line (%v): the test needs another input", parseErr)
	}
	dialErr := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	cases := map[string]struct {
		err      error
		keepText string
		status   int
	}{
		"parser quoting the upstream": {parseErr, "", http.StatusBadGateway},
		"refused dial":                {dialErr, "connection refused", http.StatusBadGateway},
		"timeout":                     {context.DeadlineExceeded, "deadline exceeded", http.StatusGatewayTimeout},
		"fake 101":                    {errBadSwitch, "101", http.StatusBadGateway},
		"unknown":                     {errors.New("x " + canary), "", http.StatusBadGateway},
	}
	for name, c := range cases {
		got := upstreamFailure("127.0.0.1:1", c.err)
		text := got.Error()
		if strings.Contains(text, canary) {
			t.Errorf("%s: the recorded error quotes the upstream: %q", name, text)
		}
		if c.keepText != "" && !strings.Contains(text, c.keepText) {
			t.Errorf("%s: %q lost the broker's own words %q", name, text, c.keepText)
		}
		if c.keepText == "" && !errors.Is(got, errMalformedResponse) {
			t.Errorf("%s: %q is not the fixed text", name, text)
		}
		if st := classify(got).status; st != c.status {
			t.Errorf("%s: status %d, want %d", name, st, c.status)
		}
	}
}
