package broker

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/capbroker/capbroker/broker/inject"
	"github.com/capbroker/capbroker/broker/upstream"
)

func TestPoolFor(t *testing.T) {
	bind := func(names ...string) []*inject.Binding {
		var out []*inject.Binding
		for _, n := range names {
			out = append(out, &inject.Binding{Name: n})
		}
		return out
	}
	for name, tc := range map[string]struct {
		agent   string
		granted []*inject.Binding
		want    upstream.Pool
	}{
		"no credential":         {"coder-1", nil, "coder-1"},
		"one":                   {"coder-1", bind("github"), "coder-1\x00github"},
		"set, in any order":     {"coder-1", bind("openai", "github"), "coder-1\x00github\x00openai"},
		"named twice":           {"coder-1", bind("openai", "github", "openai"), "coder-1\x00github\x00openai"},
		"another agent, no one": {"coder-2", nil, "coder-2"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := poolFor(tc.agent, tc.granted); got != tc.want {
				t.Fatalf("poolFor(%q, %v) = %q, want %q", tc.agent, tc.granted, got, tc.want)
			}
		})
	}
	// Pools that must never share a connection.
	distinct := []upstream.Pool{
		poolFor("coder-1", nil), poolFor("coder-1", bind("github")), poolFor("coder-1", bind("github", "openai")),
		poolFor("coder-2", nil), poolFor("coder-2", bind("github")),
	}
	seen := map[upstream.Pool]bool{}
	for _, p := range distinct {
		if seen[p] {
			t.Errorf("pool %q made twice", p)
		}
		seen[p] = true
	}
}

// TestForwardPool: the pipeline sends a request in its agent's pool for the credentials the
// decision granted, none or some.
func TestForwardPool(t *testing.T) {
	for full, want := range map[bool]upstream.Pool{false: "dev-agent", true: "dev-agent\x00openai"} {
		br, tun := benchBroker(t, full)
		up := &recordingUpstream{}
		br.setTransport(up)
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader([]byte(`{"model":"gpt-4.1-mini"}`)))
		r.Host = "api.openai.com"
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		br.serveTunnel(w, r, tun)
		if w.Code != http.StatusOK || up.got == nil {
			t.Fatalf("full %v: status %d: %s", full, w.Code, w.Body)
		}
		if up.pool != want {
			t.Errorf("full %v: pool %q, want %q", full, up.pool, want)
		}
	}
}
