package broker

import (
	"encoding/json"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Readiness reports what keeps the broker from serving every request: credentials that
// cannot be read, by name, with the reason (never the value).
type Readiness interface {
	NotReady() map[string]string
}

// PolicyRevision names the policy deciding, "" while none is loaded (policy.bundle before its
// first download): every request is then refused.
type PolicyRevision interface {
	Revision() string
}

// AdminHandler serves /healthz (the process is up), /readyz (a policy is loaded and every
// credential is readable) and /metrics (Prometheus).
func AdminHandler(m *Metrics, ready Readiness, policy PolicyRevision) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		status, body := http.StatusOK, map[string]any{"status": "ready"}
		if rev := policy.Revision(); rev != "" {
			body["policy_revision"] = rev
		} else {
			status, body["policy"] = http.StatusServiceUnavailable, "no policy loaded yet"
		}
		if notReady := ready.NotReady(); len(notReady) > 0 {
			status, body["credentials"] = http.StatusServiceUnavailable, notReady
		}
		if status != http.StatusOK {
			body["status"] = "not ready"
		}
		writeJSON(w, status, body)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.Registry(), promhttp.HandlerOpts{}))
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
