package broker

import (
	"encoding/json"
	"net/http"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Readiness reports the state of every configured credential, by name, with the reason
// when it cannot be read (never the value). *credentials.Store implements it.
type Readiness = CredentialStatus

// PolicyRevision names the policy deciding, "" while none is loaded (policy.bundle before its
// first download): every request is then refused.
type PolicyRevision interface {
	Revision() string
}

// AdminHandler serves /healthz (the process is up), /readyz and /metrics (Prometheus).
//
// /readyz answers 503 only while no policy is loaded, or while the CA cannot sign (the
// "ca" member says why): then every request, or every one the policy intercepts, is refused,
// and the pod is better out of its Service. Anything less is reported with 200 and status
// "degraded": credentials that cannot be read (requests granted them get 503
// credential_unavailable, every other request is served), a policy on disk that failed
// to reload (the last good one keeps deciding), and a config file whose last reload was
// refused (config_reload_refused: when, and its problems without the file's values; the
// running config keeps serving). Taking a broker out of its Service for those
// would stop the requests it can still serve, on every replica at once when the cause is
// shared (Vault down, a bad policy pushed everywhere); alert on the metrics instead.
// /readyz?strict answers 503 on any degradation too, for deploy gates and tests.
func AdminHandler(m *Metrics, ready Readiness, policy PolicyRevision) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		status, body := http.StatusOK, map[string]any{"status": "ready"}
		degraded := false
		if rev := policy.Revision(); rev != "" {
			body["policy_revision"] = rev
		} else {
			status, body["policy"] = http.StatusServiceUnavailable, "no policy loaded yet"
		}
		if caReady, caDegraded := m.caReadiness(body); !caReady {
			// The CA cannot sign (ca.vault_pki past its intermediate's life without Vault):
			// nothing the policy intercepts can be served.
			status = http.StatusServiceUnavailable
		} else if caDegraded {
			degraded = true // a renewal failed; the current intermediate still signs
		}
		if msg := m.PolicyReloadError(); msg != "" {
			degraded, body["policy_reload_error"] = true, msg
		}
		if r := m.LastRefusedReload(); r != nil {
			// The config file does not load: the running config serves, and the next restart
			// would fail to start.
			degraded, body["config_reload_refused"] = true, map[string]any{
				"at": r.At.UTC().Format(time.RFC3339Nano), "error": r.Error,
			}
		}
		unavailable, stale, readyNames := map[string]string{}, map[string]string{}, []string{}
		minted, staleAge := map[string]any{}, map[string]float64{}
		for name, st := range ready.Status() {
			if !st.ValidUntil.IsZero() || !st.LastRefresh.IsZero() {
				// A derived credential: when its newest token expires and when it was minted.
				minted[name] = map[string]any{"valid_until": timeOrNil(st.ValidUntil), "last_refresh": timeOrNil(st.LastRefresh)}
			}
			switch {
			case !st.Ready:
				unavailable[name] = st.Error
			case st.Error != "" || st.StaleAge > 0:
				stale[name] = st.Error
				if st.Error == "" {
					stale[name] = "no answer from its source yet"
				}
				if st.StaleAge > 0 {
					staleAge[name] = st.StaleAge.Seconds()
				}
				fallthrough
			default:
				readyNames = append(readyNames, name)
			}
		}
		sort.Strings(readyNames)
		body["credentials_ready"] = readyNames
		if len(stale) > 0 {
			// Served from the cache (within vault.max_stale) while the source fails: ready,
			// and worth knowing before max_stale runs out.
			body["credentials_stale"] = stale
		}
		if len(staleAge) > 0 {
			// How old each stale value is (capbroker_credential_stale_seconds).
			body["credentials_stale_seconds"] = staleAge
		}
		if len(unavailable) > 0 {
			degraded, body["credentials"] = true, unavailable
		}
		if len(minted) > 0 {
			body["credentials_minted"] = minted
		}
		if pc := m.proxyCheck.Load(); pc != nil {
			if down := pc.check(r.Context()); len(down) > 0 {
				degraded, body["upstream_proxies"] = true, down
			}
		}
		if tp := m.telemetryProblem.Load(); tp != nil {
			if msg := (*tp)(); msg != "" {
				degraded, body["telemetry"] = true, msg
			}
		}
		_, strict := r.URL.Query()["strict"]
		switch {
		case status != http.StatusOK:
			body["status"] = "not ready"
		case degraded && strict:
			status, body["status"] = http.StatusServiceUnavailable, "not ready"
		case degraded:
			body["status"] = "degraded"
		}
		writeJSON(w, status, body)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.Registry(), promhttp.HandlerOpts{}))
	return mux
}

func timeOrNil(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format(time.RFC3339)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
