package broker

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/capbroker/capbroker/credentials"
)

type fixedReadiness map[string]credentials.CredentialStatus

func (f fixedReadiness) Status() map[string]credentials.CredentialStatus { return f }

type fixedRevision string

func (f fixedRevision) Revision() string { return string(f) }

// TestRefusedReloadInReadyz: /readyz shows the last refused config reload without any value
// the file quoted, degraded, until a reload succeeds.
func TestRefusedReloadInReadyz(t *testing.T) {
	m := NewMetrics(nil)
	h := AdminHandler(m, fixedReadiness{}, fixedRevision("r1"))
	readyz := func(q string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz"+q, nil))
		return rec.Code, rec.Body.String()
	}
	cases := map[string]struct{ err, want, never string }{
		"go quoted":   {`proxy.max_connections: must be an integer, not "sk-live-\"x\"-1" (line 3)`, `proxy.max_connections: must be an integer, not \"…\" (line 3)`, "sk-live"},
		"yaml quoted": {"YAML syntax error: cannot unmarshal !!str `ghp_abc` into int", `cannot unmarshal !!str \"…\" into int`, "ghp_abc"},
		"lines":       {"policy.mode: bad\naudit.colour: unknown key", "policy.mode: bad; audit.colour: unknown key", "\\n"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m.ConfigReload(time.Date(2026, 12, 5, 20, 0, 0, 0, time.UTC), errors.New(tc.err))
			code, body := readyz("")
			if code != 200 || !strings.Contains(body, `"status":"degraded"`) || !strings.Contains(body, `"at":"2026-12-05T20:00:00Z"`) ||
				!strings.Contains(body, tc.want) || strings.Contains(body, tc.never) {
				t.Fatalf("%d %s", code, body)
			}
			if code, _ := readyz("?strict"); code != 503 {
				t.Fatalf("strict: %d", code)
			}
		})
	}
	m.ConfigReload(time.Now(), nil)
	if _, body := readyz(""); strings.Contains(body, "config_reload_refused") || !strings.Contains(body, `"status":"ready"`) {
		t.Fatalf("after a good reload: %s", body)
	}
}
