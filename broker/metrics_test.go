package broker

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/upstream"
)

// TestAgentRequestLabelsAreBounded: hosts outside the configured credential hosts are
// "other", wildcard hosts count under their pattern, unknown agents are "other".
func TestAgentRequestLabelsAreBounded(t *testing.T) {
	m := NewMetrics(nil)
	m.configure(&config.Config{
		Agents: []config.Agent{{ID: "coder-1"}},
		Credentials: []config.Credential{
			{Name: "gh", Hosts: []string{"api.github.com"}},
			{Name: "ex", Hosts: []string{"*.example.com"}},
		},
	})
	m.started()
	m.finished("coder-1", "api.github.com", "allow", []string{"gh"})
	m.started()
	m.finished("coder-1", "a.b.example.com", "allow", []string{"ex"})
	m.started()
	m.finished("coder-1", "example.com", "deny", nil)
	m.started()
	m.finished("intruder", "random-1.test", "deny", nil)
	m.started()
	m.finished("", "", "error", nil)
	m.started()
	m.finished("coder-1", "api.github.com", "upstream_error", []string{"gh", "ex"})
	want := []string{
		`agent="",credential="",host="",outcome="error" 1`,
		`agent="coder-1",credential="",host="other",outcome="deny" 1`,
		`agent="coder-1",credential="ex",host="*.example.com",outcome="allow" 1`,
		`agent="coder-1",credential="gh",host="api.github.com",outcome="allow" 1`,
		`agent="coder-1",credential="multiple",host="api.github.com",outcome="upstream_error" 1`,
		`agent="other",credential="",host="other",outcome="deny" 1`,
	}
	if got := samples(t, m, "capbroker_agent_requests_total"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := samples(t, m, "capbroker_requests_in_flight"); strings.Join(got, ",") != " 0" {
		t.Fatalf("in flight: %q", got)
	}
}

// samples returns a family's samples as `label="value",... number`, sorted.
func samples(t *testing.T, m *Metrics, family string) []string {
	t.Helper()
	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
		for _, s := range mf.GetMetric() {
			var labels []string
			for _, l := range s.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			v := s.GetCounter().GetValue() + s.GetGauge().GetValue()
			out = append(out, fmt.Sprintf("%s %v", strings.Join(labels, ","), v))
		}
	}
	sort.Strings(out)
	return out
}

// TestFinishedDoesNotAllocate: the per-exchange metrics cost no allocation once a label
// combination has been seen.
func TestFinishedDoesNotAllocate(t *testing.T) {
	m := NewMetrics(nil)
	m.configure(&config.Config{Agents: []config.Agent{{ID: "a"}}, Credentials: []config.Credential{{Name: "c", Hosts: []string{"h.test"}}}})
	granted := []string{"c"}
	m.finished("a", "h.test", "allow", granted)
	if n := testing.AllocsPerRun(1000, func() {
		m.started()
		m.finished("a", "h.test", "allow", granted)
	}); n != 0 {
		t.Fatalf("%v allocations per exchange", n)
	}
}

// TestExchangedCounts: an exchange's count and latency go to its phase's and decision's
// series, with no allocation once the pair has been seen.
func TestExchangedCounts(t *testing.T) {
	m := NewMetrics(nil)
	m.exchanged("connect", "allow", time.Millisecond)
	m.exchanged("connect", "allow", time.Millisecond)
	m.exchanged("request", "deny", time.Millisecond)
	if n := testing.AllocsPerRun(1000, func() { m.exchanged("connect", "allow", time.Millisecond) }); n != 0 {
		t.Fatalf("%v allocations per exchange", n)
	}
	if got := testutil.ToFloat64(m.requests.WithLabelValues("connect", "allow")); got != 1003 {
		t.Errorf("connect allow: %v", got)
	}
	if got := testutil.ToFloat64(m.requests.WithLabelValues("request", "deny")); got != 1 {
		t.Errorf("request deny: %v", got)
	}
	if got := testutil.CollectAndCount(m.latency); got != 2 {
		t.Errorf("latency series: %d", got)
	}
}

func TestUpstreamErrorClass(t *testing.T) {
	cases := map[string]struct {
		err  error
		want string
	}{
		"refused":      {&net.OpError{Op: "dial", Err: fmt.Errorf("connect: %w", syscall.ECONNREFUSED)}, "refused"},
		"reset":        {fmt.Errorf("read: %w", syscall.ECONNRESET), "reset"},
		"eof":          {fmt.Errorf("upstream: %w", io.ErrUnexpectedEOF), "reset"},
		"timeout":      {fmt.Errorf("x: %w", context.DeadlineExceeded), "timeout"},
		"dns":          {&net.OpError{Op: "dial", Err: &net.DNSError{Err: "no such host", Name: "x.test", IsNotFound: true}}, "dns"},
		"tls":          {fmt.Errorf("tls: %w", x509.UnknownAuthorityError{}), "tls"},
		"forbidden":    {fmt.Errorf("dial: %w", upstream.ErrForbiddenDestination), "forbidden_destination"},
		"malformed":    {fmt.Errorf("upstream: %w", errMalformedResponse), "protocol"},
		"unscrubbable": {errUnscrubbable, "unscrubbable"},
		"other":        {errors.New("something"), "other"},
	}
	for name, c := range cases {
		if got := upstreamErrorClass(c.err); got != c.want {
			t.Errorf("%s: %q, want %q", name, got, c.want)
		}
	}
}
